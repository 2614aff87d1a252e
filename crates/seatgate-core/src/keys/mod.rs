//! Key names: the only place seatgate builds a Redis key.
//!
//! Every key of one license carries the hash tag `{<license>}`, so that all
//! of them live in one Redis Cluster slot and one script may touch them all.
//! License ids are validated by [`crate::protocol`] (no braces), so the tag
//! cannot be broken by input.

mod topology;

pub use topology::{Topology, EVENTS_SHARDS};

/// Builds key names under one prefix (`seat` unless configured otherwise).
#[derive(Debug, Clone)]
pub struct Keys {
    /// The namespace all seatgate keys live under (reply streams too, in
    /// their own part of it, `replies.prefix`), so one ACL pattern covers them.
    prefix: String,
    /// Where the seat scripts record the events of a license.
    events: EventSinks,
}

/// Where the seat scripts record events (lua/includes/events.lua), and how
/// long the events shards keep them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct EventSinks {
    /// The events stream (the base name when sharded).
    base: String,
    /// Its shards.
    shards: usize,
    /// Into the license's own log, which the relay moves to the shard (a
    /// cluster: the shard lies in another slot than the license), rather
    /// than straight into the shard (one node).
    relayed: bool,
    /// `events.retention`, ms: how old an event the shard may trim.
    keep_ms: u64,
    /// `events.denials_window_ms`: the denial sampler's window, ms.
    denials_window_ms: u64,
    /// `events.denials_per_window`: denials per window recorded one by
    /// one (0 = every one).
    denials_per_window: u64,
    /// Where the request scripts write the queue replies their notes carry
    /// (one node only; `None`: into the outbox, for the worker to send).
    queue_replies: Option<QueueReplies>,
}

/// How the request scripts write a waiter's GRANTED or QUEUE_TIMEOUT
/// themselves, in the step that decides it (lua/includes/outbox.lua), as
/// the worker writes a reply (runtime::publish): on one Redis node only,
/// where the reply stream lies on the same server as the license. On a
/// cluster a script may not touch another slot's key, and the note goes
/// through the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueReplies {
    /// `replies.prefix`: a reply stream outside it is never written.
    pub prefix: String,
    /// `replies.ttl_ms`: replies younger than this are never trimmed.
    pub ttl_ms: u64,
    /// The idle expiry the reply stream gets, ms (the worker's: the ttl
    /// and half of it again).
    pub expiry_ms: u64,
}

/// The keys and arguments through which a seat script records a license's
/// events (the last three KEYS of each and two or four ARGV,
/// lua/includes/events.lua).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventKeys {
    /// The license id, which every event carries.
    pub license: String,
    /// STRING: the license's event counter (`seq`). Never deleted, so a
    /// license deleted and made again goes on counting.
    pub seq: String,
    /// STREAM: the license's own event log, `<prefix>:{L}:events`, where the
    /// scripts record on a cluster until the relay moves the entries on.
    pub log: String,
    /// The events stream shard the license's events end up in.
    pub shard: String,
    /// HASH on the shard's slot: license -> the `seq` of its last event the
    /// relay appended to the shard (lua/relay.lua): `<shard>:relayed`, or,
    /// for an unsharded stream, `<shard>:{<shard>}:relayed`, tagged with the
    /// shard's whole name so it hashes to the shard's slot.
    pub cursor: String,
    /// Where the scripts record: `shard` on one node, `log` on a cluster.
    pub target: String,
    /// How old an event (ms) the scripts may trim from `target` (0: they
    /// trim nothing; a relayed log is emptied by the relay instead).
    pub keep_ms: u64,
    /// HASH: the license's denial window ([`Keys::denials`]), through which
    /// the request scripts record a bounded number of `denied` events per
    /// window and the reaper flushes what they folded.
    pub denials: String,
    /// The denial window, ms (`events.denials_window_ms`).
    pub denials_window_ms: u64,
    /// Denials per window recorded one by one, 0 = every one
    /// (`events.denials_per_window`).
    pub denials_per_window: u64,
    /// Where the request scripts write queue replies themselves (one node),
    /// or `None`: into the outbox ([`QueueReplies`]).
    pub queue_replies: Option<QueueReplies>,
}

