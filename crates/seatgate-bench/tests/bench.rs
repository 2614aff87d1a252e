//! The benchmark binary as a person runs it: on a Redis it may not flush,
//! and on its own private redis-server, stopped by Ctrl-C.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use seatgate_testkit::LocalRedis;

/// The `seatgate-bench` binary built for these tests.
const BIN: &str = env!("CARGO_BIN_EXE_seatgate-bench");

/// Runs `seatgate-bench` with `args` to the end.
async fn bench(args: &[&str]) -> Output {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || Command::new(BIN).args(&args).output())
        .await
        .expect("join")
        .expect("seatgate-bench runs")
}

/// Its standard output as text.
fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `seatgate-bench --bench-redis URL` without `--flush`, on a Redis it may
/// not wipe, runs row after row: each row gives back the seats its callers
/// took, so the next row's callers, new clients with leases of their own,
/// find them free instead of refused (`LEASE_MISMATCH`), and the Redis is
/// left with no seat held.
#[tokio::test]
async fn bench_runs_row_after_row_on_a_redis_it_may_not_flush() {
    let redis = LocalRedis::start(&[]).await.expect("redis-server");
    let url = redis.url();
    let o = bench(&[
        "--bench-redis",
        &url,
        "--only",
        "seatgate,fixed-rate",
        "--duration",
        "300ms",
        "--warmup",
        "100ms",
    ])
    .await;
    let (out, err) = (stdout(&o), String::from_utf8_lossy(&o.stderr).into_owned());
    assert!(o.status.success(), "{err}");
    for row in ["clients=64 workers=1", "clients=64 workers=2", "80% of max"] {
        assert!(out.contains(row), "no {row:?} row in:\n{out}");
    }
    let mut con = redis
        .client()
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    let holders: Vec<String> = redis::cmd("KEYS")
        .arg("seat:{bench-*}:holders")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(
        holders.is_empty(),
        "seats still held after the benchmark: {holders:?}"
    );
}

/// `ppid` and `session` of a process, from `/proc/<pid>/stat` (the fields
/// after the command name, which may itself hold spaces and parentheses).
fn parent_and_session(pid: u32) -> Option<(u32, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut rest = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let (_state, ppid, _pgrp, session) = (rest.next()?, rest.next()?, rest.next()?, rest.next()?);
    Some((ppid.parse().ok()?, session.parse().ok()?))
}

/// The redis-server processes whose parent is `parent`.
fn redis_children(parent: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            comm.trim() == "redis-server" && parent_and_session(pid).is_some_and(|(ppid, _)| ppid == parent)
        })
        .collect()
}

/// `seatgate-bench` measures its private redis-server as a deployed Redis
/// runs, in a session (a scheduler group) of its own rather than sharing the
/// CPU thread for thread with the benchmark's runtime; a terminal's Ctrl-C
/// does not reach such a server, so the benchmark stops it itself: after a
/// SIGINT it exits 130 with one line saying so, and its server is gone.
#[tokio::test]
async fn bench_runs_its_redis_in_a_session_of_its_own_and_stops_it_on_ctrl_c() {
    let mut bench = Command::new(BIN)
        .args(["--only", "contention", "--duration", "60s"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("seatgate-bench");
    let mut server = None;
    for _ in 0..200 {
        if let Some(&pid) = redis_children(bench.id()).first() {
            server = Some(pid);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let Some(server) = server else {
        let _ = bench.kill();
        panic!("seatgate-bench started no redis-server of its own within 10 s");
    };
    let (_, session) = parent_and_session(server).expect("the server's /proc/<pid>/stat");
    assert_eq!(
        session, server,
        "the benchmark's redis-server leads no session of its own"
    );
    let (_, ours) = parent_and_session(std::process::id()).expect("our /proc/self/stat");
    assert_ne!(session, ours);

    // Into the contention row, then Ctrl-C.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let interrupted = Command::new("kill")
        .args(["-INT", &bench.id().to_string()])
        .status();
    assert!(interrupted.is_ok_and(|s| s.success()));
    let o = tokio::task::spawn_blocking(move || bench.wait_with_output())
        .await
        .expect("join")
        .expect("seatgate-bench's output");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(
        err.contains("seatgate-bench: interrupted; its private redis-server is stopped"),
        "{err}"
    );
    assert!(
        !std::path::Path::new(&format!("/proc/{server}")).exists(),
        "the benchmark's redis-server (pid {server}) outlived the benchmark"
    );
}
