//! The seat event record: its types, its fields, decoded here.
//!
//! The seat scripts record one event per change of seat state (and per
//! denial) in the same atomic step as the change (lua/includes/events.lua,
//! which writes the fields named here); `seatgate events` follows them and
//! `seatgate report` (`views::usage`) aggregates them. A unit test pins the
//! Lua writer's types and fields to this description. docs/protocol.md
//! ("Events") lists every type and field.

use std::collections::BTreeMap;

use strum::{EnumString, IntoStaticStr, VariantArray};

use crate::status::Status;

/// Event types on the events stream.
///
/// The wire form is the variant's name in snake_case, derived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoStaticStr, EnumString, VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum EventType {
    /// A session took a seat directly.
    Acquired,
    /// A session gave its seat back (a seat-freed event).
    Released,
    /// A session was evicted for a stale heartbeat (a seat-freed event).
    Evicted,
    /// A session joined a wait queue.
    Queued,
    /// A waiting session got a seat.
    Granted,
    /// A waiting session's wait ran out.
    QueueTimeout,
    /// A waiting session left the queue by releasing.
    LeftQueue,
    /// A request was refused a seat (`reason` is its status).
    Denied,
    /// An administrator took a session's seat (`held` 1, a seat-freed
    /// event) or its place in the queue (`held` 0) away; carries `actor`
    /// and `reason`, the audit trail.
    Revoked,
    /// An administrator created or changed the license record (`license
    /// put`): carries `actor`, and `before` and `after`, the fields changed
    /// (JSON objects; `before` `{}` when the license was created).
    LicensePut,
    /// An administrator deleted the license (`license delete`): carries
    /// `actor` and `before`, the record as it was; the `evicted` and
    /// `denied` events of its holders and waiters follow in the same step.
    LicenseDeleted,
    /// An administrator changed the license's group map (`license groups
    /// set|unset`): carries `actor`, `before` and `after` (user -> group,
    /// JSON; the user absent on a side where it was in no group).
    GroupsChanged,
}

/// What an event does to the seat a session holds: usage reports pair each
/// `Taken` with the session's next `Freed` to attribute hold time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeatChange {
    /// The session holds a seat from this event on.
    Taken,
    /// The session holds no seat from this event on.
    Freed,
    /// The session's seat (if any) is unchanged.
    Unchanged,
}

impl EventType {
    /// Whether an administrator's change of the license (its record or its
    /// group map) made this event, rather than a change of seat state: the
    /// admin trail (docs/protocol.md, "Events").
    pub fn is_admin(self) -> bool {
        matches!(
            self,
            EventType::LicensePut | EventType::LicenseDeleted | EventType::GroupsChanged
        )
    }

    /// Every event type, in declaration order, for tests. Derived: a new
    /// variant is in it without anyone remembering to add it.
    pub const ALL: &'static [EventType] = <EventType as VariantArray>::VARIANTS;

    /// The `type` field on the wire.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The event a request's first decision records, if any (the scripts'
    /// EVENT_OF, lua/includes/events.lua, pinned to this by a test): the event
    /// named after the status for a change of seat or queue state, and
    /// `denied` for every other denial ([`Status::is_denial`]), so a new
    /// refusal is published without anyone listing it here.
    pub fn for_status(status: Status) -> Option<EventType> {
        match status {
            Status::Acquired => Some(EventType::Acquired),
            Status::Released => Some(EventType::Released),
            Status::Queued => Some(EventType::Queued),
            Status::LeftQueue => Some(EventType::LeftQueue),
            Status::Granted => Some(EventType::Granted),
            Status::QueueTimeout => Some(EventType::QueueTimeout),
            Status::Revoked => Some(EventType::Revoked),
            denial if denial.is_denial() => Some(EventType::Denied),
            // ALREADY_ACTIVE, heartbeats, a release of nothing, invalid
            // requests and errors change nothing and refuse no seat.
            _ => None,
        }
    }