/// The keys of one license. A seat script is handed `license` (and
/// where its events go) and derives the others by the same names
/// (lua/includes/keys.lua; tests/it/scripts.rs checks they agree).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LicenseKeys {
    /// HASH: the license record (`seats_total`, `expires_at_ms`, `active`, ...).
    pub license: String,
    /// ZSET: session -> last heartbeat in ms; its cardinality is seats in use.
    pub holders: String,
    /// HASH: session -> session record (acquired_at, heartbeat count, metadata).
    pub sessions: String,
    /// ZSET: waiting session -> arrival number (FIFO order).
    pub queue: String,
    /// HASH: waiting session -> JSON waiter record (request id, reply_to, meta).
    pub waiters: String,
    /// ZSET (all scores 0): `<group>|<order>|<session>` of every waiter, so
    /// that a grant step passes over a group its limit blocks at once
    /// (lua/includes/queue.lua, policy.lua's fair_promote).
    pub queue_by_group: String,
    /// ZSET (all scores 0): `<group>|<user>|<order>|<session>` of every
    /// waiter, so that a grant step passes over a user its own limit blocks
    /// at once (lua/includes/queue.lua, policy.lua's fair_promote).
    pub queue_by_user: String,
    /// ZSET: waiting session -> time its wait runs out (ms).
    pub deadlines: String,
    /// ZSET: waiting session -> when it last showed it is alive (a waiter
    /// heartbeat, its acquire or a re-send) plus the heartbeat timeout (ms):
    /// past that the reaper takes it out of the queue (lua/includes/queue.lua).
    pub alive: String,
    /// STRING: arrival counter for the queue.
    pub queue_seq: String,
    /// HASH: note id -> GRANTED / QUEUE_TIMEOUT reply not yet delivered.
    pub outbox: String,
    /// HASH: seats held per user (`u:<user>`) and group (`g:<group>`), and
    /// the owner record of a session (`s:<session>`), for the policies.
    pub owners: String,
    /// ZSET: released session whose seat lingers -> when the linger ends (ms).
    pub lingering: String,
    /// ZSET: session holding a borrowed seat -> when the borrow ends (ms).
    pub borrowed: String,
    /// ZSET: revoked session -> when its revocation is forgotten (ms), so
    /// that its heartbeat hears SESSION_REVOKED for a bounded time.
    pub revoked: String,
    /// HASH: revoked session -> revocation record (reason, actor, cooldown),
    /// and `user|<user>` -> the record of a user-wide cooldown.
    pub revocations: String,
    /// HASH: user -> group, the license's group map (acquire's `K.groups`):
    /// when it exists, a request's group is its user's there.
    pub groups: String,
    /// Where the scripts record the license's events (not in [`LicenseKeys::all`]:
    /// the event counter outlives the license).
    pub events: EventKeys,
}

impl LicenseKeys {
    /// Every key of the license that lives as long as the license does
    /// (`license delete` removes them all): the record, the thirteen seat and
    /// queue keys, the two revocation keys and the group map.
    pub fn all(&self) -> [&str; 17] {
        [
            &self.license,
            &self.holders,
            &self.sessions,
            &self.queue,
            &self.waiters,
            &self.queue_by_group,
            &self.queue_by_user,
            &self.deadlines,
            &self.alive,
            &self.queue_seq,
            &self.outbox,
            &self.owners,
            &self.lingering,
            &self.borrowed,
            &self.revoked,
            &self.revocations,
            &self.groups,
        ]
    }
}

impl Keys {
    /// Keys under `prefix`.
    pub fn new(prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        Keys {
            events: EventSinks {
                base: format!("{prefix}:events"),
                shards: 1,
                relayed: false,
                keep_ms: 0,
                denials_window_ms: 60_000,
                denials_per_window: 0,
                queue_replies: None,
            },
            prefix,
        }
    }

