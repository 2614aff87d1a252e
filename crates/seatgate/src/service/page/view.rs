//! What the page's JSON holds: one summary row per license, busiest first,
//! and one license's detail with its holders and waiters paged. Built from
//! the shared snapshot (snapshot.rs); personal fields (user,
//! hardware and session ids, per-user counts) only when `http.page_personal`
//! is on, and otherwise left out of the JSON altogether.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::views::status::{Holder, LicenseStatus, Status, Waiter};
use seatgate_core::license::InvalidField;
use seatgate_core::policy::LicensePolicy;

/// Whether a license hands out seats, and if not, why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Active, unexpired, with a valid record and seats: counted in the header.
    Active,
    /// `active` is off.
    Inactive,
    /// Its `expires_at_ms` has passed (Redis clock).
    Expired,
    /// Its record breaks the provisioning rules (LICENSE_INVALID).
    Invalid,
    /// No record, or one without seats: seats shown are stranded.
    NoRecord,
}

impl State {
    /// The state of `l` at `now` (Redis clock, ms).
    pub fn of(l: &LicenseStatus, now: i64) -> State {
        if l.invalid.is_some() {
            State::Invalid
        } else if l.seats_total <= 0 {
            State::NoRecord
        } else if !l.active {
            State::Inactive
        } else if l.expires_at_ms > 0 && l.expires_at_ms <= now {
            State::Expired
        } else {
            State::Active
        }
    }
}

/// One license in the summary table.
#[derive(Debug, Serialize)]
pub struct Row<'a> {
    /// License id.
    pub license: &'a str,
    /// Seats held (lingering and borrowed ones included).
    pub seats_used: usize,
    /// Seats provisioned.
    pub seats_total: i64,
    /// `seats_used / seats_total`; 1 for seats held without a record.
    pub utilisation: f64,
    /// Sessions waiting.
    pub waiting: usize,
    /// Of `seats_used`, lingering after a release.
    pub seats_lingering: usize,
    /// Of `seats_used`, borrowed.
    pub seats_borrowed: usize,
    /// The highest priority among the waiters (0 with none).
    pub top_priority: u8,
    /// Whether it hands out seats.
    pub state: State,
    /// Expiry (ms), 0 = never.
    pub expires_at_ms: i64,
    /// The field that breaks the record, if one does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invalid: Option<&'a InvalidField>,
    /// Reservations, per-user and per-group limits, priorities, linger and
    /// borrow: the page's badges. Group names are not personal.
    pub policy: &'a LicensePolicy,
}

impl<'a> Row<'a> {
    /// `l`'s row at `now` (Redis clock, ms).
    pub fn of(l: &'a LicenseStatus, now: i64) -> Row<'a> {
        let utilisation = if l.seats_total > 0 {
            l.seats_used as f64 / l.seats_total as f64
        } else if l.seats_used > 0 {
            1.0
        } else {
            0.0
        };
        Row {
            license: &l.license,
            seats_used: l.seats_used,
            seats_total: l.seats_total,
            utilisation,
            waiting: l.queue.len(),
            seats_lingering: l.seats_lingering,
            seats_borrowed: l.seats_borrowed,
            top_priority: l.queue.iter().map(|w| w.priority).max().unwrap_or(0),
            state: State::of(l, now),
            expires_at_ms: l.expires_at_ms,
            invalid: l.invalid.as_ref(),
            policy: &l.policy,
        }
    }

    /// Busiest first: utilisation, then waiters, then name.
    fn busiest_first(a: &Row<'_>, b: &Row<'_>) -> std::cmp::Ordering {
        b.utilisation
            .total_cmp(&a.utilisation)
            .then(b.waiting.cmp(&a.waiting))
            .then(a.license.cmp(b.license))
    }
}

/// The header's figures: active, unexpired licenses only.
#[derive(Debug, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    /// Licenses in the snapshot.
    pub licenses: usize,
    /// Of those, the ones [`State::Active`]: the only ones counted below.
    pub active: usize,
    /// Seats held in active licenses.
    pub seats_used: usize,
    /// Seats of active licenses.
    pub seats_total: i64,
    /// Sessions waiting for active licenses.
    pub waiting: usize,
}

/// `/status.json`: every license's row, busiest first.
#[derive(Debug, Serialize)]
pub struct Summary<'a> {
    /// The Redis clock when the snapshot was read, ms.
    pub at_ms: i64,
    /// How often the snapshot is read, ms: the page polls as often.
    pub refresh_ms: u64,
    /// Whether personal fields are shown (`http.page_personal`).
    pub personal: bool,
    /// The header's figures.
    pub totals: Totals,
    /// The rows, busiest first.
    pub licenses: Vec<Row<'a>>,
}