    /// What this event does to its session's seat. A `revoked` event frees
    /// one only when the session held it: [`EventRecord::seat_change`] reads
    /// its `held` field; by its type alone it counts as freeing one.
    pub fn seat_change(self) -> SeatChange {
        // No wildcard: a new type must say whether it takes or frees a seat.
        match self {
            EventType::Acquired | EventType::Granted => SeatChange::Taken,
            EventType::Released | EventType::Evicted | EventType::Revoked => SeatChange::Freed,
            EventType::Queued
            | EventType::QueueTimeout
            | EventType::LeftQueue
            | EventType::Denied
            | EventType::LicensePut
            | EventType::LicenseDeleted
            | EventType::GroupsChanged => SeatChange::Unchanged,
        }
    }
}

/// The field names of an event entry, in the order they are written.
pub mod field {
    /// The event type ([`super::EventType`]).
    pub const TYPE: &str = "type";
    /// License id.
    pub const LICENSE: &str = "license";
    /// Session id.
    pub const SESSION: &str = "session";
    /// Seats held after the script that made the event.
    pub const SEATS_USED: &str = "seats_used";
    /// The license's seat count then.
    pub const SEATS_TOTAL: &str = "seats_total";
    /// The Redis clock of that script, ms.
    pub const AT_MS: &str = "at_ms";
    /// Why: `heartbeat_timeout`, `borrow_ended` or `linger_ended` on
    /// `evicted`, the status on `denied`.
    pub const REASON: &str = "reason";
    /// How long the session waited in the queue, ms (`granted`, `queue_timeout`).
    pub const WAITED_MS: &str = "waited_ms";
    /// The license's event number: +1 from one event of the license to the
    /// next, never restarting (lua/includes/events.lua).
    pub const SEQ: &str = "seq";
    /// The epoch of the `seq`: with the license and `seq`, the event's id
    /// for good, also across a restore of Redis (a new life of the function
    /// library, a new epoch: lua/includes/events.lua).
    pub const EPOCH: &str = "epoch";
    /// The request's `user` (the seat's owner record, lua/includes/owners.lua),
    /// on every event of a session that has one.
    pub const USER: &str = "user";
    /// The user's group, as the license's group map (or the request) gives it.
    pub const GROUP: &str = "group";
    /// The waiter's queue priority (`queued`).
    pub const PRIORITY: &str = "priority";
    /// How long the released seat lingers with its session, ms (`released`
    /// under the license's `linger_ms`).
    pub const LINGER_MS: &str = "linger_ms";
    /// When the borrowed seat comes back, ms (`acquired` with `borrow_ms`).
    pub const BORROWED_UNTIL_MS: &str = "borrowed_until_ms";
    /// Who did it (`revoked`: the administrator).
    pub const ACTOR: &str = "actor";
    /// `revoked`: `1` when the session held a seat (now freed), `0` when it waited.
    pub const HELD: &str = "held";
    /// `denied`: denials of the license folded into a count since its last
    /// recorded one (lua/includes/denial_sample.lua); on an aggregate (no
    /// session, no reason) the only denials it accounts for.
    pub const FOLDED: &str = "folded";
    /// The admin events (`license_put`, `license_deleted`, `groups_changed`):
    /// the fields the change touched as they were, a JSON object of
    /// strings (`{}`: none, a license created).
    pub const BEFORE: &str = "before";
    /// The admin events: the same fields as they are after the change (a
    /// field absent from it was removed).
    pub const AFTER: &str = "after";
}

/// A license's seats after the script that decided, and that script's
/// Redis time: what an event or a queue reply reports of the license.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeatsAt {
    /// Seats held afterwards.
    pub used: i64,
    /// The license's seats.
    pub total: i64,
    /// The Redis clock of that script, ms.
    pub at_ms: i64,
}