    /// These keys, the events recorded into `base` (sharded `shards` ways),
    /// through each license's own log and the relay when `relayed` (a
    /// Redis Cluster), straight into the shard otherwise, kept `keep_ms` at least.
    pub fn with_events(mut self, base: &str, shards: usize, relayed: bool, keep_ms: u64) -> Self {
        self.events = EventSinks {
            base: base.to_owned(),
            shards,
            relayed,
            keep_ms,
            ..self.events
        };
        self
    }

    /// These keys, the request scripts recording at most `per_window`
    /// denials of a license per `window_ms` as events of their own and
    /// folding the rest into a count (0 = every one recorded;
    /// lua/includes/denial_sample.lua).
    pub fn with_denials(mut self, window_ms: u64, per_window: u64) -> Self {
        self.events.denials_window_ms = window_ms.max(1);
        self.events.denials_per_window = per_window;
        self
    }

    /// These keys, the request scripts writing the queue replies of their
    /// notes themselves (one Redis node; [`QueueReplies`]).
    pub fn with_queue_replies(mut self, replies: QueueReplies) -> Self {
        self.events.queue_replies = Some(replies);
        self
    }

    /// Whether the scripts record events into the licenses' own logs, for
    /// the relay to move on (a cluster).
    pub fn events_relayed(&self) -> bool {
        self.events.relayed
    }

    /// How long the events shards keep events at least, ms.
    pub fn events_keep_ms(&self) -> u64 {
        self.events.keep_ms
    }

    /// Where `license`'s events are recorded and end up.
    pub fn event_keys(&self, license: &str) -> EventKeys {
        let p = &self.prefix;
        let e = &self.events;
        let log = format!("{p}:{{{license}}}:events");
        let shard = shard_name(&e.base, e.shards, license);
        EventKeys {
            license: license.to_owned(),
            seq: format!("{p}:{{{license}}}:event_seq"),
            target: if e.relayed { log.clone() } else { shard.clone() },
            keep_ms: if e.relayed { 0 } else { e.keep_ms },
            cursor: if shard.contains('{') {
                format!("{shard}:relayed")
            } else {
                format!("{shard}:{{{shard}}}:relayed")
            },
            log,
            shard,
            denials: self.denials(license),
            denials_window_ms: e.denials_window_ms,
            denials_per_window: e.denials_per_window,
            queue_replies: e.queue_replies.clone(),
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
            queue: format!("{p}:{{{license}}}:queue"),
            waiters: format!("{p}:{{{license}}}:waiters"),
            queue_by_group: format!("{p}:{{{license}}}:queue_by_group"),
            queue_by_user: format!("{p}:{{{license}}}:queue_by_user"),
            deadlines: format!("{p}:{{{license}}}:deadlines"),
            alive: format!("{p}:{{{license}}}:alive"),
            queue_seq: format!("{p}:{{{license}}}:queue_seq"),
            outbox: format!("{p}:{{{license}}}:outbox"),
            owners: format!("{p}:{{{license}}}:owners"),
            lingering: format!("{p}:{{{license}}}:lingering"),
            borrowed: format!("{p}:{{{license}}}:borrowed"),
            revoked: format!("{p}:{{{license}}}:revoked"),
            revocations: format!("{p}:{{{license}}}:revocations"),
            groups: format!("{p}:{{{license}}}:groups"),
            events: self.event_keys(license),
        }
    }

    /// HASH of replies given to the stream entries of `license` added in dedupe
    /// time bucket `bucket` (entry ms / window), so a redelivered entry gets
    /// the same reply. The bucket comes from the entry id (the Redis clock at
    /// XADD), so every delivery of one entry looks in the same key.
    pub fn dedupe(&self, license: &str, bucket: u64) -> String {
        format!("{}:{{{license}}}:done:{bucket}", self.prefix)
    }

    /// STRING counting `session`'s recent requests (rate limiting,
    /// lua/includes/rate_limit.lua). Not the `rate:` name of the ZSET
    /// windows before it: during a rolling upgrade the two kinds of worker
    /// must not meet each other's keys, of another type.
    pub fn session_rate(&self, license: &str, session: &str) -> String {
        format!("{}:{{{license}}}:hits:{session}", self.prefix)
    }

