//! Text for the operator's terminal: values some caller stored, escaped so
//! that they cannot drive it. Every view's table rendering goes through it.

use std::borrow::Cow;

/// `s` with control characters, and the bidirectional overrides that reorder
/// a line, escaped (`\u{1b}`, `\n`): a value some caller stored (session
/// metadata) must not move the cursor, clear the screen or disguise itself on
/// the operator's terminal. Other text, non-ASCII letters included, is kept.
pub fn printable(s: &str) -> Cow<'_, str> {
    fn unsafe_char(c: char) -> bool {
        c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
    }
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if unsafe_char(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}
