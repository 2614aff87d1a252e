//! Key names: the only place seatgate builds a Redis key.
//!
//! Every key of one license carries the hash tag `{<license>}`, so that all
//! of them live in one Redis Cluster slot and one script may touch them all.
//! License ids are validated by [`crate::protocol`] (no braces), so the tag
//! cannot be broken by input.

/// Builds key names under one prefix (`seat` unless configured otherwise).
#[derive(Debug, Clone)]
pub struct Keys {
    /// The namespace all seatgate keys live under; reply streams may not use it.
    prefix: String,
}

/// The keys of one license, in the order the seat scripts take them as KEYS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LicenseKeys {
    /// HASH: the license record (`seats_total`, `expires_at_ms`, `active`, ...).
    pub license: String,
    /// ZSET: session -> last heartbeat in ms; its cardinality is seats in use.
    pub holders: String,
    /// HASH: session -> session record (acquired_at, heartbeat count, metadata).
    pub sessions: String,
}

impl LicenseKeys {
    /// Every key of the license, for deleting it.
    pub fn all(&self) -> [&str; 3] {
        [&self.license, &self.holders, &self.sessions]
    }
}

impl Keys {
    /// Keys under `prefix`.
    pub fn new(prefix: impl Into<String>) -> Self {
        Keys {
            prefix: prefix.into(),
        }
    }

    /// The namespace prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The keys of `license`, all carrying the hash tag `{license}`.
    pub fn license(&self, license: &str) -> LicenseKeys {
        let p = &self.prefix;
        LicenseKeys {
            license: format!("{p}:{{{license}}}:license"),
            holders: format!("{p}:{{{license}}}:holders"),
            sessions: format!("{p}:{{{license}}}:sessions"),
        }
    }

    /// SET of every provisioned license id, so `license list` (and the reaper)
    /// find licenses without SCAN. It is written beside the license record,
    /// never inside a seat script, so it may live in any cluster slot.
    pub fn license_index(&self) -> String {
        format!("{}:licenses", self.prefix)
    }

    /// Whether `key` lies inside seatgate's own namespace. Reply streams must
    /// not: a request must not be able to make the worker write into seat state.
    pub fn is_reserved(&self, key: &str) -> bool {
        key.strip_prefix(self.prefix.as_str())
            .is_some_and(|rest| rest.starts_with(':'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn license_keys_share_one_hash_tag() {
        let k = Keys::new("seat").license("acme-pro");
        for key in k.all() {
            assert!(key.contains("{acme-pro}"), "{key}");
        }
        assert_eq!(k.license, "seat:{acme-pro}:license");
        assert_eq!(k.holders, "seat:{acme-pro}:holders");
        assert_eq!(k.sessions, "seat:{acme-pro}:sessions");
    }

    #[test]
    fn reserved_namespace_is_the_prefix_and_a_colon() {
        let keys = Keys::new("seat");
        assert!(keys.is_reserved("seat:{x}:holders"));
        assert!(keys.is_reserved("seat:requests"));
        assert!(!keys.is_reserved("seatgate:reply:1"));
        assert!(!keys.is_reserved("reply:client-1"));
    }
}
