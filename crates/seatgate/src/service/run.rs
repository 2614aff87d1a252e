//! `seatgate run`: the worker, the HTTP endpoint and graceful shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio_cron_scheduler::{Job, JobScheduler};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{PageAt, Settings};
use crate::error::Error;
use crate::runtime::health::{self, Readiness};
use crate::runtime::reaper::{self, Reaper};
use crate::runtime::worker::Worker;
use crate::service::http;
use crate::service::http::PageRoutes;
use crate::service::page::Snapshots;
use crate::service::telemetry;
use crate::views::rollup;
use seatgate_core::keys::Keys;

/// How often `seatgate_redis_up` is refreshed: well under a scrape interval.
const REDIS_PROBE_EVERY: Duration = Duration::from_secs(1);

/// When the daily usage rollups are tried: every 10 minutes (a day is
/// rolled up once, by whichever process takes the roll-up lock first, a few
/// minutes after it ends; the other tries find nothing to do).
const ROLLUP_SCHEDULE: &str = "0 */10 * * * *";

/// Adds the daily usage rollups (views::rollup) to the reaper's scheduler:
/// beside the reaper, since they too are shared upkeep one process does.
async fn schedule_rollups(scheduler: &JobScheduler, settings: &Settings) -> Result<(), Error> {
    let con = crate::connect(settings).await?;
    let settings = settings.clone();
    let job = Job::new_async(ROLLUP_SCHEDULE, move |_id, _lock| {
        let (mut con, settings) = (con.clone(), settings.clone());
        Box::pin(async move {
            match rollup::roll_up_retrying(&mut con, &settings).await {
                Ok(pass) if !pass.days.is_empty() => {
                    info!(days = ?pass.days, written = pass.written, trimmed = pass.trimmed, "usage rollups")
                }
                Ok(_) => {}
                Err(e) => warn!(error = %e, "usage rollup failed; the next try does it again"),
            }
        })
    })
    .map_err(|source| Error::Schedule {
        schedule: ROLLUP_SCHEDULE.to_owned(),
        source,
    })?;
    scheduler.add(job).await?;
    Ok(())
}

/// Runs a worker (and the metrics endpoint, when configured) until `shutdown`
/// completes, then stops reading, finishes the batch in hand and returns.
/// `on_listen` is told the metrics address once bound (port 0 picks one).
pub async fn run(
    settings: Settings,
    shutdown: impl std::future::Future<Output = ()>,
    on_listen: impl FnOnce(Option<SocketAddr>),
) -> Result<(), Error> {
    let token = CancellationToken::new();
    let ready = Readiness::new(settings.log.repeats_per_minute);
    let grace = Duration::from_millis(settings.shutdown.grace_ms);
    let mut deadline = None;

    let page_at = settings.page_at()?;
    let page = match page_at {
        PageAt::Off => None,
        PageAt::Metrics | PageAt::Own(_) => Some(PageRoutes {
            snapshots: Arc::new(Snapshots::new(
                crate::connect(&settings).await?,
                Keys::new(settings.keys.prefix.clone()),
                &settings.http,
            )),
            allowed_hosts: settings.http.allowed_hosts.clone(),
        }),
    };
    let on_metrics = page.clone().filter(|_| page_at == PageAt::Metrics);
    let http_task = match settings.metrics_addr()? {
        Some(addr) => {
            let handle =
                telemetry::install_metrics(settings.metrics.license_series_limit).map_err(Error::Metrics)?;
            let (bound, task) = http::serve(
                addr,
                handle,
                ready.clone(),
                on_metrics,
                &settings.http.allowed_hosts,
                token.clone(),
            )
            .await?;
            if page_at == PageAt::Metrics {
                info!(%bound, "serving /metrics, /live, /ready and the status page (/, /status.json)");
            } else {
                info!(%bound, "serving /metrics, /live and /ready");
            }
            on_listen(Some(bound));
            Some(task)
        }
        None => {
            on_listen(None);
            None
        }
    };
    let page_task = match (page_at, page) {
        (PageAt::Own(addr), Some(page)) => {
            let (bound, task) = http::serve_page(addr, page, token.clone()).await?;
            info!(%bound, "serving the status page (/, /status.json) on http.page_listen");
            Some(task)
        }
        _ => None,
    };

    let probe = tokio::spawn(health::probe_redis(
        crate::connect(&settings).await?,
        REDIS_PROBE_EVERY,
        ready.clone(),
        token.clone(),
    ));

    let reaper = if settings.reaper.enabled {
        let reaper = Reaper::new(crate::connect(&settings).await?, &settings);
        let scheduler =
            reaper::start(reaper.clone(), &settings.reaper.schedule, settings.reaper.lock_ms).await?;
        info!(schedule = %settings.reaper.schedule, "reaper scheduled");
        schedule_rollups(&scheduler, &settings).await?;
        Some((reaper, scheduler))
    } else {
        None
    };

    let worker = Worker::connect(settings, ready).await?;
    let mut worker_task = tokio::spawn(worker.run(token.clone()));

    let result = tokio::select! {
        r = &mut worker_task => r,
        _ = shutdown => {
            info!("shutdown requested; finishing in-flight requests");
            token.cancel();
            let until = tokio::time::Instant::now() + grace;
            deadline = Some(until);
            match tokio::time::timeout_at(until, &mut worker_task).await {
                Ok(r) => r,
                Err(_) => {
                    warn!(?grace, "in-flight requests did not finish in time; leaving them pending to be decided again");
                    worker_task.abort();
                    Ok(Ok(()))
                }
            }
        }
    };
    token.cancel();
    if let Some((reaper, mut scheduler)) = reaper {
        // The scheduler's shutdown does not wait for a running job: wait for it here.
        if let Err(e) = scheduler.shutdown().await {
            warn!(error = %e, "stopping the reaper scheduler failed");
        }
        // One deadline for the whole shutdown, not one per stage.
        let left = deadline.map_or(grace, |d| {
            d.saturating_duration_since(tokio::time::Instant::now())
        });
        reaper::drain(&reaper, left).await;
        // Hand the lead over now rather than after the lock expires.
        reaper.resign().await;
    }
    let _ = probe.await;
    for task in [http_task, page_task].into_iter().flatten() {
        let _ = task.await;
    }
    match result {
        Ok(r) => r,
        Err(join) => Err(Error::Task(join)),
    }
}

/// Completes on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
