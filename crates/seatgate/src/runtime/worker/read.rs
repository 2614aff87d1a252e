//! Reading one shard through lua/read.lua (new or own pending entries, or
//! claimed ones), delivery counts, and parsing the replies into [`Entry`]s.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use redis::Value;

use super::ShardWorker;
use crate::error::Error;
use seatgate_core::scripts::{ReadFrom, ReadPage, Scripts};

/// Where a batch came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// New entries (`>`): first delivery.
    New,
    /// This consumer's own pending entries (`0`): redeliveries.
    OwnPending,
    /// Entries claimed from another consumer: redeliveries.
    Claimed,
}

/// One stream entry; `fields` is `None` when the entry was deleted while pending.
#[derive(Debug)]
pub(super) struct Entry {
    /// The stream entry id.
    pub(super) id: String,
    /// Field/value pairs, values as raw bytes for the validator to judge.
    pub(super) fields: Option<Vec<(String, Vec<u8>)>>,
    /// Times delivered, this one included (1 for new entries).
    pub(super) deliveries: u64,
}

/// How soon a read with nothing new looks again, the first time.
pub(super) const FIRST_POLL: Duration = Duration::from_millis(1);

/// Where XAUTOCLAIM starts a sweep of the pending list, and the cursor it
/// returns once a sweep has reached the end.
pub(super) const SWEEP_START: &str = "0-0";

impl Entry {
    /// The time part of the entry id: the Redis clock at XADD, or whatever
    /// the caller chose (any u64, up to 18446744073709551615).
    pub(super) fn id_ms(&self) -> Option<u64> {
        self.id.split('-').next()?.parse().ok()
    }

    /// Time since the entry was added, on the Redis clock: `redis_now_ms`
    /// is the worker's estimate of it (decide.rs's `RedisClock`, the last
    /// Redis time seen carried on this host's monotonic clock), so a host
    /// whose own clock is off, or steps, measures right. Zero for an id
    /// ahead of it; `None` without an estimate.
    pub(super) fn age(&self, redis_now_ms: Option<u64>) -> Option<Duration> {
        let ms = self.id_ms()?;
        Some(Duration::from_millis(redis_now_ms?.saturating_sub(ms)))
    }
}

/// Whether a read failed because the stream or its group is gone (deleted,
/// or renamed aside as in the runbook of docs/failure-modes.md): the group is
/// created again and reading goes on, with no outage reported.
fn stream_gone(e: &redis::RedisError) -> bool {
    // A blocked XREADGROUP whose key is deleted or renamed is answered UNBLOCKED.
    matches!(e.code(), Some("NOGROUP" | "UNBLOCKED"))
}

