//! Readiness: whether this process can serve requests now. The worker sets
//! it (Redis reachable and accepting writes); `/ready` reports it. And
//! whether Redis answers at all, probed on a timer for `seatgate_redis_up`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::runtime::metrics;
use seatgate_core::db::Db;

/// Shared readiness flag: the worker sets it while it can read its stream.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the process ready (or not).
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Relaxed);
    }

    /// Whether the process is ready.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Pings Redis every `every` until `shutdown`, recording whether it answered
/// (`seatgate_redis_up`). Separate from readiness: a Redis that answers but
/// refuses writes is up and yet not ready.
pub async fn probe_redis(mut con: Db, every: Duration, shutdown: CancellationToken) {
    loop {
        let ping = redis::cmd("PING");
        let up = matches!(
            tokio::time::timeout(every, ping.query_async::<String>(&mut con)).await,
            Ok(Ok(_))
        );
        metrics::redis_up(up);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