    /// STRING counting the license's recent requests (rate limiting).
    pub fn license_rate(&self, license: &str) -> String {
        format!("{}:{{{license}}}:hits", self.prefix)
    }

    /// STRING counting the invalid requests read from `application`'s
    /// requests streams (`None`: the shared `stream.requests`) in the current
    /// window of `limits.window_ms` (it expires with the window), the
    /// budget of `limits.invalid_requests` (runtime::worker::settle). Any
    /// slot: it is counted on its own, never inside a seat script.
    pub fn invalid_budget(&self, application: Option<&str>) -> String {
        match application {
            Some(app) => format!("{}:invalid:app:{app}", self.prefix),
            None => format!("{}:invalid", self.prefix),
        }
    }

    /// HASH `at` -> when `license` was last deleted (ms), expiring a day
    /// later (lua/includes/deleted.lua): a heartbeat or release of a
    /// session of a license without a record says `license_deleted` while
    /// it is there. In the license's slot, not in [`LicenseKeys::all`]: it
    /// outlives the license.
    pub fn deleted(&self, license: &str) -> String {
        format!("{}:{{{license}}}:deleted", self.prefix)
    }

    /// HASH of `license`'s denial window (lua/includes/denial_sample.lua):
    /// which denials go to the events stream one by one and how many were
    /// folded into a count. In the license's slot, for its seat scripts.
    pub fn denials(&self, license: &str) -> String {
        format!("{}:{{{license}}}:denials", self.prefix)
    }

    /// SET of every provisioned license id, so `license list` (and the reaper)
    /// find licenses without SCAN. It is written beside the license record,
    /// never inside a seat script, so it may live in any cluster slot.
    pub fn license_index(&self) -> String {
        format!("{}:licenses", self.prefix)
    }

    /// The two ZSETs of shard `shard` of the due index, which tell the
    /// reaper when each license next needs it, so a pass reaps the licenses
    /// due and no others (runtime::due). Each shard's keys share the hash tag
    /// `{<shard>}` (also when there is one shard), so one script reads both,
    /// and on Redis Cluster the shards spread over the masters. Only the
    /// worker and the reaper write them, never a seat script, which may
    /// touch its license's slot only. A license is filed in shard
    /// [`shard_of`] it, like its streams.
    pub fn due_index(&self, shard: usize) -> DueKeys {
        DueKeys {
            stale: format!("{}:stale:{{{shard}}}", self.prefix),
            due: format!("{}:due:{{{shard}}}", self.prefix),
        }
    }

    /// HASH of settings every process of a deployment must agree on, kept by
    /// the workers and read by clients: the [`Topology`] (`shards`, the
    /// requests stream's shard count, docs/protocol.md, "Shards"; the
    /// streams and the reply namespace). A worker started with another
    /// `stream.shards` than the one recorded refuses to run.
    pub fn deployment(&self) -> String {
        format!("{}:config", self.prefix)
    }

    /// Stream of seat events (acquired, released, evicted, queued, granted, ...).
    pub fn events(&self) -> String {
        format!("{}:events", self.prefix)
    }

    /// HASH of `license`'s daily usage rollups (views::rollup): a field per
    /// UTC day (`2026-11-01`) and a `carry` field (what was held at the end
    /// of the last day rolled up). Under the license's hash tag, like its
    /// other keys, so it lives in the license's slot on a cluster.
    pub fn rollup(&self, license: &str) -> String {
        format!("{}:{{{license}}}:rollup", self.prefix)
    }

    /// HASH license -> the last UTC day rolled up for it: every license with
    /// rollups, deleted ones too (the license index forgets those), so a
    /// yearly report finds them.
    pub fn rollup_index(&self) -> String {
        format!("{}:rollups", self.prefix)
    }

    /// STRING: the last UTC day (unix ms of its start) rolled up for every
    /// license, and the `SET NX PX` lock that lets one process roll up.
    pub fn rollup_done(&self) -> String {
        format!("{}:rollup:done", self.prefix)
    }

