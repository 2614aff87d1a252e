//! Reading one shard: XREADGROUP (new or own pending entries), XAUTOCLAIM,
//! delivery counts, and parsing the replies into [`Entry`]s.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::Value;

use super::ShardWorker;
use crate::error::Error;
use seatgate_core::db::Db;

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

/// Where XAUTOCLAIM starts a sweep of the pending list, and the cursor it
/// returns once a sweep has reached the end.
pub(super) const SWEEP_START: &str = "0-0";

impl Entry {
    /// The time part of the entry id: the Redis clock at XADD, or whatever
    /// the caller chose (any u64, up to 18446744073709551615).
    pub(super) fn id_ms(&self) -> Option<u64> {
        self.id.split('-').next()?.parse().ok()
    }

    /// Time since the entry was added; zero for an id ahead of the clock.
    pub(super) fn age(&self) -> Option<Duration> {
        let ms = self.id_ms()?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_millis();
        let now = u64::try_from(now).unwrap_or(u64::MAX);
        Some(Duration::from_millis(now.saturating_sub(ms)))
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
    /// claimed from consumers idle for `claim_idle_ms`.
    pub(super) async fn read(&mut self, source: Source, block: Duration) -> Result<Vec<Entry>, Error> {
        if source == Source::Claimed {
            return self.claim().await;
        }
        let s = &self.settings.stream;
        let reader = match self.reader.take() {
            Some(reader) => reader,
            None => {
                let block = Duration::from_millis(self.settings.stream.block_ms);
                Db::connect_blocking(&self.settings.redis, block).await?
            }
        };
        let reader = self.reader.insert(reader);
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&s.group)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(s.batch_size);
        if source == Source::New {
            let block_ms = (block.as_millis() as u64).clamp(1, s.block_ms.max(1));
            cmd.arg("BLOCK").arg(block_ms);
        }
        cmd.arg("STREAMS")
            .arg(&self.stream)
            .arg(if source == Source::New { ">" } else { "0" });
        let reply: Value = match cmd.query_async(reader).await {
            Err(e) if stream_gone(&e) => {
                self.prepare().await?;
                return Ok(Vec::new());
            }
            other => other?,
        };
        let entries = parse_read_reply(reply);
        if source == Source::New {
            Ok(entries)
        } else {
            self.with_delivery_counts(entries).await
        }
    }

    /// One page of XAUTOCLAIM, continuing the sweep of the pending list where
    /// the previous page stopped. XAUTOCLAIM looks at most ten times COUNT
    /// pending entries per call, so restarting at `0-0` every time would
    /// never reach idle entries behind that many recently delivered ones.
    /// The cursor returns to `0-0` once a sweep reaches the end.
    async fn claim(&mut self) -> Result<Vec<Entry>, Error> {
        let s = &self.settings.stream;
        let reply: redis::RedisResult<Value> = redis::cmd("XAUTOCLAIM")
            .arg(&self.stream)
            .arg(&s.group)
            .arg(&self.consumer)
            .arg(s.claim_idle_ms)
            .arg(&self.claim_cursor)
            .arg("COUNT")
            .arg(s.batch_size)
            .query_async(&mut self.con)
            .await;
        let parts = match reply {
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

/// Parses an XREADGROUP reply without assuming UTF-8 values: bad bytes must
/// reach the validator (and be answered), not fail the whole batch.
fn parse_read_reply(reply: Value) -> Vec<Entry> {
    let streams = match reply {
        Value::Array(streams) => streams,
        Value::Map(pairs) => pairs.into_iter().map(|(k, v)| Value::Array(vec![k, v])).collect(),
        _ => return Vec::new(),
    };
    let mut out = Vec::new();
    for stream in streams {
        let Value::Array(mut parts) = stream else { continue };
        if let Some(entries) = parts.pop() {
            out.extend(parse_entries(entries));
        }
    }
    out
}

/// Parses a list of `[id, [field, value, ...]]` entries.
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
