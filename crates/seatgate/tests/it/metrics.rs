//! `/metrics` of real `seatgate run` processes: help text, closed label sets
//! at 0, per-license series that follow the top N, bounded denials, and the
//! shared-state series exported by the reaper leader alone.

use std::time::{Duration, Instant};

use seatgate_client::{Call, Client};
use seatgate_core::license::LicenseSpec;
use seatgate_core::status::Status;

use crate::support::{
    acquire, client, metric, provision, put_license, seats, spawn_app, RedisServer, RedisServerExt, TestApp,
    WorkerProcess, T,
};

/// Scrapes until `check` holds, at most `within`; returns the last page.
async fn until(worker: &WorkerProcess, within: Duration, what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + within;
    loop {
        let page = worker.scrape().await;
        if check(&page) {
            return page;
        }
        assert!(Instant::now() < deadline, "{what}; last scrape:\n{page}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn status(client: &mut Client, call: Call) -> Status {
    client.call(&call, T).await.expect("answered").status()
}

fn every_second(extra: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    let mut env = vec![("SEATGATE__REAPER__SCHEDULE", "* * * * * *".to_owned())];
    env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    env
}

#[tokio::test]
async fn per_license_series_follow_the_top_n_and_denials_stay_bounded() {
    let TestApp(redis, settings, _) = spawn_app().await;
    put_license(&settings, "a", 1).await;
    put_license(&settings, "b", 2).await;
    let worker = WorkerProcess::start(
        &redis.url(),
        &every_second(&[("SEATGATE__METRICS__LICENSE_SERIES_LIMIT", "1")]),
    )
    .await;

    let page = worker.scrape().await;
    for line in page.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let name = line.split_whitespace().next().unwrap_or_default();
        assert!(page.contains(&format!("# HELP {name} ")), "{name} has no HELP");
    }
    assert_eq!(metric(&page, "seatgate_build_info{version=\"0.1.0\"}"), Some(1.0));
    assert_eq!(
        metric(&page, "seatgate_invalid_requests_total{field=\"meta\"}"),
        Some(0.0)
    );
    assert_eq!(
        metric(
            &page,
            "seatgate_requests_total{op=\"acquire\",status=\"NO_SEATS_AVAILABLE\"}"
        ),
        Some(0.0)
    );
    assert_eq!(
        metric(
            &page,
            "seatgate_denials_total{license=\"_other\",reason=\"RATE_LIMITED\"}"
        ),
        Some(0.0)
    );
    assert_eq!(metric(&page, "seatgate_ready"), Some(1.0));

    let mut c = client(&settings).await;
    assert_eq!(status(&mut c, acquire("a", "s1", 0)).await, Status::Acquired);
    assert_eq!(
        status(&mut c, acquire("a", "s2", 0)).await,
        Status::NoSeatsAvailable
    );
    // a (1/1) is the top license; b (0/2) is summed into _other.
    until(
        &worker,
        Duration::from_secs(5),
        "a has series, b is in _other",
        |p| {
            metric(p, "seatgate_seats_used{license=\"a\"}") == Some(1.0)
                && metric(p, "seatgate_seats_capacity{license=\"_other\"}") == Some(2.0)
                && !p.contains("license=\"b\"")
        },
    )
    .await;

    // b fills up and a empties: b takes the place, a goes to _other.
    assert_eq!(status(&mut c, acquire("b", "x1", 0)).await, Status::Acquired);
    assert_eq!(status(&mut c, acquire("b", "x2", 0)).await, Status::Acquired);
    assert_eq!(
        status(&mut c, acquire("b", "x3", 0)).await,
        Status::NoSeatsAvailable
    );
    let release = Call::release("a", "s1");
    assert_eq!(status(&mut c, release).await, Status::Released);
    let page = until(&worker, Duration::from_secs(5), "b replaced a", |p| {
        metric(p, "seatgate_seats_used{license=\"b\"}") == Some(2.0)
            && metric(p, "seatgate_seats_capacity{license=\"_other\"}") == Some(1.0)
            && !p.contains("seatgate_seats_used{license=\"a\"}")
    })
    .await;
    assert_eq!(metric(&page, "seatgate_fleet_seats_used"), Some(2.0));
    assert_eq!(metric(&page, "seatgate_fleet_seats_capacity"), Some(3.0));
    assert_eq!(metric(&page, "seatgate_licenses"), Some(2.0));

    // Denials: a was denied first and keeps its place; b's denial is under _other.
    assert_eq!(
        metric(
            &page,
            "seatgate_denials_total{license=\"a\",reason=\"NO_SEATS_AVAILABLE\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &page,
            "seatgate_denials_total{license=\"_other\",reason=\"NO_SEATS_AVAILABLE\"}"
        ),
        Some(1.0)
    );
    assert!(!page.contains("seatgate_denials_total{license=\"b\""), "{page}");
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_reaper_leader_exports_shared_state_and_another_takes_over() {
    let redis = RedisServer::start_with(&[]).await;
    put_license(&redis.settings(), "lic", 2).await;
    let env = every_second(&[("SEATGATE__REAPER__LOCK_MS", "5000")]);
    let mut workers = vec![
        WorkerProcess::start(&redis.url(), &env).await,
        WorkerProcess::start(&redis.url(), &env).await,
    ];
    let exports = |p: &str| metric(p, "seatgate_seats_capacity{license=\"lic\"}") == Some(2.0);
    let leads = |p: &str| metric(p, "seatgate_reaper_leader") == Some(1.0);

    // One leader, which exports the shared state; the other exports none of it.
    let deadline = Instant::now() + Duration::from_secs(5);
    let leader = loop {
        let mut pages = Vec::new();
        for w in &workers {
            pages.push(w.scrape().await);
        }
        if let Some(i) = pages.iter().position(|p| leads(p) && exports(p)) {
            let other = &pages[1 - i];
            assert!(!leads(other), "two leaders:\n{other}");
            for name in [
                "seatgate_seats_used",
                "seatgate_fleet_seats_capacity",
                "seatgate_stream_lag",
            ] {
                assert!(!other.contains(name), "a follower exports {name}:\n{other}");
            }
            break i;
        }
        assert!(Instant::now() < deadline, "no leader exported the shared state");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // The leader dies: the other takes over once the lock expires.
    workers[leader].kill9();
    let survivor = workers.remove(1 - leader);
    let killed = Instant::now();
    until(
        &survivor,
        Duration::from_secs(10),
        "the survivor did not take over",
        |p| leads(p) && exports(p),
    )
    .await;
    let took = killed.elapsed();
    eprintln!("took over {took:?} after the leader's kill -9");

    // A leader that stops cleanly hands over at once, not after the lock expires.
    let mut next = survivor;
    let successor = WorkerProcess::start(&redis.url(), &env).await;
    assert!(!leads(&successor.scrape().await));
    let status = next.terminate(Duration::from_secs(10)).await;
    assert!(status.success());
    let stopped = Instant::now();
    until(
        &successor,
        Duration::from_secs(10),
        "the successor did not take over",
        |p| leads(p) && exports(p),
    )
    .await;
    let handover = stopped.elapsed();
    eprintln!("took over {handover:?} after SIGTERM to the leader");
    assert!(
        handover < Duration::from_millis(4_000),
        "a clean stop gives the lock up (lock_ms is 5 s): {handover:?}"
    );
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// Expiry is exported for every license that expires within 30 days or has
/// expired, whatever its utilisation rank and however it was written: with
/// `license_series_limit` 1, the busy license takes the one seat series, and
/// an idle license expiring in 12 hours written as its hash alone (no
/// license index, as a billing system writes it), an expired one and one
/// whose `expires_at_ms` is in seconds (invalid) are still each exported as
/// such, with the counts by window.
#[tokio::test]
async fn every_license_expiring_soon_or_expired_or_invalid_is_exported_whatever_its_rank() {
    let TestApp(redis, settings, _) = spawn_app().await;
    let now_s = now_ms() / 1000;
    let at = |secs: u64| LicenseSpec {
        expires_at_ms: secs * 1000,
        ..seats(5)
    };
    put_license(&settings, "busy", 1).await;
    provision(&settings, "month", &at(now_s + 20 * 86_400)).await;
    provision(&settings, "later", &at(now_s + 90 * 86_400)).await;
    provision(&settings, "gone", &at(now_s - 3_600)).await;
    let mut con = crate::support::db(&settings).await;
    for (license, expires) in [
        ("billing-idle", (now_s + 12 * 3_600) * 1000),
        ("billing-seconds", now_s + 12 * 3_600),
    ] {
        crate::support::set_license_field(&mut con, &settings, license, "seats_total", "3").await;
        crate::support::set_license_field(
            &mut con,
            &settings,
            license,
            "expires_at_ms",
            &expires.to_string(),
        )
        .await;
    }
    let worker = WorkerProcess::start(
        &redis.url(),
        &every_second(&[("SEATGATE__METRICS__LICENSE_SERIES_LIMIT", "1")]),
    )
    .await;
    let mut c = client(&settings).await;
    assert_eq!(status(&mut c, acquire("busy", "s1", 0)).await, Status::Acquired);
    let expiry =
        |license: &str| format!("seatgate_license_expiry_timestamp_seconds{{license=\"{license}\"}}");
    let page = until(&worker, Duration::from_secs(10), "every expiry exported", |p| {
        metric(p, "seatgate_seats_used{license=\"busy\"}") == Some(1.0)
            && metric(p, &expiry("billing-idle")) == Some((now_s + 12 * 3_600) as f64)
            && metric(p, &expiry("month")) == Some((now_s + 20 * 86_400) as f64)
            && metric(p, &expiry("gone")) == Some((now_s - 3_600) as f64)
            && metric(p, "seatgate_license_expiry_invalid{license=\"billing-seconds\"}") == Some(1.0)
    })
    .await;
    assert_eq!(
        metric(&page, "seatgate_seats_used{license=\"billing-idle\"}"),
        None,
        "not in the top 1"
    );
    assert_eq!(metric(&page, &expiry("later")), None, "beyond 30 days");
    assert_eq!(metric(&page, &expiry("busy")), None, "never expires");
    assert_eq!(
        metric(&page, &expiry("billing-seconds")),
        None,
        "invalid, not 1970"
    );
    for (series, n) in [
        ("seatgate_licenses_expiring{within=\"1d\"}", 1.0),
        ("seatgate_licenses_expiring{within=\"7d\"}", 1.0),
        ("seatgate_licenses_expiring{within=\"30d\"}", 2.0),
        ("seatgate_licenses_expired", 1.0),
        ("seatgate_licenses_expiry_invalid", 1.0),
    ] {
        assert_eq!(metric(&page, series), Some(n), "{series}");
    }
}

/// `promtool check metrics` (Prometheus's own linter of names, types, units
/// and help) on a live scrape holding every family: per-license seats and
/// denials, a queue, histograms with samples, the reaper's series and the
/// `process_*` series. The seed's two `license_lua_script_*` names pass it too.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs promtool: bash ops/test.sh runs it"]
async fn a_live_scrape_passes_promtool_check_metrics() {
    let TestApp(redis, settings, _) = spawn_app().await;
    // In 10 days, whole seconds: inside the 30 days that get an expiry series.
    let expires_at_ms = (now_ms() / 1000 + 10 * 86_400) * 1000;
    provision(
        &settings,
        "lint",
        &LicenseSpec {
            expires_at_ms,
            ..seats(1)
        },
    )
    .await;
    let worker = WorkerProcess::start(&redis.url(), &every_second(&[])).await;
    let mut c = client(&settings).await;
    assert_eq!(status(&mut c, acquire("lint", "s1", 0)).await, Status::Acquired);
    assert_eq!(
        status(&mut c, acquire("lint", "s2", 0)).await,
        Status::NoSeatsAvailable
    );
    assert_eq!(
        status(&mut c, acquire("lint", "s3", 60_000)).await,
        Status::Queued
    );
    let page = until(&worker, Duration::from_secs(5), "every family exported", |p| {
        metric(p, "seatgate_queue_depth{license=\"lint\"}") == Some(1.0)
            && metric(p, "seatgate_seats_capacity{license=\"lint\"}") == Some(1.0)
            && metric(p, "seatgate_license_expiry_timestamp_seconds{license=\"lint\"}")
                == Some(expires_at_ms as f64 / 1000.0)
            && metric(p, "seatgate_licenses_expiring{within=\"30d\"}") == Some(1.0)
            && metric(p, "seatgate_licenses_expired") == Some(0.0)
            && p.contains("seatgate_reaper_pass_seconds_count")
            && metric(p, "seatgate_reaper_passes_total").is_some_and(|n| n >= 1.0)
            && p.contains("license_lua_script_latency_seconds_count")
    })
    .await;
    // The response's head is not part of the exposition.
    let page = page
        .split_once("\r\n\r\n")
        .map_or(page.as_str(), |(_, body)| body);
    assert!(metric(page, "process_cpu_seconds_total").is_some(), "{page}");
    for family in [
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ] {
        assert!(
            metric(page, family).is_some_and(|v| v > 0.0),
            "{family} missing or 0:\n{page}"
        );
    }

    let mut promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (bash ops/ensure-prometheus.sh installs it)");
    use std::io::Write;
    promtool.stdin.take().unwrap().write_all(page.as_bytes()).unwrap();
    let out = promtool.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics ({}):\n{said}",
        out.status
    );
}

/// libfaketime (Debian's `faketime`, ops/ensure-redis.sh installs it),
/// preloaded into a worker: its wall clock `offset` off (`+2h`), its
/// monotonic clock left alone.
fn clock_off(offset: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "LD_PRELOAD",
            "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1".to_owned(),
        ),
        ("FAKETIME", offset.to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
    ]
}

/// A worker whose clock is 2 h ahead of Redis's measures its requests on
/// the Redis clock (carried on its monotonic clock), not 7,200 s each, and
/// exports how far ahead it is; a worker on time exports about 0.
#[tokio::test]
async fn a_worker_whose_clock_is_ahead_times_requests_right_and_exports_its_skew() {
    let TestApp(redis, s, _) = spawn_app().await;
    put_license(&s, "lic", 1).await;
    let ahead = WorkerProcess::start(&redis.url(), &clock_off("+2h")).await;
    let mut c = client(&s).await;
    assert_eq!(status(&mut c, acquire("lic", "a", 0)).await, Status::Acquired);
    for i in 0..4 {
        let session = format!("d{i}");
        assert_eq!(
            status(&mut c, acquire("lic", &session, 0)).await,
            Status::NoSeatsAvailable
        );
    }
    let series = |name: &str| format!("seatgate_request_duration_seconds_{name}{{op=\"acquire\"}}");
    let page = until(
        &ahead,
        Duration::from_secs(10),
        "the skew and 5 acquires timed",
        |page| {
            metric(page, "seatgate_clock_skew_seconds").is_some()
                && metric(page, &series("count")).is_some_and(|n| n >= 5.0)
        },
    )
    .await;
    let skew = metric(&page, "seatgate_clock_skew_seconds").unwrap();
    assert!(
        (skew - 7200.0).abs() < 5.0,
        "a worker 2 h ahead (is Debian's faketime installed?): seatgate_clock_skew_seconds {skew}"
    );
    let (sum, count) = (
        metric(&page, &series("sum")).unwrap(),
        metric(&page, &series("count")).unwrap(),
    );
    assert!(
        sum / count < 1.0,
        "requests timed on the worker's clock: {count} acquires took {sum} s in all"
    );
    eprintln!("a worker 2 h ahead: skew {skew} s; {count} acquires took {sum} s in all");

    let on_time = WorkerProcess::start(&redis.url(), &[]).await;
    let page = until(&on_time, Duration::from_secs(10), "the skew", |page| {
        metric(page, "seatgate_clock_skew_seconds").is_some()
    })
    .await;
    let skew = metric(&page, "seatgate_clock_skew_seconds").unwrap();
    assert!(
        skew.abs() < 1.0,
        "a worker on time: seatgate_clock_skew_seconds {skew}"
    );
}