    /// See [`Keys::rollup_done`].
    pub fn rollup_lock(&self) -> String {
        format!("{}:rollup:lock", self.prefix)
    }

    /// Lock key that lets one process run each reaper pass while others skip it.
    pub fn reaper_lock(&self) -> String {
        format!("{}:reaper:lock", self.prefix)
    }

    /// HASH of the reaper's clock, next to its lock: `last_pass` (Redis ms
    /// of the end of the last pass), `period_ms` (the schedule's period as
    /// the leader saw it), `resumed_at` and `gap_ms` (when service last
    /// resumed after a gap, and how long the gap was). The outage rule
    /// (runtime::reaper, lua/reap.lua) reads it.
    pub fn reaper_clock(&self) -> String {
        format!("{}:reaper:clock", self.prefix)
    }
}

/// The keys of one shard of the due index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueKeys {
    /// ZSET license -> when its oldest holder goes stale (its heartbeat plus
    /// the heartbeat timeout, plus 1 ms). It only moves later while the
    /// license has holders, so any script's report of it may be filed as it
    /// is, whatever order the filings arrive in.
    pub stale: String,
    /// ZSET license -> when it next has other work: at once while anyone
    /// waits or a reply sits undelivered. Filed with `ZADD … LT` only: a
    /// later report must never hide an earlier one.
    pub due: String,
}

/// Which of `shards` shards serves `license`: CRC-32 (IEEE, as zlib's
/// crc32) of the license id, modulo the shard count. Any client can compute it.
pub fn shard_of(license: &str, shards: usize) -> usize {
    if shards <= 1 {
        return 0;
    }
    (crc32fast::hash(license.as_bytes()) as usize) % shards
}

/// Every shard of stream `base` sharded `shards` ways (`base` itself when unsharded).
pub fn shard_names(base: &str, shards: usize) -> Vec<String> {
    if shards <= 1 {
        return vec![base.to_owned()];
    }
    (0..shards).map(|i| format!("{base}:{{{i}}}")).collect()
}

/// STRING that says consumer `consumer` of `group` is alive on requests
/// stream (shard) `stream`: its read loop keeps it with a short PX, and the
/// reaper never removes a consumer whose key exists. A shard's key carries the
/// shard's hash tag; either way it is read by a command of its own, never
/// inside a script, so on a cluster it may live in any slot.
pub fn consumer_alive(stream: &str, group: &str, consumer: &str) -> String {
    format!("{stream}:alive:{group}:{consumer}")
}

/// The shard of stream `base` (sharded `shards` ways) that carries `license`.
pub fn shard_name(base: &str, shards: usize, license: &str) -> String {
    if shards <= 1 {
        return base.to_owned();
    }
    format!("{base}:{{{}}}", shard_of(license, shards))
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
    fn a_due_index_shard_is_one_slot() {
        let keys = Keys::new("seat");
        let shard = keys.due_index(2);
        assert_eq!(
            (shard.stale.as_str(), shard.due.as_str()),
            ("seat:stale:{2}", "seat:due:{2}")
        );
        assert_eq!(keys.due_index(0).due, "seat:due:{0}", "tagged with one shard too");
        assert_eq!(keys.deployment(), "seat:config");
    }

    #[test]
    fn a_liveness_key_lies_under_its_shard_and_its_hash_tag() {
        let key = consumer_alive("seat:requests:{3}", "seatgate", "host-42");
        assert_eq!(key, "seat:requests:{3}:alive:seatgate:host-42");
        let refused = crate::request::parse_request(
            "1-0",
            &[
                ("op".to_owned(), b"release".to_vec()),
                ("license".to_owned(), b"acme".to_vec()),
                ("session".to_owned(), b"s1".to_vec()),
                ("reply_to".to_owned(), key.into_bytes()),
            ],
            &crate::protocol::Rules::new("seat:reply:"),
        );
        assert_eq!(
            refused.err().map(|i| i.field),
            Some("reply_to"),
            "no reply_to can name it: it lies outside the reply namespace"
        );
    }
}