/// One seat event, as the scripts write it (lua/includes/events.lua); built
/// in Rust by tests and tools that write events of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event<'a> {
    /// What happened.
    pub kind: EventType,
    /// License id.
    pub license: &'a str,
    /// Session id.
    pub session: &'a str,
    /// Seats held afterwards.
    pub seats_used: i64,
    /// The license's seats.
    pub seats_total: i64,
    /// When, on the Redis server's clock (ms): also what the stream is
    /// trimmed by, so no worker's clock can trim an event early.
    pub at_ms: i64,
    /// Why, where it applies (`heartbeat_timeout` for evictions, the wire
    /// status for denials).
    pub reason: Option<&'a str>,
    /// How long the session waited in the queue (`granted`, `queue_timeout`),
    /// for the wait figures of usage reports.
    pub waited_ms: Option<i64>,
    /// The request's `user`, so usage reports can attribute seat time to
    /// people without reading sessions.
    pub user: Option<String>,
    /// The waiter's queue priority (`queued`), after the license's cap.
    pub priority: Option<i64>,
    /// How long the released seat lingers (`released` under `linger_ms`), ms.
    pub linger_ms: Option<i64>,
    /// When the borrowed seat comes back (`acquired` with `borrow_ms`), ms.
    pub borrowed_until_ms: Option<i64>,
    /// Who did it, where a person did (`revoked`).
    pub actor: Option<&'a str>,
    /// `revoked`: whether the session held a seat or only waited, so that
    /// usage reports end a hold only where there was one.
    pub held: Option<bool>,
}

impl<'a> Event<'a> {
    /// An event without the optional fields.
    pub fn new(
        kind: EventType,
        license: &'a str,
        session: &'a str,
        seats_used: i64,
        seats_total: i64,
        at_ms: i64,
    ) -> Event<'a> {
        Event {
            kind,
            license,
            session,
            seats_used,
            seats_total,
            at_ms,
            reason: None,
            waited_ms: None,
            user: None,
            priority: None,
            linger_ms: None,
            borrowed_until_ms: None,
            actor: None,
            held: None,
        }
    }

    /// The entry's fields, in order; absent optional fields are left out.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let mut fields = vec![
            (field::TYPE, self.kind.as_str().to_owned()),
            (field::LICENSE, self.license.to_owned()),
            (field::SESSION, self.session.to_owned()),
            (field::SEATS_USED, self.seats_used.to_string()),
            (field::SEATS_TOTAL, self.seats_total.to_string()),
            (field::AT_MS, self.at_ms.to_string()),
        ];
        if let Some(reason) = self.reason {
            fields.push((field::REASON, reason.to_owned()));
        }
        if let Some(waited) = self.waited_ms {
            fields.push((field::WAITED_MS, waited.to_string()));
        }
        if let Some(user) = &self.user {
            fields.push((field::USER, user.clone()));
        }
        if let Some(actor) = self.actor {
            fields.push((field::ACTOR, actor.to_owned()));
        }
        if let Some(held) = self.held {
            fields.push((field::HELD, if held { "1" } else { "0" }.to_owned()));
        }
        let policy = [
            (field::PRIORITY, self.priority),
            (field::LINGER_MS, self.linger_ms),
            (field::BORROWED_UNTIL_MS, self.borrowed_until_ms),
        ];
        for (name, value) in policy {
            if let Some(v) = value {
                fields.push((name, v.to_string()));
            }
        }
        fields
    }
}

