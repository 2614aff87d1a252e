//! License policies: per-user and per-group limits, group reservations,
//! queue priority, linger and borrowing (docs/protocol.md, "Policies").
//!
//! They live in the license record beside `seats_total`, so a billing system
//! and `seatgate license put` set them the same way, and the seat scripts
//! decide them atomically (lua/includes/policy.lua, lua/includes/owners.lua).
//! This module is their Rust home: what an acquire carries
//! ([`RequestPolicy`]), what a license provisions ([`LicensePolicy`]) and
//! why a script refused a seat ([`PolicyRefusal`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::Serialize;

/// The highest queue priority an acquire may ask for.
pub const MAX_PRIORITY: u8 = 9;

/// The longest borrow an acquire may ask for, ms: one year. A license's
/// `max_borrow_ms` narrows it.
pub const MAX_BORROW_MS: u64 = 31_536_000_000;

/// Most waiters of one group one grant step looks past when their own
/// user's limit keeps them from a free seat, in a queue of waiters from
/// before the index by user (`seat:{L}:queue_by_user`); with it a blocked
/// user is passed over whole, as a group its limit blocks is
/// ([`MAX_GROUPS`]). `SKIP_LIMIT` in lua/includes/policy.lua.
pub const SKIP_LIMIT: usize = 50;

/// Most groups with waiters one grant step looks at: each group's first
/// waiter is looked at, and a group its limit blocks is passed over whole
/// (lua/includes/policy.lua's `MAX_GROUPS`).
pub const MAX_GROUPS: usize = 256;

/// One priority level in a queue score (lua/includes/queue.lua): a waiter's
/// score is its arrival number minus its priority times this.
pub const PRIORITY_STEP: i64 = 1 << 40;

/// The license record's legacy `policy` flag: `0` or `1`, switching nothing
/// (the policy fields apply whenever present). Provisioning still writes
/// `1` beside them, so that a worker from before that rule, during a
/// rolling upgrade, enforces them too.
pub const FLAG_FIELD: &str = "policy";

/// Who asks for a seat, as an acquire carries it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RequestPolicy {
    /// The user the seat counts for (`max_per_user`); `None`: no per-user limit applies.
    pub user: Option<String>,
    /// The group the seat counts for (`group_max:<g>`, `group_reserve:<g>`);
    /// `None`: no per-group limit applies, and no reserved seat is taken.
    pub group: Option<String>,
    /// Place in the queue, 0 (default) to [`MAX_PRIORITY`]; higher goes
    /// first, capped by the license's `max_priority`.
    pub priority: u8,
    /// Hold the seat this long without heartbeats, ms (0: an ordinary seat).
    pub borrow_ms: u64,
}

impl RequestPolicy {
    /// Nobody in particular: no user, no group, priority 0, no borrow.
    pub const NONE: RequestPolicy = RequestPolicy {
        user: None,
        group: None,
        priority: 0,
        borrow_ms: 0,
    };

    /// `ARGV[13]` of lua/acquire.lua: "" for [`RequestPolicy::NONE`], else
    /// `<user>|<group>|<priority>|<borrow_ms>` (ids never contain `|`).
    pub fn script_arg(&self) -> String {
        if *self == RequestPolicy::NONE {
            return String::new();
        }
        format!(
            "{}|{}|{}|{}",
            self.user.as_deref().unwrap_or(""),
            self.group.as_deref().unwrap_or(""),
            self.priority.min(MAX_PRIORITY),
            self.borrow_ms
        )
    }
}