impl<'a> Summary<'a> {
    /// The summary of `status`.
    pub fn of(status: &'a Status, refresh_ms: u64, personal: bool) -> Summary<'a> {
        let now = status.at_ms;
        let mut licenses: Vec<Row<'a>> = status.licenses.iter().map(|l| Row::of(l, now)).collect();
        licenses.sort_by(Row::busiest_first);
        let mut totals = Totals {
            licenses: licenses.len(),
            ..Totals::default()
        };
        for row in licenses.iter().filter(|r| r.state == State::Active) {
            totals.active += 1;
            totals.seats_used += row.seats_used;
            totals.seats_total += row.seats_total;
            totals.waiting += row.waiting;
        }
        Summary {
            at_ms: now,
            refresh_ms,
            personal,
            totals,
            licenses,
        }
    }
}

/// One seat holder on the page. The `Option`s of personal fields are `None`
/// (and absent from the JSON) unless `http.page_personal` is on.
#[derive(Debug, Serialize)]
pub struct HolderView<'a> {
    /// Session id (personal).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<&'a str>,
    /// The request's `user` (personal): not `meta.user_email`, which is
    /// display metadata only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<&'a str>,
    /// `meta.hardware_id` (personal).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hardware_id: Option<&'a str>,
    /// The group the seat counts for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<&'a str>,
    /// When the seat was taken, ms.
    pub acquired_at_ms: i64,
    /// Last heartbeat, ms.
    pub last_heartbeat_ms: i64,
    /// Lingering after a release until then, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lingering_until_ms: Option<i64>,
    /// Borrowed until then, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub borrowed_until_ms: Option<i64>,
}

impl<'a> HolderView<'a> {
    fn of(h: &'a Holder, personal: bool) -> HolderView<'a> {
        let personal_field = |v: Option<&'a str>| v.filter(|_| personal);
        HolderView {
            session: personal_field(Some(&h.session)),
            user: personal_field(h.user.as_deref()),
            hardware_id: personal_field(h.hardware_id.as_deref()),
            group: h.group.as_deref(),
            acquired_at_ms: h.acquired_at_ms,
            last_heartbeat_ms: h.last_heartbeat_ms,
            lingering_until_ms: h.lingering_until_ms,
            borrowed_until_ms: h.borrowed_until_ms,
        }
    }
}

/// One waiter on the page; personal fields as in [`HolderView`].
#[derive(Debug, Serialize)]
pub struct WaiterView<'a> {
    /// 1-based place in the queue.
    pub position: usize,
    /// Session id (personal).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<&'a str>,
    /// The request's `user` (personal).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<&'a str>,
    /// The group its seat will count for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<&'a str>,
    /// Priority, 0-9.
    pub priority: u8,
    /// When it joined the queue, ms.
    pub queued_at_ms: i64,
    /// When it gives up, ms.
    pub deadline_ms: i64,
    /// The borrow its grant starts, ms (0 = none).
    pub borrow_ms: u64,
}

impl<'a> WaiterView<'a> {
    fn of(w: &'a Waiter, personal: bool) -> WaiterView<'a> {
        WaiterView {
            position: w.position,
            session: Some(w.session.as_str()).filter(|_| personal),
            user: w.user.as_deref().filter(|_| personal),
            group: w.group.as_deref(),
            priority: w.priority,
            queued_at_ms: w.queued_at_ms,
            deadline_ms: w.deadline_ms,
            borrow_ms: w.borrow_ms,
        }
    }
}

/// `/license.json?license=<id>&limit=<n>`: one license, its first `limit`
/// holders and waiters and how many more there are.
#[derive(Debug, Serialize)]
pub struct Detail<'a> {
    /// The Redis clock when the snapshot was read, ms.
    pub at_ms: i64,
    /// How often the snapshot is read, ms.
    pub refresh_ms: u64,
    /// Whether personal fields are shown.
    pub personal: bool,
    /// Its summary row.
    #[serde(flatten)]
    pub row: Row<'a>,
    /// Seats held per group.
    pub held_by_group: &'a BTreeMap<String, i64>,
    /// Seats held per user (personal).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_by_user: Option<&'a BTreeMap<String, i64>>,
    /// How many users hold seats (not personal: a count).
    pub users_holding: usize,
    /// The first holders, longest-held first.
    pub holders: Vec<HolderView<'a>>,
    /// Holders beyond those listed.
    pub holders_more: usize,
    /// The first waiters, in queue order.
    pub queue: Vec<WaiterView<'a>>,
    /// Waiters beyond those listed.
    pub queue_more: usize,
}