/// One event as read back from the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRecord {
    /// The type; `None` for a type this build does not know (written by a
    /// newer seatgate): its seat counts still tell the license's state.
    pub kind: Option<EventType>,
    /// License id.
    pub license: String,
    /// Session id ("" when absent).
    pub session: String,
    /// Seats held after the event.
    pub seats_used: i64,
    /// The license's seats then (0 when absent).
    pub seats_total: i64,
    /// The Redis clock of the deciding script, ms.
    pub at_ms: i64,
    /// Why, where it applies.
    pub reason: Option<String>,
    /// Queue wait, ms, where it applies.
    pub waited_ms: Option<i64>,
    /// The session's user, where known.
    pub user: Option<String>,
    /// The user's group, where known.
    pub group: Option<String>,
    /// The license's event number (absent on events written before it).
    pub seq: Option<i64>,
    /// The epoch of `seq` (absent on events written before it).
    pub epoch: Option<String>,
    /// Who did it, where a person did.
    pub actor: Option<String>,
    /// `revoked`: whether the session held a seat (absent: taken as held).
    pub held: Option<bool>,
    /// `denied`: denials folded into this event's count, not recorded one
    /// by one (0 when absent).
    pub folded: u64,
    /// The admin events: the changed fields before the change (JSON text, as written).
    pub before: Option<String>,
    /// The admin events: the changed fields after the change (JSON text, as written).
    pub after: Option<String>,
}

impl EventRecord {
    /// Reads an entry through `get` (field name → value); `None` when it
    /// lacks what every event has (a license, `seats_used`, `at_ms`).
    pub fn parse<'v>(get: impl Fn(&str) -> Option<&'v str>) -> Option<EventRecord> {
        let number = |name: &str| get(name).and_then(|v| v.parse::<i64>().ok());
        let license = get(field::LICENSE).filter(|l| !l.is_empty())?.to_owned();
        Some(EventRecord {
            kind: get(field::TYPE).and_then(|t| t.parse().ok()),
            license,
            session: get(field::SESSION).unwrap_or_default().to_owned(),
            seats_used: number(field::SEATS_USED)?,
            seats_total: number(field::SEATS_TOTAL).unwrap_or(0),
            at_ms: number(field::AT_MS)?,
            reason: get(field::REASON).map(str::to_owned),
            waited_ms: number(field::WAITED_MS),
            user: get(field::USER).filter(|u| !u.is_empty()).map(str::to_owned),
            group: get(field::GROUP).filter(|g| !g.is_empty()).map(str::to_owned),
            seq: number(field::SEQ),
            epoch: get(field::EPOCH).filter(|e| !e.is_empty()).map(str::to_owned),
            actor: get(field::ACTOR).map(str::to_owned),
            held: get(field::HELD).map(|h| h != "0"),
            folded: get(field::FOLDED).and_then(|v| v.parse().ok()).unwrap_or(0),
            before: get(field::BEFORE).map(str::to_owned),
            after: get(field::AFTER).map(str::to_owned),
        })
    }

    /// The license's seat count just before this event: for a `license_put`
    /// the `seats_total` its `before` names (0 when the put created the
    /// license; the event's own when the change left the seats alone), for
    /// any other event the event's own. What a usage report charges
    /// capacity at up to the event.
    pub fn seats_total_before(&self) -> i64 {
        if self.created() {
            return 0;
        }
        admin_fields(self.kind, &self.before)
            .and_then(|before| before.get(field::SEATS_TOTAL)?.parse().ok())
            .unwrap_or(self.seats_total)
    }

    /// Whether this is the `license_put` that created the license: its
    /// `after` names a `seats_total`, its `before` none (the put's fields
    /// are the ones it changed, and a record without `seats_total` is no
    /// license).
    pub fn created(&self) -> bool {
        match (
            admin_fields(self.kind, &self.before),
            admin_fields(self.kind, &self.after),
        ) {
            (Some(before), Some(after)) => {
                !before.contains_key(field::SEATS_TOTAL) && after.contains_key(field::SEATS_TOTAL)
            }
            _ => false,
        }
    }

    /// How many denials this event accounts for: a recorded `denied` its
    /// own (when it has a reason) plus those folded into it; an aggregate
    /// (no reason) only the folded ones; 0 for other types.
    pub fn denials_accounted(&self) -> u64 {
        match self.kind {
            Some(EventType::Denied) => {
                u64::from(self.reason.as_deref().is_some_and(|r| !r.is_empty())) + self.folded
            }
            _ => 0,
        }
    }

    /// What this event did to its session's seat: by its type, except that
    /// a revocation of a waiting session (`held` 0) freed none.
    pub fn seat_change(&self) -> Option<SeatChange> {
        match self.kind? {
            EventType::Revoked if self.held == Some(false) => Some(SeatChange::Unchanged),
            kind => Some(kind.seat_change()),
        }
    }

    /// The denial this event records, as a wire status: the reason of a
    /// `denied` event, QUEUE_TIMEOUT for a wait that ran out.
    pub fn denial(&self) -> Option<&str> {
        match self.kind? {
            EventType::Denied => self.reason.as_deref().filter(|r| !r.is_empty()),
            EventType::QueueTimeout => Some(Status::QueueTimeout.as_str()),
            _ => None,
        }
    }
}

