//! Readiness: whether this process can serve requests now. The worker sets
//! it (Redis reachable and accepting writes), and so does a PING on a timer
//! with a deadline (a hung Redis, which leaves a blocked read waiting, is
//! caught there); `/ready` reports both, and says why it is not ready
//! ([`Readiness::reason`]): Redis out of memory (`OOM`, which the worker's
//! writes meet), Redis silent, or the worker not serving. The PING also
//! feeds `seatgate_redis_up`; every fifth tick also reads Redis's memory and
//! clock (`seatgate_clock_skew_seconds`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;

use crate::runtime::log_limit::LogLimit;
use crate::runtime::metrics;
use seatgate_core::db::Db;

/// `/ready`'s reason while Redis refuses this process's writes for lack of memory.
pub const OUT_OF_MEMORY: &str = "Redis refuses writes: OOM (used_memory above maxmemory, maxmemory-policy noeviction), raise maxmemory or free memory";
/// `/ready`'s reason while Redis does not answer the probe's PING in time.
pub const REDIS_SILENT: &str =
    "Redis does not answer PING within its deadline (hung, overloaded or unreachable)";
/// `/ready`'s reason while the worker does not serve (Redis unreachable or
/// refusing requests, the worker starting or stopping, a foreign library).
pub const NOT_SERVING: &str = "the worker is not serving requests (see its log)";

/// Shared readiness: the worker sets it while it can read its stream; the
/// probe ([`probe_redis`]) takes it away while Redis does not answer a
/// PING in time, and the worker's writes while Redis refuses them with
/// `OOM` ([`Readiness::out_of_memory`]).
#[derive(Debug, Clone)]
pub struct Readiness {
    serving: Arc<AtomicBool>,
    /// Set while the last PING went unanswered within its deadline.
    redis_silent: Arc<AtomicBool>,
    /// Set from a write Redis refused with `OOM` until a write succeeds.
    out_of_memory: Arc<AtomicBool>,
    /// The budget of the OOM lines (kind `redis_oom`): a Redis at the edge
    /// of its memory may refuse and accept writes many times a second.
    logs: Arc<LogLimit>,
}

impl Default for Readiness {
    /// As [`Readiness::new`] with `log.repeats_per_minute`'s default, 10.
    fn default() -> Readiness {
        Readiness::new(10)
    }
}

impl Readiness {
    /// Not ready yet; at most `repeats_per_minute` OOM lines a minute
    /// (`log.repeats_per_minute`, 0 = every change).
    pub fn new(repeats_per_minute: u32) -> Readiness {
        Readiness {
            serving: Arc::default(),
            redis_silent: Arc::default(),
            out_of_memory: Arc::default(),
            logs: Arc::new(LogLimit::per_minute(repeats_per_minute)),
        }
    }

    /// Marks the process ready (or not).
    pub fn set(&self, ready: bool) {
        self.serving.store(ready, Ordering::Relaxed);
    }

    /// Whether the process is ready: the worker serves, Redis answers and
    /// accepts its writes.
    pub fn get(&self) -> bool {
        self.reason().is_none()
    }

    /// A write of this process met Redis's `OOM` (`true`), or a write
    /// succeeded (`false`). A change is logged (one line naming Redis and
    /// OOM, under the `redis_oom` budget) and sets `seatgate_redis_oom`.
    pub fn out_of_memory(&self, oom: bool) {
        if self.out_of_memory.swap(oom, Ordering::Relaxed) == oom {
            return;
        }
        metrics::redis_oom(oom);
        if oom {
            crate::limited!(
                self.logs,
                "redis_oom",
                warn!(
                    "Redis is out of memory (OOM: used_memory above maxmemory) and refuses writes: requests wait, and /ready says not ready until a write succeeds; raise maxmemory or free memory"
                )
            );
        } else {
            crate::limited!(
                self.logs,
                "redis_oom",
                info!("Redis accepts writes again (out of memory no longer)")
            );
        }
    }

    /// Why the process is not ready, `None` when it is: the first of Redis
    /// silent, Redis out of memory, the worker not serving.
    pub fn reason(&self) -> Option<&'static str> {
        if self.redis_silent.load(Ordering::Relaxed) {
            Some(REDIS_SILENT)
        } else if self.out_of_memory.load(Ordering::Relaxed) {
            Some(OUT_OF_MEMORY)
        } else if !self.serving.load(Ordering::Relaxed) {
            Some(NOT_SERVING)
        } else {
            None
        }
    }
}

/// How often (in probe ticks) Redis's memory is read.
const MEMORY_EVERY_TICKS: u64 = 5;

/// Reads `used_memory` and `maxmemory` from `INFO memory` into their
/// gauges (one node; a Redis Cluster has no one memory to judge); on no
/// answer within `deadline`, leaves them as they were.
async fn read_memory(con: &mut Db, deadline: Duration) {
    let info = redis::cmd("INFO").arg("memory").to_owned();
    let Ok(Ok(text)) = tokio::time::timeout(deadline, info.query_async::<String>(con)).await else {
        return;
    };
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    if let (Some(used), Some(max)) = (field("used_memory"), field("maxmemory")) {
        metrics::redis_memory(used, max);
    }
}

/// Measures this host's clock against the Redis server's `TIME` into
/// `seatgate_clock_skew_seconds`: the server's time is taken for this
/// host's halfway through the round trip. On no answer within `deadline`,
/// leaves it as it was.
async fn read_clock_skew(con: &mut Db, deadline: Duration) {
    let (sent, started) = (SystemTime::now(), Instant::now());
    let time = redis::cmd("TIME").to_owned();
    let Ok(Ok((secs, micros))) = tokio::time::timeout(deadline, time.query_async::<(u64, u64)>(con)).await
    else {
        return;
    };
    let Ok(here) = (sent + started.elapsed() / 2).duration_since(UNIX_EPOCH) else {
        return;
    };
    let redis = Duration::from_secs(secs) + Duration::from_micros(micros);
    metrics::clock_skew(here.as_secs_f64() - redis.as_secs_f64());
}

/// Pings Redis every `every` until `shutdown`, each PING given `every` to
/// answer, recording whether it answered (`seatgate_redis_up`) and making
/// `ready` not ready while it does not: a Redis hung (stopped, swapping, a
/// long script) leaves the worker's blocked read waiting without an error,
/// and only a deadline notices. A Redis that answers but refuses writes is
/// up and yet not ready: the worker says so ([`Readiness::set`]).
pub async fn probe_redis(mut con: Db, every: Duration, ready: Readiness, shutdown: CancellationToken) {
    let mut tick: u64 = 0;
    loop {
        if tick % MEMORY_EVERY_TICKS == 0 {
            if !con.is_cluster() {
                read_memory(&mut con, every).await;
            }
            read_clock_skew(&mut con, every).await;
        }
        tick += 1;
        let ping = redis::cmd("PING");
        let up = matches!(
            tokio::time::timeout(every, ping.query_async::<String>(&mut con)).await,
            Ok(Ok(_))
        );
        metrics::redis_up(up);
        // A change is a silent Redis answering again, or the other way.
        let was_silent = ready.redis_silent.swap(!up, Ordering::Relaxed);
        if was_silent == up {
            if up {
                tracing::info!("redis answers PING again");
            } else {
                tracing::warn!(
                    deadline = ?every,
                    "redis did not answer PING in time (hung, overloaded or unreachable); /ready says not ready until it does"
                );
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
