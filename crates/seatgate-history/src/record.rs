//! What a history run records: every request sent (and how its XADD went),
//! every reply read, the holds the clients believed in, the administrator's
//! actions, the faults, the seat samples, the events and the final state.
//! Times are Redis's clock (unix ms) wherever Redis gave one (stream entry
//! ids, `TIME`), so that they compare with the events' `at_ms`.

use std::collections::{BTreeMap, HashMap};

use super::faults::FaultKind;
use seatgate::views::usage::UsageReport;

/// The ms part of a stream entry id (`1796012503049-0` → 1796012503049).
pub fn entry_ms(entry_id: &str) -> u64 {
    entry_id
        .split('-')
        .next()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(0)
}

/// One XADD of a request (a re-send of the same id is another `Sent`).
#[derive(Debug, Clone)]
pub struct Sent {
    /// Which client (`usize::MAX`: the administrator).
    pub client: usize,
    /// The request id (the idempotency key).
    pub id: String,
    /// acquire, heartbeat, release, revoke.
    pub op: String,
    /// License and session.
    pub license: String,
    pub session: String,
    /// The entry id XADD returned; `None` when the XADD failed or timed out
    /// (the request may still have reached the stream).
    pub entry: Option<String>,
    /// Why the XADD failed, when it did.
    pub xadd_error: Option<String>,
    /// This XADD repeats the id on purpose: at once (an ambiguous XADD), or
    /// after the first send got no reply in time.
    pub resend: bool,
}

/// One entry read from a reply stream, whatever its id.
#[derive(Debug, Clone)]
pub struct Received {
    /// Which client's stream.
    pub client: usize,
    /// The reply's stream entry id (its ms: Redis's clock at the reply).
    pub entry: String,
    /// Every field.
    pub fields: BTreeMap<String, String>,
}

impl Received {
    pub fn get(&self, field: &str) -> &str {
        self.fields.get(field).map(String::as_str).unwrap_or("")
    }
}

/// How a hold the client believed in ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HoldEnd {
    /// RELEASED at this (reply) time.
    Released(u64),
    /// A heartbeat or release (XADDed at the first time, its answer
    /// written at the second: the reply's entry id) was answered `status`:
    /// the seat was gone. It was decided somewhere between the two.
    Lost(u64, u64, String),
    /// The client stopped heartbeating on purpose at this time and never
    /// released (a crashed client): the reaper must take the seat back.
    Abandoned(u64),
    /// The client stopped, holding it, and gave up on releasing (no reply).
    Unknown,
}

/// A seat a client believed it held, and every heartbeat it sent for it.
#[derive(Debug, Clone)]
pub struct Hold {
    pub client: usize,
    pub license: String,
    pub session: String,
    pub user: String,
    /// When its heartbeat clock started: the reply's `held_since_ms`, else
    /// the reply's entry time.
    pub start_ms: u64,
    /// The heartbeat timeout the reply gave, ms.
    pub timeout_ms: u64,
    /// The entry time of every heartbeat XADD that reached the stream.
    pub heartbeats: Vec<u64>,
    pub end: HoldEnd,
}