/// The policies a license provisions; every field is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LicensePolicy {
    /// `max_per_user`: one user holds at most this many seats.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_per_user: Option<u64>,
    /// `group_max:<group>`: the group holds at most this many seats.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub group_max: BTreeMap<String, u64>,
    /// `group_reserve:<group>`: this many seats are kept for the group.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub group_reserve: BTreeMap<String, u64>,
    /// `max_priority`: the highest priority an acquire gets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_priority: Option<u8>,
    /// `linger_ms`: a released seat stays with its session this long.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub linger_ms: Option<u64>,
    /// `max_borrow_ms`: the longest borrow allowed; `None`: borrowing is off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_borrow_ms: Option<u64>,
    /// `require_user`: `Some(true)` refuses an acquire without a user.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub require_user: Option<bool>,
    /// `queue_max_per_user`: one user has at most this many sessions
    /// waiting in the queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_max_per_user: Option<u64>,
    /// `queue_max_per_group`: one group has at most this many sessions
    /// waiting in the queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_max_per_group: Option<u64>,
    /// `application:<app>`: whether the application may use the license.
    /// Non-empty: only the applications set `true` may (an acquire of any
    /// other, or of the shared stream, is refused LIMIT_REACHED `application`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub applications: BTreeMap<String, bool>,
}

/// Why a policy could not be provisioned as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(pub String);

impl LicensePolicy {
    /// Whether it sets nothing.
    pub fn is_empty(&self) -> bool {
        *self == LicensePolicy::default()
    }

    /// Whether `field` of a license record is a policy field (the flag included).
    pub fn is_policy_field(field: &str) -> bool {
        matches!(
            field,
            FLAG_FIELD
                | "max_per_user"
                | "max_priority"
                | "linger_ms"
                | "max_borrow_ms"
                | "require_user"
                | "queue_max_per_user"
                | "queue_max_per_group"
        ) || field.starts_with("group_max:")
            || field.starts_with("group_reserve:")
            || field.starts_with("application:")
    }

    /// The record fields that provision it, the flag first (none when empty).
    pub fn fields(&self) -> Vec<(String, String)> {
        if self.is_empty() {
            return Vec::new();
        }
        let mut out = vec![(FLAG_FIELD.to_owned(), "1".to_owned())];
        let mut put = |name: &str, value: Option<u64>| {
            if let Some(v) = value {
                out.push((name.to_owned(), v.to_string()));
            }
        };
        put("max_per_user", self.max_per_user);
        put("max_priority", self.max_priority.map(u64::from));
        put("linger_ms", self.linger_ms);
        put("max_borrow_ms", self.max_borrow_ms);
        put("require_user", self.require_user.map(u64::from));
        put("queue_max_per_user", self.queue_max_per_user);
        put("queue_max_per_group", self.queue_max_per_group);
        for (group, n) in &self.group_max {
            out.push((format!("group_max:{group}"), n.to_string()));
        }
        for (group, n) in &self.group_reserve {
            out.push((format!("group_reserve:{group}"), n.to_string()));
        }
        for (app, allowed) in &self.applications {
            out.push((
                format!("application:{app}"),
                if *allowed { "1" } else { "0" }.to_owned(),
            ));
        }
        out
    }

    /// The policies of a license record read whole (HGETALL), as the scripts
    /// read them: whatever the `policy` flag says, and a value that is not
    /// plain digits counts as 0 (such a record hands out no seat:
    /// LICENSE_INVALID, lua/includes/policy.lua).
    pub fn from_record(record: &HashMap<String, String>) -> LicensePolicy {
        let number = |raw: &str| -> u64 {
            Some(raw)
                .filter(|r| r.len() <= 15 && !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|r| r.parse().ok())
                .unwrap_or(0)
        };
        let mut policy = LicensePolicy::default();
        for (field, raw) in record {
            match field.as_str() {
                "max_per_user" => policy.max_per_user = Some(number(raw)),
                "max_priority" => policy.max_priority = Some(number(raw).min(u64::from(MAX_PRIORITY)) as u8),
                "linger_ms" => policy.linger_ms = Some(number(raw)),
                "max_borrow_ms" => policy.max_borrow_ms = Some(number(raw)),
                "require_user" => policy.require_user = Some(number(raw) == 1),
                "queue_max_per_user" => policy.queue_max_per_user = Some(number(raw)),
                "queue_max_per_group" => policy.queue_max_per_group = Some(number(raw)),
                other => {
                    if let Some(group) = other.strip_prefix("group_max:") {
                        policy.group_max.insert(group.to_owned(), number(raw));
                    } else if let Some(group) = other.strip_prefix("group_reserve:") {
                        policy.group_reserve.insert(group.to_owned(), number(raw));
                    } else if let Some(app) = other.strip_prefix("application:") {
                        policy.applications.insert(app.to_owned(), number(raw) == 1);
                    }
                }
            }
        }
        policy
    }

