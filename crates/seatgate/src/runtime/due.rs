//! The due index: when the reaper next has work on each license, so that a
//! pass reaps the licenses due instead of every license there is.
//!
//! A license is due (lua/includes/due.lua) at its oldest heartbeat plus its
//! heartbeat timeout while it has holders, at once while anyone waits in its
//! queue or a reply waits undelivered in its outbox, and never otherwise.
//! Every seat script reports that time with its outcome; the worker files it
//! with `ZADD … LT` in the pipeline of its replies and events (no round trip
//! of its own), and the reaper after reaping a license (lua/due_settle.lua).
//! `LT` only ever lowers a time, so the index holds, for every license with
//! seats, waiters or undelivered replies, a time no later than its real one:
//! an early time costs one reap call that finds nothing to do and files the
//! real time. The index is a ZSET per shard, `<prefix>:due:{i}`, sharded like
//! the streams: on Redis Cluster a seat script may touch its license's slot
//! only, so it never writes the index itself.
//!
//! A pass takes the licenses due off each shard, a page at a time
//! (lua/due_claim.lua), marking them claimed, so that a time a worker files
//! while a license is being reaped replaces the mark and is not lost when
//! the reaper files its own (the compare in lua/due_settle.lua).
//!
//! What a crash leaves out of the index (a worker dying between its script
//! and its pipeline, a license provisioned and used by calling the scripts
//! directly) the [`Sweep`] finds: each pass it looks at `reaper.sweep`
//! licenses of the license index, and at ten times as many keys of the
//! keyspace for license records written without the index (the documented
//! provisioning contract for billing systems is the hash alone), and files
//! any with seats, waiters or replies that the index lacks. Its walk over
//! the license index also counts every license's seats: the census the
//! reaper leader exports as metrics.

use redis::Value;
use tracing::debug;

use crate::config::Settings;
use crate::error::Error;
use crate::runtime::metrics::{Expiry, ExpiryCensus, LicenseSeats, SeatCensus};
use seatgate_core::db::Db;
use seatgate_core::keys::{shard_of, DueKeys, Keys};
use seatgate_core::license::Field;
use seatgate_core::protocol::valid_id;

/// The most members or keys one SSCAN or SCAN call of the sweep reads: each
/// call stays well under a millisecond of Redis time (`SCAN … MATCH …
/// COUNT 1000` over 5,000,000 keys took 1.1–2.6 ms on a 2-core machine).
const SWEEP_CALL: usize = 250;

/// The due index of one deployment: its shards and how a license is filed.
#[derive(Debug, Clone)]
pub struct DueIndex {
    /// Key names.
    keys: Keys,
    /// Shards, as of the streams (`stream.shards`).
    shards: usize,
}

impl DueIndex {
    /// The due index `settings` describe.
    pub fn new(settings: &Settings) -> DueIndex {
        DueIndex {
            keys: Keys::new(settings.keys.prefix.clone()),
            shards: settings.stream.shards,
        }
    }

    /// Every shard's keys.
    pub fn shards(&self) -> Vec<DueKeys> {
        (0..self.shards.max(1)).map(|i| self.keys.due_index(i)).collect()
    }

    /// The shard that files `license`.
    pub fn shard_for(&self, license: &str) -> DueKeys {
        self.keys.due_index(shard_of(license, self.shards))
    }

    /// `ZADD <stale index> <stale_ms> <license>`: files when the license's
    /// oldest holder goes stale, as a script reported it. Filed as it is,
    /// not compared: that time only moves later, so whichever report lands
    /// last is no later than the real time.
    pub fn file_stale(&self, license: &str, stale_ms: i64) -> redis::Cmd {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(self.shard_for(license).stale).arg(stale_ms).arg(license);
        zadd
    }

    /// `ZADD <due index> LT <due_ms> <license>`: files when the license next
    /// has other work, unless an earlier time is filed (or adds the license
    /// when it is missing).
    pub fn file_due(&self, license: &str, due_ms: i64) -> redis::Cmd {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(self.shard_for(license).due)
            .arg("LT")
            .arg(due_ms)
            .arg(license);
        zadd
    }
}

/// Where the sweep stands between passes.
#[derive(Debug, Default)]
pub struct Sweep {
    /// SSCAN cursor over the license index; 0 when a round starts.
    index_cursor: u64,
    /// The seats counted so far in this round over the license index.
    census: SeatCensus,
    /// The expiries of licenses outside the license index counted so far
    /// in this round over the keyspace.
    unindexed: ExpiryCensus,
    /// Those of the last complete round over the keyspace: what a census
    /// of the license index adds, so that a record written as its hash
    /// alone has its expiry series in every census, not only some.
    unindexed_done: Option<ExpiryCensus>,
    /// SCAN position in the keyspace, per node still to finish in this
    /// round (per master on a cluster, named by a slot it serves); empty
    /// when a round starts, and the nodes are looked up again.
    nodes: Vec<(Option<u16>, u64)>,
}