/// An administrator's action other than a revoke (which is a request).
#[derive(Debug, Clone)]
pub struct AdminAction {
    pub license: String,
    pub what: AdminKind,
    /// Redis time just before and just after it.
    pub start_ms: u64,
    pub end_ms: u64,
    /// Whether the command succeeded.
    pub ok: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminKind {
    /// `license put L --seats to` (from `from`).
    Seats { from: u64, to: u64 },
    /// `license delete L`.
    Delete,
    /// The license put back after a delete, with its policies.
    Create { seats: u64 },
}

/// A fault injected, with the wall-clock offset from the run's start.
#[derive(Debug, Clone)]
pub struct Fault {
    pub kind: FaultKind,
    /// Which worker, for worker faults; on a cluster, for Redis faults, the
    /// license (index) whose master was hit.
    pub target: Option<usize>,
    pub at: std::time::Duration,
    pub lasted: std::time::Duration,
    /// What it hit, where worth recording (a cluster failover: the license
    /// aimed at, the old master's port and the new one's).
    pub detail: Option<String>,
}

/// One reading of a license's holders and seats, in one transaction.
#[derive(Debug, Clone)]
pub struct Sample {
    pub license: String,
    pub at_ms: u64,
    pub holders: u64,
    /// `None`: no record (deleted).
    pub seats_total: Option<u64>,
}

/// One event read from the events stream(s) at the end.
#[derive(Debug, Clone)]
pub struct Event {
    pub stream: String,
    pub entry: String,
    pub fields: BTreeMap<String, String>,
}

impl Event {
    pub fn get(&self, field: &str) -> &str {
        self.fields.get(field).map(String::as_str).unwrap_or("")
    }
    pub fn num(&self, field: &str) -> Option<u64> {
        self.fields.get(field).and_then(|v| v.parse().ok())
    }
}

/// A license's state once the run quiesced and the reaper caught up.
#[derive(Debug, Clone, Default)]
pub struct FinalLicense {
    pub holders: Vec<String>,
    pub waiting: Vec<String>,
    pub outbox: u64,
    pub exists: bool,
    /// Events still in the license's own log, not relayed to its events
    /// shard (a cluster's relay, runtime::relay; 0 on one node).
    pub unrelayed: u64,
}

/// How a license of the run is provisioned.
#[derive(Debug, Clone)]
pub struct LicenseSetup {
    pub name: String,
    pub seats: u64,
    pub max_per_user: Option<u64>,
    pub max_priority: Option<u8>,
    pub linger_ms: Option<u64>,
    pub heartbeat_timeout_ms: u64,
}

/// Everything one run recorded.
#[derive(Debug, Clone, Default)]
pub struct History {
    pub seed: u64,
    /// Run on a Redis Cluster (3 masters, a replica each), not one node.
    pub cluster: bool,
    pub licenses: Vec<LicenseSetup>,
    /// Session → user, for sessions that named one.
    pub users: HashMap<String, String>,
    pub sent: Vec<Sent>,
    pub received: Vec<Received>,
    pub holds: Vec<Hold>,
    pub admin: Vec<AdminAction>,
    pub faults: Vec<Fault>,
    pub samples: Vec<Sample>,
    pub events: Vec<Event>,
    pub final_state: BTreeMap<String, FinalLicense>,
    /// Requests still pending in the group when the run gave up waiting.
    pub pending_at_end: u64,
    /// Where they were: `<stream> pending <n> lag <n>` per stream that had any.
    pub pending_where: Vec<String>,
    /// Reaper period and the most any license lingers, ms: the checks'
    /// allowance for "eventually".
    pub reaper_period_ms: u64,
    /// What `seatgate audit` said about the run's Redis at the end:
    /// Err(its output) when it found violations or failed; None when it
    /// was not run (the `audit` check then says so: a skipped audit is an
    /// anomaly, not a pass).
    pub audit: Option<Result<(), String>>,
    /// What `seatgate report --format json` said at the end (the `report`
    /// check compares it with the history's totals); None when not run.
    pub report: Option<Result<UsageReport, String>>,
}

impl History {
    /// Appends `other`'s records (a client's, the admin's) to this history.
    pub fn absorb(&mut self, other: History) {
        self.users.extend(other.users);
        self.sent.extend(other.sent);
        self.received.extend(other.received);
        self.holds.extend(other.holds);
        self.admin.extend(other.admin);
        self.faults.extend(other.faults);
        self.samples.extend(other.samples);
    }

    /// Faults injected, by kind.
    pub fn faults_by_kind(&self) -> BTreeMap<String, usize> {
        let mut by = BTreeMap::new();
        for f in &self.faults {
            *by.entry(f.kind.as_str().to_owned()).or_insert(0) += 1;
        }
        for a in &self.admin {
            let kind = match a.what {
                AdminKind::Seats { .. } => "license_seats",
                AdminKind::Delete => "license_delete",
                AdminKind::Create { .. } => "license_create",
            };
            *by.entry(kind.to_owned()).or_insert(0) += 1;
        }
        by
    }
}
