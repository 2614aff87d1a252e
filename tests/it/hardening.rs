//! Hardening, the runtime side: promises kept under heavy and hostile callers.
//!
//! - claims reach idle entries behind any number of recently delivered ones;
//! - the reaper never removes a live worker's consumer, and never drops an
//!   entry from the pending list;
//! - an entry delivered more than `stream.max_deliveries` times is
//!   dead-lettered without being decided again, while Redis refusing for a
//!   long time dead-letters nothing;
//! - a caller-chosen entry id far ahead of the clock harms nothing but its own
//!   latency figure, and the stream recovers from an id pushed to the maximum
//!   (the runbook of docs/operations.md) without losing a pending entry.

use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use seatgate::client::{Call, Client};
use seatgate::engine::protocol::Op;
use seatgate::engine::status::Status;
use tokio_util::sync::CancellationToken;

use crate::support::{create_group, holders, put_license, spawn_worker, RedisServer, RedisServerExt};

const REQUESTS: &str = "seat:requests";
const GROUP: &str = "seatgate";

/// Delivers up to `count` new entries of the requests stream to `consumer`,
/// which then never acknowledges them (a worker that died); their ids.
async fn take(con: &mut MultiplexedConnection, consumer: &str, count: usize) -> Vec<String> {
    let read: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(GROUP)
        .arg(consumer)
        .arg("COUNT")
        .arg(count)
        .arg("STREAMS")
        .arg(REQUESTS)
        .arg(">")
        .query_async(con)
        .await
        .unwrap();
    read.keys.into_iter().flat_map(|k| k.ids).map(|e| e.id).collect()
}

/// XAUTOCLAIM looks at no more than ten times COUNT pending entries per call.
/// An idle entry behind more recently delivered ones than that used to wait
/// for as long as they stayed busy (every claim restarted at `0-0`); the
/// sweep now goes on where the last page stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_entry_behind_more_than_a_claim_scan_of_busy_ones_is_claimed() {
    let redis = RedisServer::start_with(&[]);
    put_license(&redis, "lic", 1).await;
    let mut con = redis.con().await;
    create_group(&mut con).await;
    // 400 heartbeats ahead of it: more than one XAUTOCLAIM scan (10 × COUNT 32).
    let mut pipe = redis::pipe();
    for i in 0..400 {
        pipe.cmd("XADD")
            .arg(REQUESTS)
            .arg("*")
            .arg("op")
            .arg("heartbeat")
            .arg("license")
            .arg("busy")
            .arg("session")
            .arg(format!("s{i}"));
    }
    let busy_ids: Vec<String> = pipe.query_async(&mut con).await.unwrap();
    let mut client = Client::connect(&redis.url(), REQUESTS).await.unwrap();
    let id = client
        .send(&Call::new(Op::Acquire, "lic", "behind"))
        .await
        .unwrap();
    // A worker that died took all of them ...
    assert_eq!(take(&mut con, "dead", 1000).await.len(), 401);
    let delivered = Instant::now();
    // ... and another consumer keeps the 400 busy, as a live worker's batches in flight would be.
    let stop = CancellationToken::new();
    let toucher = {
        let mut con = redis.con().await;
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let _: Vec<String> = redis::cmd("XCLAIM")
                    .arg(REQUESTS)
                    .arg(GROUP)
                    .arg("alive")
                    .arg(0)
                    .arg(&busy_ids)
                    .arg("JUSTID")
                    .query_async(&mut con)
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let mut settings = redis.settings();
    let claim_idle = Duration::from_millis(1000);
    settings.stream.claim_idle_ms = claim_idle.as_millis() as u64; // a claim every 500 ms
    let worker = spawn_worker(settings, "w1").await;

    let r = client.wait_for(&id, Duration::from_secs(8)).await;
    let waited = delivered.elapsed();
    stop.cancel();
    toucher.await.unwrap();
    worker.stop().await;
    let r = r.expect("the idle entry behind 400 busy ones was never claimed");
    assert_eq!(r.status(), Status::Acquired);
    let claim_period = claim_idle / 2;
    assert!(
        waited <= claim_idle + 4 * claim_period,
        "claimed {waited:?} after it was delivered: more than claim_idle_ms and a couple of claim periods"
    );
    assert_eq!(holders(&redis, "lic").await, ["behind"]);
}
