//! The reply reader: one task per client, blocked on the client's reply
//! stream, handing each reply to the waiter of its request id.
//!
//! It reads on a connection of its own from [`Db::connect_blocking`]: an
//! `XREAD BLOCK` must not share a connection with a response timeout shorter
//! than the block (the reply would be dropped while the server still sends
//! it), nor hold up the requests pipelined on the shared connection. When a
//! read fails (Redis restarting, a failover) it reconnects with backoff and
//! reads on from the last entry it read, so no reply written meanwhile is
//! missed; waiters keep waiting, each until its own timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::streams::{StreamId, StreamReadReply};
use tokio_util::sync::CancellationToken;

use super::reply::Reply;
use super::waiters::Waiters;
use seatgate_core::db::Db;
use seatgate_core::db::RedisSettings;
use seatgate_core::error::Error;

/// How long one XREAD blocks. The reader is stopped by its cancellation
/// token, not by the block running out, so this only bounds how long a
/// quiet connection goes unchecked.
pub(crate) const READ_BLOCK: Duration = Duration::from_secs(5);

/// How much longer than the block a read may take before the connection is
/// taken for dead (a peer gone without a reset never answers).
const READ_SLACK: Duration = Duration::from_secs(5);

/// Most replies taken per read.
const READ_COUNT: usize = 500;

/// First and longest pause between failed reads.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// How long the reader tries to delete the reply stream when it stops.
const CLEANUP: Duration = Duration::from_secs(2);

/// Counters the reader keeps for [`super::Client::stats`].
#[derive(Debug, Default)]
pub(crate) struct ReaderCounters {
    /// Connections opened after a failed read.
    pub reconnects: AtomicU64,
}

/// One client's reply reader.
pub(crate) struct Reader {
    /// How to reach Redis again after a failure.
    pub redis: RedisSettings,
    /// The reply stream read.
    pub reply_to: String,
    /// Where replies go.
    pub waiters: Arc<Waiters>,
    /// Its counters, shared with the client.
    pub counters: Arc<ReaderCounters>,
}

impl Reader {
    /// Reads replies on `con` until `stop`, then ends every wait and deletes
    /// the reply stream through `cleanup` (best effort: a request still
    /// queued may answer later and create it again; it then expires after
    /// `replies.ttl_ms`).
    pub(crate) async fn run(self, con: Db, cleanup: Db, stop: CancellationToken) -> Result<(), Error> {
        let mut con = Some(con);
        // The stream is this client's alone and new: everything on it is ours.
        let mut last = "0".to_owned();
        let mut backoff = RETRY_FIRST;
        let mut failing = false;
        loop {
            let read = tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                read = self.read(&mut con, &last) => read,
            };
            match read {
                Ok(entries) => {
                    if failing {
                        tracing::info!(reply_to = %self.reply_to, "reading replies again");
                        failing = false;
                        backoff = RETRY_FIRST;
                    }
                    for entry in entries {
                        last.clone_from(&entry.id);
                        self.waiters.deliver(Reply::from_entry(entry));
                    }
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(reply_to = %self.reply_to, error = %e, "cannot read replies; retrying from the last one read");
                        failing = true;
                    }
                    con = None;
                    tokio::select! {
                        biased;
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(RETRY_MAX);
                }
            }
        }
        self.waiters.close();
        delete(cleanup, &self.reply_to).await
    }

    /// One blocking read after `last`, connecting first if `con` is gone.
    async fn read(&self, con: &mut Option<Db>, last: &str) -> Result<Vec<StreamId>, Error> {
        let con = match con {
            Some(con) => con,
            None => {
                let fresh = Db::connect_blocking(&self.redis, READ_BLOCK).await?;
                self.counters.reconnects.fetch_add(1, Ordering::Relaxed);
                con.insert(fresh)
            }
        };
        let mut xread = redis::cmd("XREAD");
        xread
            .arg("COUNT")
            .arg(READ_COUNT)
            .arg("BLOCK")
            .arg(READ_BLOCK.as_millis() as u64)
            .arg("STREAMS")
            .arg(&self.reply_to)
            .arg(last);
        let read: StreamReadReply = tokio::time::timeout(READ_BLOCK + READ_SLACK, xread.query_async(con))
            .await
            .map_err(|_| {
                Error::Client(format!(
                    "no answer to a {READ_BLOCK:?} XREAD BLOCK within {READ_SLACK:?} more"
                ))
            })??;
        Ok(read.keys.into_iter().flat_map(|key| key.ids).collect())
    }
}

/// Deletes `reply_to`, giving up after [`CLEANUP`].
async fn delete(mut con: Db, reply_to: &str) -> Result<(), Error> {
    let mut del = redis::cmd("DEL");
    del.arg(reply_to);
    match tokio::time::timeout(CLEANUP, del.query_async::<i64>(&mut con)).await {
        Ok(done) => done.map(drop).map_err(Error::from),
        Err(_) => Err(Error::Client(format!(
            "could not delete reply stream {reply_to} within {CLEANUP:?}"
        ))),
    }
}