/// What one sweep step found.
#[derive(Debug, Default)]
pub struct SweepStep {
    /// The seats of every license of the license index looked at.
    pub seats: Vec<LicenseSeats>,
    /// Licenses looked at (in the index and in the keyspace).
    pub looked_at: usize,
    /// Licenses with seats, waiters or replies that the index lacked, now filed.
    pub filed: Vec<String>,
    /// This step ended a round over the license index: the census is whole.
    pub round_done: bool,
    /// The expiries of the licenses outside the license index looked at.
    unindexed: Vec<(String, Expiry)>,
}

impl Sweep {
    /// One bounded step: `budget` licenses of the license index and ten
    /// times as many keys of the keyspace. Licenses the due index lacks are
    /// filed due at `due_ms`.
    pub async fn step(
        &mut self,
        con: &mut Db,
        keys: &Keys,
        index: &DueIndex,
        budget: usize,
        due_ms: i64,
    ) -> Result<SweepStep, Error> {
        let mut step = SweepStep::default();
        self.walk_index(con, keys, index, budget, due_ms, &mut step)
            .await?;
        self.walk_keyspace(con, keys, index, budget.saturating_mul(10), due_ms, &mut step)
            .await?;
        Ok(step)
    }

    /// Counts `seats` (a step's, as the reaper leaves them, read when the
    /// Redis clock said `now_ms`) into the census of this round; returns the
    /// census when the round is over, with the expiries of the licenses
    /// outside the index (of the last complete round over the keyspace, or
    /// of the one under way before the first is).
    pub fn count(&mut self, seats: Vec<LicenseSeats>, round_done: bool, now_ms: i64) -> Option<SeatCensus> {
        for s in seats {
            self.census.add(s, now_ms);
        }
        if !round_done {
            return None;
        }
        let mut census = std::mem::take(&mut self.census);
        census.add_expiries(self.unindexed_done.as_ref().unwrap_or(&self.unindexed));
        Some(census)
    }

    /// The license index, `budget` members on from where the last step
    /// stopped. (SSCAN may return a member twice while the set is rehashed:
    /// such a license is counted twice in that census, nothing worse.)
    async fn walk_index(
        &mut self,
        con: &mut Db,
        keys: &Keys,
        index: &DueIndex,
        budget: usize,
        due_ms: i64,
        step: &mut SweepStep,
    ) -> Result<(), Error> {
        for _ in 0..budget.div_ceil(SWEEP_CALL) {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SSCAN")
                .arg(keys.license_index())
                .arg(self.index_cursor)
                .arg("COUNT")
                .arg(budget.min(SWEEP_CALL))
                .query_async(con)
                .await?;
            self.index_cursor = next;
            let batch: Vec<String> = batch.into_iter().filter(|l| valid_id(l)).collect();
            self.look(con, keys, index, &batch, due_ms, step).await?;
            if next == 0 {
                step.round_done = true;
                break;
            }
        }
        Ok(())
    }

