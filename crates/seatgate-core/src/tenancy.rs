//! Who is asking: the application is part of every identity.
//!
//! A request read from an application's own requests stream
//! (`stream.applications`) is that application's: the server knows it from
//! the stream, never from a field. Its session is kept as
//! `<application>/<session>`, and so are its user and group unless the
//! application is trusted to speak for shared identities
//! (`tenancy.shared_identity`): two applications sending the same session,
//! user or group name never meet, so neither can use up, squat or revoke
//! what is the other's. A request of the shared stream (the
//! single-application mode) is nobody's in particular, and its ids stay as
//! sent.
//!
//! `/` is in no id ([`crate::protocol::valid_id`]), so a qualified id is
//! never mistaken for a plain one, and its application is what precedes
//! the first `/`. The scripts count per application by that prefix
//! (lua/includes/owners.lua); docs/protocol.md, "Who is asking".

use crate::protocol::valid_id;

/// What separates an application from the id it qualifies.
pub const SEPARATOR: char = '/';

/// The longest application name.
pub const MAX_APPLICATION_LEN: usize = 64;

/// Whether `name` may name an application: 1 to 64 characters of
/// A-Z a-z 0-9 . _ -, so it is safe inside key names, ACL key patterns and
/// qualified ids.
pub fn valid_application(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_APPLICATION_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// `id` as application `app` owns it: `<app>/<id>`.
pub fn qualify(app: &str, id: &str) -> String {
    let mut q = String::with_capacity(app.len() + 1 + id.len());
    q.push_str(app);
    q.push(SEPARATOR);
    q.push_str(id);
    q
}

/// The application a stored id belongs to, and the id as its application
/// sent it: `(Some(app), id)` for `<app>/<id>`, `(None, id)` for a plain id.
pub fn split(stored: &str) -> (Option<&str>, &str) {
    match stored.split_once(SEPARATOR) {
        Some((app, id)) => (Some(app), id),
        None => (None, stored),
    }
}

/// The id as its application sent it (`ws-7` for `billing/ws-7`).
pub fn unqualified(stored: &str) -> &str {
    split(stored).1
}

/// Whether `s` names a session, user or group as stored: a plain id, or an
/// application's (`<app>/<id>`). What an administrator may name (a revoke's
/// session, a license's groups and group map); a request's own fields are
/// plain ids only.
pub fn valid_stored_id(s: &str) -> bool {
    match s.split_once(SEPARATOR) {
        Some((app, id)) => valid_application(app) && valid_id(id),
        None => valid_id(s),
    }
}

/// The rule [`valid_stored_id`] checks, for messages.
pub const STORED_ID_RULE: &str =
    "1 to 128 characters of A-Z a-z 0-9 . _ - : @, optionally after an application and a slash (billing/ws-7)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_qualified_id_splits_back_into_its_application_and_id() {
        let q = qualify("billing", "ws-7.example.com");
        assert_eq!(q, "billing/ws-7.example.com");
        assert_eq!(split(&q), (Some("billing"), "ws-7.example.com"));
        assert_eq!(unqualified(&q), "ws-7.example.com");
        assert_eq!(split("ws-7"), (None, "ws-7"));
        assert!(valid_stored_id(&q));
        assert!(valid_stored_id("ws-7"));
    }

    #[test]
    fn only_an_application_and_a_plain_id_make_a_stored_id() {
        for bad in [
            "",
            "/ws",
            "billing/",
            "a/b/c",
            "bill:ing/ws",
            "billing/w s",
            "{x}/ws",
        ] {
            assert!(!valid_stored_id(bad), "{bad:?}");
        }
        let long_app = "a".repeat(MAX_APPLICATION_LEN + 1);
        assert!(!valid_stored_id(&format!("{long_app}/ws")));
        assert!(valid_stored_id(&format!(
            "{}/ws",
            "a".repeat(MAX_APPLICATION_LEN)
        )));
    }
}