/// `before` or `after` of a `license_put` event, decoded (`None` for
/// another type, or a value that is no JSON object of strings).
fn admin_fields(kind: Option<EventType>, raw: &Option<String>) -> Option<BTreeMap<String, String>> {
    if kind != Some(EventType::LicensePut) {
        return None;
    }
    serde_json::from_str(raw.as_deref()?).ok()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// The documented wire form of every event type. A match without a
    /// wildcard, so a new type does not compile until it has its row here.
    fn documented(kind: EventType) -> &'static str {
        match kind {
            EventType::Acquired => "acquired",
            EventType::Released => "released",
            EventType::Evicted => "evicted",
            EventType::Queued => "queued",
            EventType::Granted => "granted",
            EventType::QueueTimeout => "queue_timeout",
            EventType::LeftQueue => "left_queue",
            EventType::Denied => "denied",
            EventType::Revoked => "revoked",
            EventType::LicensePut => "license_put",
            EventType::LicenseDeleted => "license_deleted",
            EventType::GroupsChanged => "groups_changed",
        }
    }

    #[test]
    fn event_types_are_the_documented_ones() {
        let doc = include_str!("../../../docs/protocol.md");
        let type_field = doc
            .lines()
            .find(|line| line.starts_with("| `type` |"))
            .expect("the `type` row");
        for &kind in EventType::ALL {
            let wire = documented(kind);
            assert_eq!(kind.as_str(), wire);
            assert_eq!(wire.parse::<EventType>(), Ok(kind));
            assert!(type_field.contains(&format!("`{wire}`")), "{type_field}");
            let row = format!("| `{wire}` |");
            assert!(
                doc.lines().any(|line| line.starts_with(&row)),
                "docs/protocol.md has no row {row}"
            );
        }
    }

    #[test]
    fn every_field_is_documented() {
        let doc = include_str!("../../../docs/protocol.md");
        for name in [
            field::TYPE,
            field::LICENSE,
            field::SESSION,
            field::SEATS_USED,
            field::SEATS_TOTAL,
            field::AT_MS,
            field::REASON,
            field::WAITED_MS,
            field::USER,
            field::GROUP,
            field::SEQ,
            field::ACTOR,
            field::HELD,
            field::BEFORE,
            field::AFTER,
        ] {
            assert!(
                doc.lines()
                    .any(|line| line.starts_with("| `") && line.contains(&format!("`{name}`"))),
                "docs/protocol.md's events table has no row for {name}"
            );
        }
    }

    #[test]
    fn an_outcome_publishes_the_event_named_after_its_status_or_a_denial() {
        for &status in Status::ALL {
            match EventType::for_status(status) {
                Some(EventType::Denied) => {
                    assert!(status.is_denial() && status != Status::QueueTimeout, "{status}")
                }
                Some(kind) => assert_eq!(kind.as_str(), status.as_str().to_lowercase()),
                None => assert!(!status.is_denial(), "{status} is a denial without an event"),
            }
        }
        assert_eq!(EventType::for_status(Status::AlreadyActive), None);
        assert_eq!(EventType::for_status(Status::HeartbeatUpdated), None);
        assert_eq!(EventType::for_status(Status::SessionNotFound), None);
        assert_eq!(
            EventType::for_status(Status::NoSeatsAvailable),
            Some(EventType::Denied)
        );
        assert_eq!(
            EventType::for_status(Status::RateLimited),
            Some(EventType::Denied)
        );
    }

    /// The event of each status, as lua/includes/events.lua's EVENT_OF
    /// table gives it (the scripts record it), by the status's wire form.
    fn lua_event_of() -> HashMap<String, String> {
        let lua = include_str!("../lua/includes/events.lua");
        let start = lua.find("local EVENT_OF = {").expect("EVENT_OF in events.lua");
        let table = &lua[start..start + lua[start..].find("\n}").expect("its end")];
        table
            .lines()
            .skip(1)
            .flat_map(|line| line.split(','))
            .filter_map(|pair| {
                let (status, kind) = pair.split_once('=')?;
                Some((
                    status.trim().to_owned(),
                    kind.trim().trim_matches('\'').to_owned(),
                ))
            })
            .collect()
    }

    #[test]
    fn the_scripts_record_the_event_of_each_status() {
        let lua = lua_event_of();
        assert!(lua.len() > 10, "{lua:?}");
        for &status in Status::ALL {
            assert_eq!(
                lua.get(status.as_str()).map(String::as_str),
                EventType::for_status(status).map(EventType::as_str),
                "{status}"
            );
        }
    }

    #[test]
    fn a_denied_event_accounts_for_itself_and_what_it_folded() {
        let read = |fields: &[(&str, &str)]| {
            let map: HashMap<&str, &str> = fields.iter().copied().collect();
            EventRecord::parse(|name| map.get(name).copied()).unwrap()
        };
        let base = [
            ("type", "denied"),
            ("license", "acme"),
            ("seats_used", "1"),
            ("at_ms", "5"),
        ];
        let one = read(&[&base[..], &[("session", "s1"), ("reason", "NO_SEATS_AVAILABLE")]].concat());
        assert_eq!((one.folded, one.denials_accounted()), (0, 1));
        let carrying = read(
            &[
                &base[..],
                &[("session", "s2"), ("reason", "RATE_LIMITED"), ("folded", "41")],
            ]
            .concat(),
        );
        assert_eq!((carrying.folded, carrying.denials_accounted()), (41, 42));
        assert_eq!(carrying.denial(), Some("RATE_LIMITED"));
        let aggregate = read(&[&base[..], &[("folded", "7")]].concat());
        assert_eq!((aggregate.denial(), aggregate.denials_accounted()), (None, 7));
        let granted = read(&[
            ("type", "granted"),
            ("license", "acme"),
            ("seats_used", "1"),
            ("at_ms", "5"),
        ]);
        assert_eq!(granted.denials_accounted(), 0);
    }

    #[test]
    fn an_event_reads_back_as_it_was_written() {
        let mut event = Event::new(EventType::Granted, "acme", "s1", 3, 5, 1_796_000_000_123);
        event.waited_ms = Some(2_500);
        event.user = Some("bob@example.com".to_owned());
        let fields: HashMap<&str, String> = event.fields().into_iter().collect();
        let record = EventRecord::parse(|name| fields.get(name).map(String::as_str)).unwrap();
        assert_eq!(
            record,
            EventRecord {
                kind: Some(EventType::Granted),
                license: "acme".into(),
                session: "s1".into(),
                seats_used: 3,
                seats_total: 5,
                at_ms: 1_796_000_000_123,
                reason: None,
                waited_ms: Some(2_500),
                user: Some("bob@example.com".into()),
                group: None,
                seq: None,
                epoch: None,
                actor: None,
                held: None,
                folded: 0,
                before: None,
                after: None,
            }
        );
        assert_eq!(record.denial(), None);
        let timeout = Event::new(EventType::QueueTimeout, "acme", "s2", 5, 5, 1);
        let fields: HashMap<&str, String> = timeout.fields().into_iter().collect();
        let record = EventRecord::parse(|name| fields.get(name).map(String::as_str)).unwrap();
        assert_eq!(record.denial(), Some("QUEUE_TIMEOUT"));
    }

    #[test]
    fn foreign_entries_are_skipped_and_unknown_types_kept() {
        let parse = |pairs: &[(&'static str, &'static str)]| {
            let map: HashMap<&str, &str> = pairs.iter().copied().collect();
            EventRecord::parse(|name| map.get(name).copied())
        };
        assert_eq!(parse(&[("type", "acquired"), ("at_ms", "1")]), None);
        assert_eq!(
            parse(&[("license", "l"), ("seats_used", "x"), ("at_ms", "1")]),
            None
        );
        let future = parse(&[
            ("type", "teleported"),
            ("license", "l"),
            ("seats_used", "2"),
            ("at_ms", "9"),
        ])
        .unwrap();
        assert_eq!((future.kind, future.seats_used, future.at_ms), (None, 2, 9));
    }

    #[test]
    fn seats_are_taken_by_acquires_and_grants_and_freed_by_releases_and_evictions() {
        let taken: Vec<_> = EventType::ALL
            .iter()
            .filter(|k| k.seat_change() == SeatChange::Taken)
            .collect();
        assert_eq!(taken, [&EventType::Acquired, &EventType::Granted]);
        assert_eq!(EventType::Evicted.seat_change(), SeatChange::Freed);
        assert_eq!(EventType::Denied.seat_change(), SeatChange::Unchanged);
    }

    #[test]
    fn a_revocation_frees_a_seat_only_when_the_session_held_one() {
        for (held, change) in [(true, SeatChange::Freed), (false, SeatChange::Unchanged)] {
            let mut event = Event::new(EventType::Revoked, "acme", "s1", 0, 1, 7);
            (event.reason, event.actor, event.held) = (Some("audit"), Some("ada"), Some(held));
            let fields: HashMap<&str, String> = event.fields().into_iter().collect();
            let record = EventRecord::parse(|name| fields.get(name).map(String::as_str)).unwrap();
            assert_eq!(
                (record.reason.as_deref(), record.actor.as_deref(), record.held),
                (Some("audit"), Some("ada"), Some(held))
            );
            assert_eq!(record.seat_change(), Some(change), "held {held}");
            assert_eq!(record.denial(), None);
        }
    }

    #[test]
    fn a_put_tells_the_seats_before_it_and_whether_it_created_the_license() {
        let put = |before: &str, after: &str| {
            let map: HashMap<&str, &str> = [
                ("type", "license_put"),
                ("license", "acme"),
                ("seats_used", "0"),
                ("seats_total", "8"),
                ("at_ms", "5"),
                ("before", before),
                ("after", after),
            ]
            .into_iter()
            .collect();
            EventRecord::parse(|name| map.get(name).copied()).unwrap()
        };
        let created = put("{}", r#"{"seats_total":"8","active":"1"}"#);
        assert!(created.created());
        assert_eq!(created.seats_total_before(), 0);
        let raised = put(r#"{"seats_total":"5"}"#, r#"{"seats_total":"8"}"#);
        assert!(!raised.created());
        assert_eq!(raised.seats_total_before(), 5);
        let expiry = put(r#"{"expires_at_ms":"0"}"#, r#"{"expires_at_ms":"1900000000000"}"#);
        assert!(!expiry.created());
        assert_eq!(expiry.seats_total_before(), 8);
        assert!(EventType::LicensePut.is_admin() && !EventType::Revoked.is_admin());
        assert_eq!(EventType::GroupsChanged.seat_change(), SeatChange::Unchanged);
    }
}