    /// Checks what the fields' own rules (engine::license, which also checks
    /// the group ids) cannot: a priority of at most [`MAX_PRIORITY`], a
    /// borrow of at most [`MAX_BORROW_MS`], reservations that fit in
    /// `seats_total` and in their group's own maximum.
    pub fn validate(&self, seats_total: u64) -> Result<(), PolicyError> {
        if self.max_priority.is_some_and(|p| p > MAX_PRIORITY) {
            return Err(PolicyError(format!("max_priority must be 0 to {MAX_PRIORITY}")));
        }
        if self.max_borrow_ms.is_some_and(|ms| ms > MAX_BORROW_MS) {
            return Err(PolicyError(format!(
                "max_borrow_ms must be at most {MAX_BORROW_MS} (one year)"
            )));
        }
        let reserved: u64 = self.group_reserve.values().sum();
        if reserved > seats_total {
            return Err(PolicyError(format!(
                "the reservations add up to {reserved} seats, more than the license's {seats_total}"
            )));
        }
        for (group, reserve) in &self.group_reserve {
            if let Some(max) = self.group_max.get(group).filter(|max| *max < reserve) {
                return Err(PolicyError(format!(
                    "group {group} reserves {reserve} seats but may hold only {max}"
                )));
            }
        }
        Ok(())
    }

    /// One line for people: `max_per_user 2, group cad max 3 reserve 1, …`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(n) = self.max_per_user {
            parts.push(format!("max_per_user {n}"));
        }
        let groups: std::collections::BTreeSet<&String> =
            self.group_max.keys().chain(self.group_reserve.keys()).collect();
        for g in groups {
            let mut part = format!("group {g}");
            if let Some(n) = self.group_max.get(g) {
                part.push_str(&format!(" max {n}"));
            }
            if let Some(n) = self.group_reserve.get(g) {
                part.push_str(&format!(" reserve {n}"));
            }
            parts.push(part);
        }
        if let Some(p) = self.max_priority {
            parts.push(format!("max_priority {p}"));
        }
        let duration = |ms: u64| humantime::format_duration(std::time::Duration::from_millis(ms)).to_string();
        if let Some(ms) = self.linger_ms {
            parts.push(format!("linger {}", duration(ms)));
        }
        if let Some(ms) = self.max_borrow_ms {
            parts.push(format!("max_borrow {}", duration(ms)));
        }
        if self.require_user == Some(true) {
            parts.push("require_user".to_owned());
        }
        if let Some(n) = self.queue_max_per_user {
            parts.push(format!("queue_max_per_user {n}"));
        }
        if let Some(n) = self.queue_max_per_group {
            parts.push(format!("queue_max_per_group {n}"));
        }
        let allowed: Vec<&str> = self
            .applications
            .iter()
            .filter(|(_, allowed)| **allowed)
            .map(|(app, _)| app.as_str())
            .collect();
        if !self.applications.is_empty() {
            parts.push(format!(
                "applications {}",
                if allowed.is_empty() {
                    "none".to_owned()
                } else {
                    allowed.join(" ")
                }
            ));
        }
        parts.join(", ")
    }
}

