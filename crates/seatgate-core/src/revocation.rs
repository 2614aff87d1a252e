//! A revocation as the scripts remember it, and the words a revoked session
//! is told.
//!
//! lua/revoke.lua stores one record per revoked session in
//! `seat:{L}:revocations` (lua/includes/revoked.lua builds it), and the
//! scripts hand it back in the detail slot of a SESSION_REVOKED outcome;
//! this is its one decoder. Kept apart from `engine::records`, which reads
//! dedupe records through the outcome decoder: the outcome decoder reads this.

use std::time::Duration;

use serde::Deserialize;

/// Why, by whom and until when a session was revoked:
/// `{"reason", "actor", "at", "cooldown_until"}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Revocation {
    /// Why, as the administrator wrote it.
    pub reason: String,
    /// Who revoked it (the admin's `actor`, by default their OS user name).
    pub actor: String,
    /// When (Redis clock, ms).
    pub at: i64,
    /// Until when the session's acquires are refused (Redis clock, ms); 0 = no cooldown.
    pub cooldown_until: i64,
}

impl Revocation {
    /// Reads a record; `None` when it is not of the scripts' form.
    pub fn parse(raw: &str) -> Option<Revocation> {
        serde_json::from_str(raw).ok()
    }

    /// The reply's `error` text at `now_ms` (Redis clock): who revoked the
    /// session and why, and how long its acquires are still refused.
    pub fn describe(&self, now_ms: i64) -> String {
        let mut text = format!("revoked by {}: {}", self.actor, self.reason);
        let left_ms = self.cooldown_until.saturating_sub(now_ms);
        if self.cooldown_until > 0 && left_ms > 0 {
            // Whole seconds, rounded up: "another 0s" would read as "over".
            let secs = (left_ms as u64).div_ceil(1000);
            text.push_str(&format!(
                "; acquires refused for another {}",
                humantime::format_duration(Duration::from_secs(secs))
            ));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_and_describe_the_cooldown_left() {
        let r = Revocation::parse(
            r#"{"reason":"seat shared outside the team","actor":"ada","at":1000,"cooldown_until":61500}"#,
        )
        .unwrap();
        assert_eq!((r.actor.as_str(), r.at, r.cooldown_until), ("ada", 1000, 61500));
        assert_eq!(
            r.describe(1000),
            "revoked by ada: seat shared outside the team; acquires refused for another 1m 1s"
        );
        assert_eq!(r.describe(61500), "revoked by ada: seat shared outside the team");
        let none = Revocation {
            cooldown_until: 0,
            ..r
        };
        assert_eq!(none.describe(0), "revoked by ada: seat shared outside the team");
        for foreign in ["", "{}", "[1]", r#"{"reason":"x"}"#] {
            assert_eq!(Revocation::parse(foreign), None, "{foreign}");
        }
    }
}