impl<'a> Detail<'a> {
    /// License `license` of `status`, with at most `limit` holders and
    /// `limit` waiters; `None` when the snapshot has no such license.
    pub fn of(
        status: &'a Status,
        license: &str,
        limit: usize,
        refresh_ms: u64,
        personal: bool,
    ) -> Option<Detail<'a>> {
        let l = status.licenses.iter().find(|l| l.license == license)?;
        Some(Detail {
            at_ms: status.at_ms,
            refresh_ms,
            personal,
            row: Row::of(l, status.at_ms),
            held_by_group: &l.held_by_group,
            held_by_user: Some(&l.held_by_user).filter(|_| personal),
            users_holding: l.held_by_user.values().filter(|n| **n > 0).count(),
            holders: l
                .holders
                .iter()
                .take(limit)
                .map(|h| HolderView::of(h, personal))
                .collect(),
            holders_more: l.holders.len().saturating_sub(limit),
            queue: l
                .queue
                .iter()
                .take(limit)
                .map(|w| WaiterView::of(w, personal))
                .collect(),
            queue_more: l.queue.len().saturating_sub(limit),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn license(id: &str, used: usize, total: i64, waiting: usize) -> LicenseStatus {
        let holder = |i: usize| Holder {
            session: format!("{id}-s{i}"),
            user: Some(format!("user{i}")),
            user_email: Some(format!("u{i}@example.com")),
            hardware_id: Some(format!("HW-{i}")),
            acquired_at_ms: 1_000 + i as i64,
            last_heartbeat_ms: 2_000,
            heartbeats: 1,
            leased: false,
            meta: serde_json::json!({ "user_email": format!("u{i}@example.com") }),
            group: Some("cad".into()),
            lingering_until_ms: None,
            borrowed_until_ms: None,
        };
        let waiter = |i: usize| Waiter {
            position: i + 1,
            session: format!("{id}-w{i}"),
            user: Some(format!("waiter{i}")),
            user_email: Some(format!("w{i}@example.com")),
            queued_at_ms: 1_500,
            deadline_ms: 9_000,
            priority: (i % 4) as u8,
            group: None,
            borrow_ms: 0,
        };
        LicenseStatus {
            license: id.into(),
            seats_used: used,
            seats_lingering: 0,
            seats_borrowed: 0,
            seats_total: total,
            policy: LicensePolicy::default(),
            held_by_user: (0..used).map(|i| (format!("user{i}"), 1)).collect(),
            held_by_group: [("cad".to_owned(), used as i64)].into(),
            active: true,
            expires_at_ms: 0,
            invalid: None,
            holders: (0..used).map(holder).collect(),
            queue: (0..waiting).map(waiter).collect(),
        }
    }

    fn status() -> Status {
        let mut inactive = license("b-inactive", 2, 2, 0);
        inactive.active = false;
        let mut expired = license("c-expired", 1, 1, 0);
        expired.expires_at_ms = 4_000;
        Status {
            at_ms: 5_000,
            licenses: vec![
                license("a-empty", 0, 10, 0),
                inactive,
                expired,
                license("d-half", 2, 4, 0),
                license("e-full", 4, 4, 30),
                license("f-full-quiet", 3, 3, 0),
            ],
        }
    }

    #[test]
    fn the_summary_is_busiest_first_and_counts_active_unexpired_licenses_only() {
        let status = status();
        let summary = Summary::of(&status, 2_000, false);
        let order: Vec<&str> = summary.licenses.iter().map(|r| r.license).collect();
        // Full ones first (the one with waiters ahead), then by name within a tie.
        assert_eq!(
            order,
            [
                "e-full",
                "b-inactive",
                "c-expired",
                "f-full-quiet",
                "d-half",
                "a-empty"
            ]
        );
        assert_eq!(
            summary.totals,
            Totals {
                licenses: 6,
                active: 4,
                seats_used: 9,
                seats_total: 21,
                waiting: 30
            }
        );
        let states: Vec<State> = summary.licenses.iter().map(|r| r.state).collect();
        assert_eq!(states[1..3], [State::Inactive, State::Expired]);
        assert_eq!(summary.licenses[0].top_priority, 3);
    }

    #[test]
    fn personal_fields_are_left_out_unless_enabled() {
        let status = status();
        let hidden =
            serde_json::to_string(&Detail::of(&status, "e-full", 10, 2_000, false).unwrap()).unwrap();
        for personal in [
            "e-full-s0",
            "e-full-w0",
            "user0",
            "waiter0",
            "HW-0",
            "@example.com",
            "held_by_user",
        ] {
            assert!(!hidden.contains(personal), "{personal} in {hidden}");
        }
        let summary = serde_json::to_string(&Summary::of(&status, 2_000, false)).unwrap();
        assert!(
            !summary.contains("user0") && !summary.contains("-s0"),
            "{summary}"
        );

        let shown = Detail::of(&status, "e-full", 10, 2_000, true).unwrap();
        let json = serde_json::to_value(&shown).unwrap();
        assert_eq!(json["holders"][0]["session"], "e-full-s0");
        // The request's user, not meta.user_email.
        assert_eq!(json["holders"][0]["user"], "user0");
        assert_eq!(json["queue"][0]["user"], "waiter0");
        assert_eq!(json["holders"][0]["hardware_id"], "HW-0");
        assert_eq!(json["held_by_user"]["user1"], 1);
        assert!(!json.to_string().contains("@example.com"), "{json}");
    }

    #[test]
    fn holders_and_waiters_are_paged() {
        let status = status();
        let d = Detail::of(&status, "e-full", 10, 2_000, false).unwrap();
        assert_eq!((d.holders.len(), d.holders_more), (4, 0));
        assert_eq!((d.queue.len(), d.queue_more), (10, 20));
        assert_eq!(d.queue[9].position, 10);
        assert_eq!((d.users_holding, d.row.waiting), (4, 30));
        assert!(Detail::of(&status, "nope", 10, 2_000, false).is_none());
    }
}