/// Why a script refused a seat under a policy: the `detail` of
/// LIMIT_REACHED, and of a NO_SEATS_AVAILABLE for reserved seats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyRefusal {
    /// LIMIT_REACHED: the user holds `max_per_user` seats.
    MaxPerUser,
    /// LIMIT_REACHED: the group holds `group_max:<group>` seats.
    GroupMax,
    /// LIMIT_REACHED: the borrow asked for is longer than `max_borrow_ms`, or the license allows none.
    MaxBorrow,
    /// NO_SEATS_AVAILABLE: the free seats are reserved for other groups.
    Reserved,
    /// LIMIT_REACHED: the license's `require_user`, and the acquire named no user.
    RequireUser,
    /// LIMIT_REACHED: the license maps users to groups, and the group the
    /// acquire claimed is not its user's there.
    GroupMap,
    /// LIMIT_REACHED: the license lists the applications that may use it,
    /// and the request's is not one of them (or it has none: the shared stream).
    Application,
    /// LIMIT_REACHED: the request's application already holds
    /// `tenancy.application_sessions` seats of the license.
    ApplicationSessions,
}

impl PolicyRefusal {
    /// The detail as a script returns it.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyRefusal::MaxPerUser => "max_per_user",
            PolicyRefusal::GroupMax => "group_max",
            PolicyRefusal::MaxBorrow => "max_borrow_ms",
            PolicyRefusal::Reserved => "reserved",
            PolicyRefusal::RequireUser => "require_user",
            PolicyRefusal::GroupMap => "group_map",
            PolicyRefusal::Application => "application",
            PolicyRefusal::ApplicationSessions => "application_sessions",
        }
    }

    /// The detail `s` stands for, if any.
    pub fn parse(s: &str) -> Option<PolicyRefusal> {
        [
            PolicyRefusal::MaxPerUser,
            PolicyRefusal::GroupMax,
            PolicyRefusal::MaxBorrow,
            PolicyRefusal::Reserved,
            PolicyRefusal::RequireUser,
            PolicyRefusal::GroupMap,
            PolicyRefusal::Application,
            PolicyRefusal::ApplicationSessions,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
    }

    /// The reply's `error`: which limit, for whom.
    pub fn reason(self, asked: &RequestPolicy) -> String {
        let name = |v: &Option<String>| v.clone().unwrap_or_default();
        match self {
            PolicyRefusal::MaxPerUser => format!(
                "limit reached: user {} already holds max_per_user seats of this license",
                name(&asked.user)
            ),
            PolicyRefusal::GroupMax => format!(
                "limit reached: group {} already holds group_max:{} seats of this license",
                name(&asked.group),
                name(&asked.group)
            ),
            PolicyRefusal::MaxBorrow => {
                "limit reached: borrow_ms is longer than the license's max_borrow_ms, or the license allows no borrowing"
                    .to_owned()
            }
            PolicyRefusal::Reserved => {
                "no free seat: the free seats are reserved for other groups (group_reserve)".to_owned()
            }
            PolicyRefusal::RequireUser => {
                "refused: this license requires a user on every acquire (require_user); send `user`".to_owned()
            }
            PolicyRefusal::GroupMap => format!(
                "refused: the license's group map decides the group, and `{}` is not user `{}`'s group there (send no group, or the mapped one)",
                name(&asked.group),
                name(&asked.user)
            ),
            PolicyRefusal::Application => {
                "refused: the license lists the applications that may use it, and this one is not among them (ask its administrator: license put --applications)"
                    .to_owned()
            }
            PolicyRefusal::ApplicationSessions => {
                "limit reached: this application already holds tenancy.application_sessions seats of this license"
                    .to_owned()
            }
        }
    }
}