    /// Reads the seats of each license of `batch` and whether the due index
    /// has it; files those it lacks that have work.
    async fn look(
        &self,
        con: &mut Db,
        keys: &Keys,
        index: &DueIndex,
        batch: &[String],
        due_ms: i64,
        step: &mut SweepStep,
    ) -> Result<(), Error> {
        const PER_LICENSE: usize = 9;
        let mut cmds = Vec::with_capacity(batch.len() * PER_LICENSE);
        for license in batch {
            let lk = keys.license(license);
            let [stale, due] = filed(index, license);
            let zcard = |key: &str| {
                let mut zcard = redis::cmd("ZCARD");
                zcard.arg(key);
                zcard
            };
            let mut total = redis::cmd("HGET");
            total.arg(&lk.license).arg(Field::SeatsTotal.as_str());
            let mut expires = redis::cmd("HGET");
            expires.arg(&lk.license).arg(Field::ExpiresAtMs.as_str());
            // Replies undelivered, or events not yet relayed (a cluster):
            // both work for the reaper.
            let mut outbox = redis::cmd("EXISTS");
            outbox.arg(&lk.outbox).arg(&lk.events.log);
            cmds.extend([
                stale,
                due,
                zcard(&lk.holders),
                zcard(&lk.queue),
                zcard(&lk.lingering),
                zcard(&lk.borrowed),
                total,
                outbox,
                expires,
            ]);
        }
        let answers = con.query_all(cmds).await?;
        let mut missing = Vec::new();
        for (license, a) in batch.iter().zip(answers.chunks(PER_LICENSE)) {
            let [Ok(stale), Ok(due), Ok(used), Ok(queued), Ok(lingering), Ok(borrowed), Ok(total), Ok(outbox), Ok(expires)] =
                a
            else {
                debug!(%license, "cannot read a license's seats; the next round looks again");
                continue;
            };
            let (used, queued, outbox) = (int(used), int(queued), int(outbox));
            let (lingering, borrowed) = (int(lingering), int(borrowed));
            let raw_total = text(total);
            // Seats or waits on a license whose record is gone (deleted
            // behind seatgate's back): due now, for reap.lua to end them,
            // whatever time the index holds (a holder who keeps
            // heartbeating would never make it due).
            let deleted = raw_total.is_none() && used + queued > 0;
            // As the scripts read it: a value that breaks the rule counts as no seats.
            let total = raw_total
                .and_then(|raw| Field::SeatsTotal.check(&raw).ok())
                .map_or(0, |n| i64::try_from(n).unwrap_or(0));
            // As the scripts read it: a value that breaks the rule is LICENSE_INVALID.
            let expiry = Expiry::read(text(expires).as_deref());
            step.looked_at += 1;
            step.seats.push(LicenseSeats {
                license: license.clone(),
                used,
                total,
                queued,
                lingering,
                borrowed,
                expiry,
            });
            if deleted || lacks(stale, due, used > 0, queued + outbox + lingering + borrowed > 0) {
                missing.push(license.clone());
            }
        }
        self.file(con, index, missing, due_ms, step).await
    }

    /// The keyspace of every node, `budget` keys on from where the last step
    /// stopped, for license records not in the license index.
    async fn walk_keyspace(
        &mut self,
        con: &mut Db,
        keys: &Keys,
        index: &DueIndex,
        budget: usize,
        due_ms: i64,
        step: &mut SweepStep,
    ) -> Result<(), Error> {
        if self.nodes.is_empty() {
            self.nodes = con.key_nodes().await?.into_iter().map(|n| (n, 0)).collect();
        }
        let pattern = format!("{}:{{*}}:license", glob_escape(keys.prefix()));
        for _ in 0..budget.div_ceil(SWEEP_CALL) {
            let Some(&(node, cursor)) = self.nodes.first() else {
                break;
            };
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(budget.min(SWEEP_CALL));
            let (next, found): (u64, Vec<String>) =
                redis::from_redis_value(con.on_node(node, scan).await?).map_err(redis::RedisError::from)?;
            if next == 0 {
                self.nodes.remove(0);
            } else if let Some(at) = self.nodes.first_mut() {
                at.1 = next;
            }
            let licenses: Vec<String> = found
                .iter()
                .filter_map(|key| license_of_record(keys.prefix(), key))
                .collect();
            self.look_unindexed(con, keys, index, &licenses, due_ms, step)
                .await?;
            for (license, expiry) in step.unindexed.drain(..) {
                self.unindexed.add(&license, expiry, due_ms);
            }
            if self.nodes.is_empty() {
                self.unindexed_done = Some(std::mem::take(&mut self.unindexed));
                break;
            }
        }
        Ok(())
    }

    /// Of `licenses` (found by their records), those outside the license
    /// index: whether the due index has them, and whether they have work.
    async fn look_unindexed(
        &self,
        con: &mut Db,
        keys: &Keys,
        index: &DueIndex,
        licenses: &[String],
        due_ms: i64,
        step: &mut SweepStep,
    ) -> Result<(), Error> {
        let members = licenses
            .iter()
            .map(|l| {
                let mut ismember = redis::cmd("SISMEMBER");
                ismember.arg(keys.license_index()).arg(l);
                ismember
            })
            .collect();
        let members = con.query_all(members).await?;
        // The walk over the license index looks at its members.
        let outside: Vec<&String> = licenses
            .iter()
            .zip(members)
            .filter(|(_, m)| matches!(m, Ok(Value::Int(0))))
            .map(|(l, _)| l)
            .collect();
        const PER_LICENSE: usize = 5;
        let mut cmds = Vec::with_capacity(outside.len() * PER_LICENSE);
        for license in &outside {
            let lk = keys.license(license);
            let [stale, due] = filed(index, license);
            let mut held = redis::cmd("EXISTS");
            held.arg(&lk.holders);
            let mut work = redis::cmd("EXISTS");
            work.arg(&lk.queue)
                .arg(&lk.outbox)
                .arg(&lk.events.log)
                .arg(&lk.lingering)
                .arg(&lk.borrowed);
            let mut expires = redis::cmd("HGET");
            expires.arg(&lk.license).arg(Field::ExpiresAtMs.as_str());
            cmds.extend([stale, due, held, work, expires]);
        }
        let answers = con.query_all(cmds).await?;
        let mut missing = Vec::new();
        for (license, a) in outside.iter().zip(answers.chunks(PER_LICENSE)) {
            step.looked_at += 1;
            if let [Ok(stale), Ok(due), Ok(held), Ok(work), Ok(expires)] = a {
                if lacks(stale, due, int(held) > 0, int(work) > 0) {
                    missing.push((*license).clone());
                }
                step.unindexed
                    .push(((*license).clone(), Expiry::read(text(expires).as_deref())));
            }
        }
        self.file(con, index, missing, due_ms, step).await
    }

