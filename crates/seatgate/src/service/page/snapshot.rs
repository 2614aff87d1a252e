//! One snapshot of every license per refresh interval, shared by every
//! viewer of the page: Redis is read at most once per `http.page_refresh_ms`
//! whatever the number of viewers (and not at all while nobody looks).
//!
//! Single flight: the cache is a mutex held across the read, so viewers that
//! ask while a read is running wait for it and share its result instead of
//! starting reads of their own. A failed read is kept for the interval too,
//! so that a Redis in trouble is not asked again by every viewer.

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{self, StreamExt, TryStreamExt};
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::view::Summary;
use crate::config::HttpSettings;
use crate::error::Error;
use crate::views::status::{assemble, read_snapshot, Status};
use seatgate_core::db::Db;
use seatgate_core::keys::Keys;
use seatgate_core::protocol::valid_id;

/// Longest one snapshot may take; every viewer waiting on it then gets a
/// 503. Only one read runs at a time, so a slow one makes viewers wait but
/// never piles reads up: this is generous, for thousands of licenses on a
/// busy host (2,000 took 1 s in a debug build, and over 5 s with the whole
/// test suite running beside it).
pub const READ_TIMEOUT: Duration = Duration::from_secs(15);

/// Licenses read at once, each in its own MULTI, on the shared multiplexed
/// connection: the snapshot's round trips overlap, its commands are the
/// same as one at a time.
const READ_CONCURRENCY: usize = 16;

/// One read: the status and the summary's JSON, encoded once for every
/// viewer.
#[derive(Debug)]
pub struct Snapshot {
    /// Every license, as `seatgate status` reads it.
    pub status: Status,
    /// `/status.json`'s body.
    pub summary_json: String,
}

/// The last read, or why it failed, and when it ended.
struct Taken {
    /// When the read ended.
    at: Instant,
    /// What it gave: the snapshot, or one line for the page's banner.
    result: Result<Arc<Snapshot>, String>,
}

/// The page's data source: a cache of one [`Snapshot`] per interval.
pub struct Snapshots {
    /// The shared connection (cloned per license read: it multiplexes).
    db: Db,
    /// The key namespace.
    keys: Keys,
    /// How long a snapshot (or a failure) is served before the next read.
    refresh: Duration,
    /// Whether the JSON carries personal fields.
    personal: bool,
    /// The last read; held across a read, which makes reads single-flight.
    last: Mutex<Option<Taken>>,
}

impl Snapshots {
    /// A cache reading through `db` under `keys`, as `http` says.
    pub fn new(db: Db, keys: Keys, http: &HttpSettings) -> Snapshots {
        Snapshots {
            db,
            keys,
            refresh: Duration::from_millis(http.page_refresh_ms),
            personal: http.page_personal,
            last: Mutex::new(None),
        }
    }

    /// The refresh interval, ms, as the page's JSON tells it.
    pub fn refresh_ms(&self) -> u64 {
        u64::try_from(self.refresh.as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether personal fields are shown.
    pub fn personal(&self) -> bool {
        self.personal
    }

    /// The current snapshot: the last one if younger than the interval,
    /// else a new read (or the one running, if another viewer started it).
    pub async fn current(&self) -> Result<Arc<Snapshot>, String> {
        let mut last = self.last.lock().await;
        if let Some(taken) = last.as_ref().filter(|t| t.at.elapsed() < self.refresh) {
            return taken.result.clone();
        }
        let mut read = tokio::time::timeout(READ_TIMEOUT, self.read()).await;
        if let Ok(Err(e)) = &read {
            if e.is_broken_connection() {
                // The first command after Redis restarted meets the old,
                // dead connection; the connection manager has reconnected
                // by the next one. Once more, then the answer stands.
                tracing::debug!(error = %e, "status page: Redis connection broken; reading once more");
                read = tokio::time::timeout(READ_TIMEOUT, self.read()).await;
            }
        }
        let result = match read {
            Ok(Ok(status)) => self.encode(status).map(Arc::new),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "status page cannot read redis");
                Err(format!("cannot read status: {e}"))
            }
            Err(_) => Err(format!("redis did not answer within {READ_TIMEOUT:?}")),
        };
        *last = Some(Taken {
            at: Instant::now(),
            result: result.clone(),
        });
        result
    }

    /// Reads every indexed license, as `seatgate status` does (the same
    /// commands: `TIME`, `SMEMBERS`, one MULTI per license), a few at once.
    async fn read(&self) -> Result<Status, Error> {
        let mut con = self.db.clone();
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut con).await?;
        let mut ids: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.keys.license_index())
            .query_async(&mut con)
            .await?;
        ids.retain(|id| valid_id(id));
        ids.sort();
        let licenses = stream::iter(ids)
            .map(|id| {
                let mut con = self.db.clone();
                async move {
                    let snapshot = read_snapshot(&mut con, &self.keys, &id).await?;
                    Ok::<_, Error>(assemble(&id, &snapshot))
                }
            })
            .buffered(READ_CONCURRENCY)
            .try_collect()
            .await?;
        Ok(Status {
            at_ms: secs * 1000 + micros / 1000,
            licenses,
        })
    }

    /// `status` with its summary encoded, once for every viewer.
    fn encode(&self, status: Status) -> Result<Snapshot, String> {
        let summary = Summary::of(&status, self.refresh_ms(), self.personal);
        let summary_json =
            serde_json::to_string(&summary).map_err(|e| format!("cannot encode the status summary: {e}"))?;
        Ok(Snapshot { status, summary_json })
    }
}