impl fmt::Display for PolicyRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The priority a waiter's queue score stands for (lua/includes/queue.lua:
/// arrival number minus priority times [`PRIORITY_STEP`], arrivals below it).
pub fn score_priority(score: i64) -> u8 {
    let p = (PRIORITY_STEP - score - 1).div_euclid(PRIORITY_STEP);
    p.clamp(0, i64::from(MAX_PRIORITY)) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_scores_order_by_priority_then_arrival_and_round_trip() {
        let score = |seq: i64, p: i64| seq - p * PRIORITY_STEP;
        for p in 0..=9 {
            for seq in [1, 2, 1_000_000, PRIORITY_STEP - 1] {
                assert_eq!(score_priority(score(seq, p)), p as u8, "{seq} {p}");
                // Exact as a double: the scores Redis stores.
                assert_eq!(score(seq, p) as f64 as i64, score(seq, p));
            }
        }
        assert!(score(1_000, 1) < score(1, 0), "a higher priority goes first");
        assert!(score(1, 5) < score(2, 5), "FIFO within one priority");
        const { assert!((10 * PRIORITY_STEP) < (1 << 53)) };
    }

    #[test]
    fn a_record_provisions_its_policies_whatever_the_flag_says() {
        let policy = LicensePolicy {
            max_per_user: Some(2),
            group_max: [("cad".to_owned(), 3)].into(),
            group_reserve: [("cad".to_owned(), 1)].into(),
            max_priority: Some(5),
            linger_ms: Some(30_000),
            max_borrow_ms: Some(86_400_000),
            require_user: Some(true),
            queue_max_per_user: Some(4),
            queue_max_per_group: Some(6),
            applications: [("billing".to_owned(), true), ("demo".to_owned(), false)].into(),
        };
        let mut record: HashMap<String, String> = policy.fields().into_iter().collect();
        record.insert("seats_total".into(), "5".into());
        assert_eq!(LicensePolicy::from_record(&record), policy);
        record.remove(FLAG_FIELD);
        assert_eq!(LicensePolicy::from_record(&record), policy, "no flag");
        record.insert(FLAG_FIELD.into(), "0".into());
        assert_eq!(LicensePolicy::from_record(&record), policy, "flag 0");
        assert!(LicensePolicy::default().fields().is_empty());
        record.insert("max_per_user".into(), "2.5".into());
        assert_eq!(
            LicensePolicy::from_record(&record).max_per_user,
            Some(0),
            "fails closed"
        );
        assert!(policy.validate(5).is_ok());
        assert!(policy.validate(0).is_err(), "reservations beyond the seats");
        let wide = LicensePolicy {
            group_reserve: [("cad".to_owned(), 4)].into(),
            ..policy
        };
        assert!(wide.validate(5).is_err(), "a reservation above the group's max");
    }

    #[test]
    fn who_asks_goes_to_the_script_as_one_argument() {
        assert_eq!(RequestPolicy::NONE.script_arg(), "");
        let who = RequestPolicy {
            user: Some("ada@example.com".into()),
            group: None,
            priority: 3,
            borrow_ms: 60_000,
        };
        assert_eq!(who.script_arg(), "ada@example.com||3|60000");
    }

    #[test]
    fn refusals_round_trip_through_their_detail() {
        for r in [
            PolicyRefusal::MaxPerUser,
            PolicyRefusal::GroupMax,
            PolicyRefusal::MaxBorrow,
            PolicyRefusal::Reserved,
            PolicyRefusal::RequireUser,
            PolicyRefusal::GroupMap,
        ] {
            assert_eq!(PolicyRefusal::parse(r.as_str()), Some(r));
        }
        assert_eq!(PolicyRefusal::parse("queue_full"), None);
        let asked = RequestPolicy {
            user: Some("ada".into()),
            ..RequestPolicy::NONE
        };
        assert!(PolicyRefusal::MaxPerUser.reason(&asked).contains("user ada"));
        let claimed = RequestPolicy {
            group: Some("sim".into()),
            ..asked
        };
        assert!(PolicyRefusal::GroupMap
            .reason(&claimed)
            .contains("`sim` is not user `ada`'s group"));
        assert!(PolicyRefusal::RequireUser
            .reason(&RequestPolicy::NONE)
            .contains("require_user"));
    }
}