    /// Files `missing` due at `due_ms` (in the due index: the reaper then
    /// files its stale time as it finds it).
    async fn file(
        &self,
        con: &mut Db,
        index: &DueIndex,
        missing: Vec<String>,
        due_ms: i64,
        step: &mut SweepStep,
    ) -> Result<(), Error> {
        if missing.is_empty() {
            return Ok(());
        }
        let cmds = missing.iter().map(|l| index.file_due(l, due_ms)).collect();
        for (license, result) in missing.iter().zip(con.query_all(cmds).await?) {
            if let Err(e) = result {
                debug!(%license, error = %e, "cannot file a license in the due index; the next round tries again");
            }
        }
        step.filed.extend(missing);
        Ok(())
    }
}

/// `ZSCORE` of `license` in both indexes of its shard.
fn filed(index: &DueIndex, license: &str) -> [redis::Cmd; 2] {
    let shard = index.shard_for(license);
    [shard.stale, shard.due].map(|key| {
        let mut zscore = redis::cmd("ZSCORE");
        zscore.arg(key).arg(license);
        zscore
    })
}

/// Whether a license (`stale`, `due`: its ZSCOREs in the index) lacks a
/// time it needs: one for its holders, one for its waiters, undelivered
/// replies, lingering or borrowed seats.
fn lacks(stale: &Value, due: &Value, held: bool, work: bool) -> bool {
    (held && *stale == Value::Nil) || (work && *due == Value::Nil)
}

/// A string answer (`None` for nil or anything else).
fn text(v: &Value) -> Option<String> {
    redis::from_redis_value::<Option<String>>(v.clone())
        .ok()
        .flatten()
}

/// An integer answer (0 for anything else).
fn int(v: &Value) -> i64 {
    match v {
        Value::Int(n) => *n,
        _ => 0,
    }
}

/// `text` with the glob characters of SCAN MATCH escaped.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The license whose record is `key` (`<prefix>:{<license>}:license`).
fn license_of_record(prefix: &str, key: &str) -> Option<String> {
    let license = key
        .strip_prefix(prefix)?
        .strip_prefix(":{")?
        .strip_suffix("}:license")?;
    valid_id(license).then(|| license.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_key_names_its_license_and_nothing_else() {
        let keys = Keys::new("seat");
        let record = keys.license("acme-pro").license;
        assert_eq!(license_of_record("seat", &record).as_deref(), Some("acme-pro"));
        assert_eq!(license_of_record("seat", "seat:{a}b}:license"), None);
        assert_eq!(license_of_record("seat", "other:{a}:license"), None);
        assert_eq!(license_of_record("seat", "seat:{}:license"), None);
        assert_eq!(glob_escape("s*a?t[1]\\"), "s\\*a\\?t\\[1\\]\\\\");
    }

    #[test]
    fn a_license_is_filed_in_its_shard() {
        let mut settings = Settings::load(None).unwrap();
        settings.stream.shards = 4;
        let index = DueIndex::new(&settings);
        let args = |cmd: redis::Cmd| -> Vec<String> {
            cmd.args_iter()
                .map(|a| match a {
                    redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                    _ => String::new(),
                })
                .collect()
        };
        // crc32("acme") % 4 == 2, as for the requests stream.
        assert_eq!(
            args(index.file_due("acme", 1_796_000_000_000)),
            ["ZADD", "seat:due:{2}", "LT", "1796000000000", "acme"]
        );
        assert_eq!(
            args(index.file_stale("acme", 1_796_000_090_001)),
            ["ZADD", "seat:stale:{2}", "1796000090001", "acme"]
        );
        assert_eq!(index.shards().len(), 4);
        settings.stream.shards = 1;
        assert_eq!(DueIndex::new(&settings).shards()[0].due, "seat:due:{0}");
    }
}
