//! Text for the operator's terminal: values some caller stored, escaped so
//! that they cannot drive it. Every view's table rendering goes through it.

use std::borrow::Cow;

/// `s` with every control character, format character and line or
/// paragraph separator escaped (`\u{1b}`, `\n`, `\u{200b}`): a value some
/// caller stored (session metadata, a user or group name) must not move the
/// cursor, clear the screen, reorder a line (bidirectional overrides and
/// marks, U+061C), hide itself (zero-width spaces and joiners, U+FEFF) or
/// break one (U+2028, U+2029) on the operator's terminal. Other text,
/// non-ASCII letters included, is kept.
pub fn printable(s: &str) -> Cow<'_, str> {
    fn unsafe_char(c: char) -> bool {
        c.is_control() || is_format_or_separator(c)
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

/// Unicode's format characters (general category Cf) and the line and
/// paragraph separators (Zl, Zp): invisible, yet they change how the text
/// around them shows.
fn is_format_or_separator(c: char) -> bool {
    matches!(c,
        '\u{00AD}'
        | '\u{0600}'..='\u{0605}'
        | '\u{061C}'
        | '\u{06DD}'
        | '\u{070F}'
        | '\u{0890}'..='\u{0891}'
        | '\u{08E2}'
        | '\u{180E}'
        | '\u{200B}'..='\u{200F}'
        | '\u{2028}'..='\u{202E}'
        | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{206F}'
        | '\u{FEFF}'
        | '\u{FFF9}'..='\u{FFFB}'
        | '\u{110BD}'
        | '\u{110CD}'
        | '\u{13430}'..='\u{1343F}'
        | '\u{1BCA0}'..='\u{1BCA3}'
        | '\u{1D173}'..='\u{1D17A}'
        | '\u{E0001}'
        | '\u{E0020}'..='\u{E007F}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invisible_and_reordering_characters_are_escaped_letters_are_kept() {
        for (raw, shown) in [
            ("ada\u{1b}[2J", "ada\\u{1b}[2J"),
            ("line\u{2028}break", "line\\u{2028}break"),
            ("para\u{2029}", "para\\u{2029}"),
            ("zero\u{200b}width", "zero\\u{200b}width"),
            ("rlm\u{200f}", "rlm\\u{200f}"),
            ("alm\u{061c}", "alm\\u{61c}"),
            ("\u{feff}bom", "\\u{feff}bom"),
            ("\u{202e}evil", "\\u{202e}evil"),
            ("tag\u{e0041}", "tag\\u{e0041}"),
        ] {
            assert_eq!(printable(raw), shown, "{raw:?}");
        }
        for kept in ["Zoë", "東京", "Ωmega", "plain-ascii_1"] {
            assert!(matches!(printable(kept), Cow::Borrowed(_)), "{kept}");
        }
    }
}