impl ShardWorker {
    /// One read: new entries (`>`), our own pending ones (`0`), or entries
    /// claimed from consumers idle for `claim_idle_ms`. Every read goes
    /// through lua/read.lua, which hands an entry over the entry limits out
    /// as a small stub: no entry, however large, crosses to the worker whole.
    /// A script cannot block, so with nothing new the read waits for the
    /// stream's bell (doorbell.rs), or while the doorbell is down looks again
    /// after 1 ms, then 2, 4, … up to `stream.poll_ms`, until `block` has
    /// passed.
    pub(super) async fn read(&mut self, source: Source, block: Duration) -> Result<Vec<Entry>, Error> {
        if source == Source::Claimed {
            return self.claim().await;
        }
        let from = if source == Source::New {
            ReadFrom::New
        } else {
            ReadFrom::Pending
        };
        // Never past `stream.block_ms`, which bounds how long shutdown waits.
        let block = block.min(Duration::from_millis(self.settings.stream.block_ms.max(1)));
        let deadline = Instant::now() + block;
        loop {
            let reply = match self.read_page(from).await {
                Err(e) if stream_gone(&e) => {
                    self.prepare().await?;
                    return Ok(Vec::new());
                }
                other => other?,
            };
            let entries = parse_entries(reply);
            if !entries.is_empty() || source != Source::New {
                self.idle_poll = FIRST_POLL;
                return if source == Source::New {
                    Ok(entries)
                } else {
                    self.with_delivery_counts(entries).await
                };
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Vec::new());
            }
            if self.bell.is_up() {
                self.bell.wait(left).await;
            } else {
                tokio::time::sleep(self.idle_poll.min(left)).await;
                let most = Duration::from_millis(self.settings.stream.poll_ms.max(1));
                self.idle_poll = (self.idle_poll * 2).min(most);
            }
        }
    }

    /// One call of lua/read.lua on this shard.
    async fn read_page(&mut self, from: ReadFrom<'_>) -> redis::RedisResult<Value> {
        let s = &self.settings.stream;
        let page = ReadPage {
            stream: &self.stream,
            group: &s.group,
            consumer: &self.consumer,
            count: s.batch_size,
            max_entry_bytes: self.settings.limits.max_entry_bytes,
            from,
        };
        Scripts::get().read(&mut self.con, &page).await
    }

    /// One page of XAUTOCLAIM, continuing the sweep of the pending list where
    /// the previous page stopped. XAUTOCLAIM looks at most ten times COUNT
    /// pending entries per call, so restarting at `0-0` every time would
    /// never reach idle entries behind that many recently delivered ones.
    /// The cursor returns to `0-0` once a sweep reaches the end.
    async fn claim(&mut self) -> Result<Vec<Entry>, Error> {
        let cursor = self.claim_cursor.clone();
        let from = ReadFrom::Claim {
            min_idle_ms: self.settings.stream.claim_idle_ms,
            cursor: &cursor,
        };
        let parts = match self.read_page(from).await {
            Ok(Value::Array(parts)) => parts,
            Ok(_) => Vec::new(),
            Err(e) => {
                self.claim_cursor = SWEEP_START.to_owned();
                if stream_gone(&e) {
                    self.prepare().await?;
                    return Ok(Vec::new());
                }
                return Err(e.into());
            }
        };
        let mut parts = parts.into_iter();
        // [next cursor, claimed entries, ids deleted while pending (7.0+)]
        self.claim_cursor = parts
            .next()
            .and_then(|v| redis::from_redis_value::<String>(v).ok())
            .unwrap_or_else(|| SWEEP_START.to_owned());
        let entries = parts.next().map(parse_entries).unwrap_or_default();
        self.with_delivery_counts(entries).await
    }

    /// Whether the last claim page ended a sweep of the pending list.
    pub(super) fn sweep_done(&self) -> bool {
        self.claim_cursor == SWEEP_START
    }

    /// Fills in how often each (redelivered) entry has been delivered.
    async fn with_delivery_counts(&mut self, mut entries: Vec<Entry>) -> Result<Vec<Entry>, Error> {
        let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
            return Ok(entries);
        };
        let s = &self.settings.stream;
        let pending: Vec<(String, String, i64, u64)> = redis::cmd("XPENDING")
            .arg(&self.stream)
            .arg(&s.group)
            .arg(&first.id)
            .arg(&last.id)
            .arg(entries.len())
            .arg(&self.consumer)
            .query_async(&mut self.con)
            .await?;
        let counts: HashMap<String, u64> = pending.into_iter().map(|(id, _, _, n)| (id, n)).collect();
        for entry in &mut entries {
            // Read from a pending list, so delivered before even if XPENDING lost track.
            entry.deliveries = counts.get(&entry.id).copied().unwrap_or(2);
        }
        Ok(entries)
    }
}

/// Parses a list of `[id, [field, value, ...]]` entries without assuming
/// UTF-8 values: bad bytes must reach the validator (and be answered), not
/// fail the whole batch.
fn parse_entries(entries: Value) -> Vec<Entry> {
    let Value::Array(entries) = entries else {
        return Vec::new();
    };
    let mut out = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(mut pair) = entry else { continue };
        if pair.len() != 2 {
            continue;
        }
        let fields = pair.pop();
        let Some(id) = pair.pop().and_then(|v| redis::from_redis_value::<String>(v).ok()) else {
            continue;
        };
        let fields = match fields {
            Some(Value::Array(flat)) => {
                let mut pairs = Vec::with_capacity(flat.len() / 2);
                let mut it = flat.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    let key = bytes(k);
                    pairs.push((String::from_utf8_lossy(&key).into_owned(), bytes(v)));
                }
                Some(pairs)
            }
            _ => None,
        };
        out.push(Entry {
            id,
            fields,
            deliveries: 1,
        });
    }
    out
}

fn bytes(v: Value) -> Vec<u8> {
    match v {
        Value::BulkString(b) => b,
        Value::SimpleString(s) => s.into_bytes(),
        Value::Int(n) => n.to_string().into_bytes(),
        _ => Vec::new(),
    }
}
