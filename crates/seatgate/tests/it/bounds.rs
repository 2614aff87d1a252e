//! Bounded growth (issue 23): what a client can make Redis (and the logs)
//! hold is capped. Each test floods one bound against a real worker and
//! Redis, measures Redis memory (`INFO memory` used_memory) and key counts
//! before and after, prints the figures, and asserts the growth stays under
//! a stated cap.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use seatgate::config::Settings;
use seatgate_client::{Call, Client};
use seatgate_core::db::Db;
use seatgate_core::status::Status;

use crate::support::{
    client, holders, http_get, metric, put_license, reaping, reply_stream, request_xadd, snapshot, spawn_app,
    spawn_worker, stream_entries, Spawned, TestApp, BIN, T,
};

/// `used_memory` of `INFO memory`, bytes.
async fn used_memory(con: &mut Db) -> i64 {
    let info: String = redis::cmd("INFO").arg("memory").query_async(con).await.unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory in INFO memory")
}

/// Keys in the database.
async fn dbsize(con: &mut Db) -> i64 {
    redis::cmd("DBSIZE").query_async(con).await.unwrap()
}

/// Keys matching `pattern` (SCAN, so it is fine with many).
async fn count_keys(con: &mut Db, pattern: &str) -> usize {
    let mut cursor = 0u64;
    let mut n = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(con)
            .await
            .unwrap();
        n += keys.len();
        if next == 0 {
            return n;
        }
        cursor = next;
    }
}

/// Empties the requests stream: it holds the flood itself, which is the
/// callers' doing and trimmed by the operator's policy, not seatgate's.
async fn trim_requests(con: &mut Db, s: &Settings) {
    let _: i64 = redis::cmd("XTRIM")
        .arg(s.client_requests())
        .arg("MAXLEN")
        .arg(0)
        .query_async(con)
        .await
        .unwrap();
}

/// Bytes Redis spends on the keys of `license` (MEMORY USAGE of each).
async fn license_bytes(con: &mut Db, s: &Settings, license: &str) -> i64 {
    let keys = crate::support::license_keys(s, license);
    let mut total = 0;
    for k in keys.all() {
        let n: Option<i64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(k)
            .query_async(con)
            .await
            .unwrap();
        total += n.unwrap_or(0);
    }
    total
}

async fn xlen(con: &mut Db, stream: &str) -> usize {
    redis::cmd("XLEN").arg(stream).query_async(con).await.unwrap()
}

/// Waits until the group has read every entry of the requests stream up to
/// `last` and acknowledged them all (at most `within`).
async fn drained(con: &mut Db, s: &Settings, last: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let groups: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(s.client_requests())
            .query_async(con)
            .await
            .unwrap();
        let g = groups
            .iter()
            .find(|g| {
                g.get("name")
                    .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
                    .as_deref()
                    == Some(s.stream.group.as_str())
            })
            .expect("the group");
        let get = |k: &str| {
            g.get(k)
                .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
                .unwrap_or_default()
        };
        if get("last-delivered-id") == last && get("pending") == "0" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the flood was not drained within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Adds `n` entries, `fields(i)` each, in pipelines of 500; the last entry id.
async fn flood(
    con: &mut Db,
    s: &Settings,
    n: usize,
    fields: impl Fn(usize) -> Vec<(String, Vec<u8>)>,
) -> String {
    let mut last = String::new();
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let mut pipe = redis::pipe();
        for &i in chunk {
            let mut xadd = request_xadd(s);
            for (k, v) in fields(i) {
                xadd.arg(k).arg(v);
            }
            pipe.add_command(xadd);
        }
        let ids: Vec<String> = pipe.query_async(con).await.unwrap();
        last = ids.last().cloned().unwrap_or_default();
    }
    last
}

fn field(k: &str, v: impl Into<Vec<u8>>) -> (String, Vec<u8>) {
    (k.to_owned(), v.into())
}

/// `holder` takes a seat of `lic` through `client` (its only one, in the
/// floods that wait or are refused).
async fn take_the_seat(client: &Client) {
    let held = client.call(&Call::acquire("lic", "holder"), T).await.unwrap();
    assert_eq!(held.status(), Status::Acquired);
}

/// Floods 5,000 invalid requests, each naming a reply stream of its own,
/// through a worker with the budget off (as before) and then on: with it,
/// at most `limits.invalid_requests` reply streams are created per window,
/// every request is still either answered or dead-lettered (promise 2),
/// nothing else changes (promise 3), and an invalid request past the budget
/// is still answered on a reply stream that exists.
#[tokio::test]
async fn invalid_requests_with_distinct_reply_streams_create_a_bounded_number_of_keys() {
    const N: usize = 5_000;
    let mut figures = Vec::new();
    for budget in [0, 50] {
        let TestApp(_redis, mut settings, mut con) = spawn_app().await;
        settings.limits.invalid_requests = budget;
        // One window for the whole flood, however slow the machine.
        settings.limits.window_ms = 600_000;
        put_license(&settings, "lic", 2).await;
        let worker = spawn_worker(settings.clone(), "w1").await;
        let client = client(&settings).await;
        take_the_seat(&client).await;
        let state = snapshot(&settings).await;
        let (mem0, keys0) = (used_memory(&mut con).await, dbsize(&mut con).await);
        let flood_prefix = reply_stream(&settings, "flood:");
        let started = Instant::now();
        let last = flood(&mut con, &settings, N, |i| {
            vec![
                field("id", format!("bad-{i}")),
                field("op", "steal"),
                field("license", "lic"),
                field("session", format!("s{i}")),
                field("reply_to", format!("{flood_prefix}{i}")),
            ]
        })
        .await;
        drained(&mut con, &settings, &last, Duration::from_secs(120)).await;
        let took = started.elapsed();
        trim_requests(&mut con, &settings).await;
        let streams = count_keys(&mut con, &format!("{flood_prefix}*")).await;
        let dead = xlen(&mut con, &settings.stream.dead_letter).await;
        let (mem1, keys1) = (used_memory(&mut con).await, dbsize(&mut con).await);
        println!(
            "invalid flood, limits.invalid_requests={budget}: {N} requests in {took:.1?}; \
             reply streams created {streams}, dead letters {dead}; keys {keys0} -> {keys1}; \
             used_memory {mem0} -> {mem1} (+{} bytes, {:.1} MiB)",
            mem1 - mem0,
            (mem1 - mem0) as f64 / 1_048_576.0
        );
        figures.push((budget, streams, mem1 - mem0));
        // Promise 2: each one answered (one reply in its own stream) or dead-lettered.
        let mut answered = 0;
        for i in (0..N).step_by(97) {
            let replies = stream_entries(&mut con, &format!("{flood_prefix}{i}")).await;
            answered += replies.len();
            for r in &replies {
                assert_eq!(r.fields["status"], Status::InvalidRequest.as_str());
            }
        }
        assert!(answered > 0, "some of the flood was answered");
        assert_eq!(streams + dead, N, "every request answered or dead-lettered");
        // Promise 3: nothing else changed.
        assert_eq!(
            snapshot(&settings).await,
            state,
            "invalid requests changed seat state"
        );
        if budget == 0 {
            assert_eq!(
                streams, N,
                "without the budget every invalid request makes a stream"
            );
            continue;
        }
        assert_eq!(
            streams, budget as usize,
            "at most the budget of reply streams in one window"
        );
        let shed = stream_entries(&mut con, &settings.stream.dead_letter).await;
        assert!(shed[0].fields["dead_reason"].contains("limits.invalid_requests"));
        assert!(
            mem1 - mem0 < 2 * 1_048_576,
            "the flood grew Redis by {} bytes, more than 2 MiB",
            mem1 - mem0
        );
        // Past the budget, an invalid request to a reply stream that exists
        // (this client's) is still answered.
        let id = "late-bad";
        let _: String = request_xadd(&settings)
            .arg("id")
            .arg(id)
            .arg("op")
            .arg("steal")
            .arg("reply_to")
            .arg(client.reply_to())
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(
            client.wait_for(id, T).await.unwrap().status(),
            Status::InvalidRequest
        );
        assert_eq!(holders(&settings, "lic").await, ["holder"]);
        worker.stop().await;
    }
    let (unbounded, bounded) = (figures[0].2, figures[1].2);
    println!(
        "invalid flood: +{unbounded} bytes without the budget, +{bounded} with it ({:.1}x less)",
        unbounded as f64 / bounded.max(1) as f64
    );
}

/// Floods 2,000 entries of about 16 KiB that are dead-lettered at once
/// (their `reply_to` lies outside the namespace): each dead letter keeps
/// the entry's first `stream.dead_letter_max_bytes` (1 KiB) and its size,
/// so the dead-letter stream grows by about 2,000 × 1.2 KiB, not 32 MiB.
#[tokio::test]
async fn dead_letters_keep_a_bounded_number_of_bytes_of_each_entry() {
    const N: usize = 2_000;
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 2).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let (mem0, keys0) = (used_memory(&mut con).await, dbsize(&mut con).await);
    let big = vec![b'j'; 7_900];
    let last = flood(&mut con, &settings, N, |i| {
        vec![
            field("id", format!("poison-{i}")),
            field("op", "acquire"),
            field("license", "lic"),
            field("session", format!("s{i}")),
            field("reply_to", "orders:jobs"),
            field("junk1", big.clone()),
            field("junk2", big.clone()),
        ]
    })
    .await;
    // The first entry's size: names and values.
    let entry_bytes: usize = 2 + "poison-0".len() + 2 + 7 + 7 + 3 + 7 + 2 + 8 + 11 + 2 * (5 + 7_900);
    drained(&mut con, &settings, &last, Duration::from_secs(120)).await;
    trim_requests(&mut con, &settings).await;
    let (mem1, keys1) = (used_memory(&mut con).await, dbsize(&mut con).await);
    let dead_usage: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(&settings.stream.dead_letter)
        .query_async(&mut con)
        .await
        .unwrap();
    let dead = stream_entries(&mut con, &settings.stream.dead_letter).await;
    println!(
        "dead-letter flood: {N} entries of about {entry_bytes} bytes ({:.1} MiB in all); \
         dead letters {}, dead-letter stream {dead_usage} bytes ({:.0} per dead letter); \
         keys {keys0} -> {keys1}; used_memory {mem0} -> {mem1} (+{} bytes, {:.2} MiB)",
        (N * entry_bytes) as f64 / 1_048_576.0,
        dead.len(),
        dead_usage as f64 / dead.len().max(1) as f64,
        mem1 - mem0,
        (mem1 - mem0) as f64 / 1_048_576.0
    );
    assert_eq!(dead.len(), N, "every entry dead-lettered");
    let first = &dead[0].fields;
    assert_eq!(first["dead_bytes"], entry_bytes.to_string(), "{first:?}");
    assert_eq!(first["dead_truncated"], "1");
    assert_eq!(
        first["reply_to"], "orders:jobs",
        "the first fields are kept whole"
    );
    assert!(first["junk1"].len() < 1_024, "the cut field");
    assert!(
        !first.contains_key("junk2"),
        "fields past the budget are left out"
    );
    // At most 2 KiB a dead letter (1 KiB of the entry, the reason, the
    // stream's own overhead), against the 16 KiB each kept before.
    let cap = N as i64 * 2_048;
    assert!(
        dead_usage < cap && mem1 - mem0 < cap,
        "dead letters take {dead_usage} bytes (Redis grew {}), more than {cap}",
        mem1 - mem0
    );
    worker.stop().await;
}

/// Floods 1,000 requests dead-lettered for their `reply_to` and 1,000
/// invalid ones through a `seatgate run` process: its log holds at most
/// `log.repeats_per_minute` lines of each kind a minute (plus one
/// "suppressed" line), and the metric counts every line held back.
#[tokio::test]
async fn repeated_error_lines_are_rate_limited_per_kind() {
    const N: usize = 1_000;
    let TestApp(redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 2).await;
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("worker.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let port = crate::support::free_port();
    let metrics_at = format!("127.0.0.1:{port}");
    let mut cmd = Command::new(BIN);
    cmd.arg("--redis")
        .arg(redis.url())
        .arg("run")
        .env("SEATGATE__METRICS__LISTEN", &metrics_at)
        .env("SEATGATE__STREAM__BLOCK_MS", "100")
        .env("SEATGATE__LOG__REPEATS_PER_MINUTE", "10")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log);
    let _worker = Spawned(cmd.spawn().expect("start seatgate run"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while http_get(&metrics_at, "/ready").await.map(|(c, _)| c) != Some(200) {
        assert!(Instant::now() < deadline, "worker did not become ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let started = Instant::now();
    let replies = reply_stream(&settings, "shared");
    let last = flood(&mut con, &settings, 2 * N, |i| {
        if i % 2 == 0 {
            vec![
                field("op", "acquire"),
                field("license", "lic"),
                field("session", format!("s{i}")),
                field("reply_to", "orders:jobs"),
            ]
        } else {
            vec![
                field("op", "steal"),
                field("license", "lic"),
                field("session", format!("s{i}")),
                field("reply_to", replies.clone()),
            ]
        }
    })
    .await;
    drained(&mut con, &settings, &last, Duration::from_secs(120)).await;
    let took = started.elapsed();
    // The entries are acknowledged; the last lines and counts may follow
    // them by a moment: read until every dead letter is a line or a count
    // (or the deadline; the assertions below then say what is missing).
    let read = || async {
        let page = http_get(&metrics_at, "/metrics")
            .await
            .map(|(_, b)| b)
            .unwrap_or_default();
        let mut text = String::new();
        std::fs::File::open(&log_path)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        (page, text)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let (page, text) = loop {
        let (page, text) = read().await;
        let lines = text
            .lines()
            .filter(|l| l.contains("request moved to the dead-letter stream"))
            .count();
        let held = metric(
            &page,
            "seatgate_log_lines_suppressed_total{kind=\"refused_reply_to\"}",
        )
        .unwrap_or(0.0);
        if held as usize + lines >= N || Instant::now() > deadline {
            break (page, text);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let lines = |needle: &str| text.lines().filter(|l| l.contains(needle)).count();
    let (dead_lines, invalid_lines) = (
        lines("request moved to the dead-letter stream"),
        lines("invalid request"),
    );
    let suppressed = |kind: &str| {
        metric(
            &page,
            &format!("seatgate_log_lines_suppressed_total{{kind=\"{kind}\"}}"),
        )
        .unwrap_or(0.0)
    };
    println!(
        "log flood: {N} dead letters and {N} invalid requests in {took:.1?}; \
         log {} bytes, {} lines: {dead_lines} dead-letter lines ({} held back), \
         {invalid_lines} invalid-request lines ({} held back)",
        text.len(),
        text.lines().count(),
        suppressed("refused_reply_to"),
        suppressed("invalid_request"),
    );
    // At most 10 a minute each; the flood may straddle one window's end.
    let windows = 1 + took.as_secs() as usize / 60;
    assert!(
        (1..=10 * (windows + 1)).contains(&dead_lines),
        "{dead_lines} dead-letter lines:\n{text}"
    );
    assert!(
        (1..=10 * (windows + 1)).contains(&invalid_lines),
        "{invalid_lines} invalid-request lines"
    );
    assert_eq!(
        suppressed("refused_reply_to") as usize + dead_lines,
        N,
        "every line held back is counted"
    );
    assert!(
        text.len() < 40_000,
        "{} bytes of log for {} bad requests",
        text.len(),
        2 * N
    );
}

/// Floods a one-seat license with 1,000 waiters at priority 9 asking to
/// wait a day: `queue.max_wait_ms` (here 3 s) caps each wait, so the queue
/// and its memory are gone again a few seconds later instead of a day.
#[tokio::test]
async fn waiters_asking_for_a_day_are_held_to_the_longest_wait() {
    const N: usize = 1_000;
    let TestApp(_redis, mut settings, mut con) = spawn_app().await;
    settings.queue.max_wait_ms = 3_000;
    settings.limits.session_requests = 0;
    put_license(&settings, "lic", 1).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let _reaper = reaping(&settings).await;
    let client = client(&settings).await;
    take_the_seat(&client).await;
    let replies = reply_stream(&settings, "waiters");
    // The reply stream exists before the baseline, so only the queue counts.
    let (mem0, keys0) = (used_memory(&mut con).await, dbsize(&mut con).await);
    let lic0 = license_bytes(&mut con, &settings, "lic").await;
    let started = Instant::now();
    let last = flood(&mut con, &settings, N, |i| {
        vec![
            field("id", format!("w-{i}")),
            field("op", "acquire"),
            field("license", "lic"),
            field("session", format!("waiter-{i}")),
            field("lease", crate::support::lease_of(&format!("waiter-{i}"))),
            field("wait_ms", "86400000"),
            field("priority", "9"),
            field("reply_to", replies.clone()),
        ]
    })
    .await;
    drained(&mut con, &settings, &last, Duration::from_secs(60)).await;
    let lic = crate::support::license_keys(&settings, "lic");
    let queued: usize = redis::cmd("ZCARD")
        .arg(&lic.queue)
        .query_async(&mut con)
        .await
        .unwrap();
    let mem_peak = used_memory(&mut con).await;
    let lic_peak = license_bytes(&mut con, &settings, "lic").await;
    // Every waiter's wait ends within the cap (plus reaper passes).
    let deadline = Instant::now() + Duration::from_secs(30);
    let timeouts = loop {
        let answers = stream_entries(&mut con, &replies).await;
        let timeouts = answers
            .iter()
            .filter(|r| r.fields["status"] == Status::QueueTimeout.as_str())
            .count();
        if timeouts == N || Instant::now() > deadline {
            break timeouts;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let took = started.elapsed();
    // The replies are the callers' to read; what is left is seatgate's.
    let _: i64 = redis::cmd("DEL")
        .arg(&replies)
        .query_async(&mut con)
        .await
        .unwrap();
    trim_requests(&mut con, &settings).await;
    let left: usize = redis::cmd("ZCARD")
        .arg(&lic.queue)
        .query_async(&mut con)
        .await
        .unwrap();
    let (mem1, keys1) = (used_memory(&mut con).await, dbsize(&mut con).await);
    let lic1 = license_bytes(&mut con, &settings, "lic").await;
    println!(
        "waiter flood: {N} waiters at priority 9 asking for 86400000 ms, queue.max_wait_ms 3000; \
         queued {queued}, used_memory {mem0} -> {mem_peak} at the peak (+{} bytes, {} per waiter), \
         the license's keys {lic0} -> {lic_peak} bytes; {timeouts} QUEUE_TIMEOUT within {took:.1?}; \
         then {left} waiting, the license's keys {lic1} bytes, keys {keys0} -> {keys1}, \
         used_memory {mem1} (+{} over the baseline: the requests' dedupe records, which expire \
         within two dedupe windows, and their events, kept events.retention)",
        mem_peak - mem0,
        (mem_peak - mem0) / N as i64,
        mem1 - mem0
    );
    assert_eq!(queued, N, "every waiter queued");
    assert_eq!(timeouts, N, "every wait cut to queue.max_wait_ms");
    assert_eq!(left, 0, "the queue is empty again");
    assert!(
        took < Duration::from_secs(30),
        "the waits ended within the cap, not a day"
    );
    // The queue's own memory is gone again (the license's keys within
    // 1 KiB of where they were); dedupe records and events are other bounds.
    assert!(
        lic1 - lic0 < 1_024,
        "the license's keys still hold {} of the {} bytes the queue took",
        lic1 - lic0,
        lic_peak - lic0
    );
    assert_eq!(holders(&settings, "lic").await, ["holder"]);
    worker.stop().await;
}

/// A stand-in for the seat scripts' `denied` event: one denial, through
/// lua/includes/denial_sample.lua, appended to a test events stream when it
/// is to be recorded (with the count it carries). `flush` takes out what a
/// quiet license's ended window folded.
const DENIAL_SCRIPT: &str = r#"local rcall = redis.call
--- @include "denial_sample"
local now = tonumber(ARGV[2])
if ARGV[1] == 'flush' then
  local folded = denial_flush(KEYS[1], now)
  return folded
end
local record, folded = denial_sample(KEYS[1], now, tonumber(ARGV[3]), tonumber(ARGV[4]))
if record == 1 then
  rcall('XADD', KEYS[2], '*', 'type', 'denied', 'license', 'lic', 'session', ARGV[5],
    'seats_used', '1', 'seats_total', '1', 'at_ms', now, 'reason', 'NO_SEATS_AVAILABLE', 'folded', folded)
end
return {record, folded}
"#;

/// Denials past a rate (lua/includes/denial_sample.lua, on its own; the
/// flood through a worker is the test after this one). 10,000 denials of one
/// license over ten 1 s windows, recorded one by one (keep 0, as today) and
/// then at most 20 a window: the events stream grows by a bounded number of
/// events, and every denial is accounted for (recorded, carried in a later
/// event's `folded`, or flushed once its window ended).
#[tokio::test]
async fn denials_past_a_rate_are_folded_into_a_count() {
    const N: i64 = 10_000;
    const WINDOW: i64 = 1_000;
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    let script = redis::Script::new(&seatgate_core::scripts::with_includes(DENIAL_SCRIPT).unwrap());
    let window = crate::support::keys(&settings).denials("lic");
    let mut figures = Vec::new();
    for keep in [0, 20] {
        let events = format!("{}:test-events:{keep}", settings.keys.prefix);
        let mem0 = used_memory(&mut con).await;
        let t0 = 1_796_000_000_000_i64;
        let (mut recorded, mut carried) = (0, 0);
        for i in 0..N {
            // 1,000 a second: ten windows.
            let now = t0 + i * WINDOW * 10 / N;
            let (record, folded): (i64, i64) = script
                .key(&window)
                .key(&events)
                .arg("sample")
                .arg(now)
                .arg(WINDOW)
                .arg(keep)
                .arg(format!("s{i}"))
                .invoke_async(&mut con)
                .await
                .unwrap();
            recorded += record;
            carried += folded;
        }
        // Within the last window nothing is flushed; after it, what it folded.
        let last = t0 + 10 * WINDOW - 1;
        let early: i64 = script
            .key(&window)
            .key(&events)
            .arg("flush")
            .arg(last)
            .invoke_async(&mut con)
            .await
            .unwrap();
        let flushed: i64 = script
            .key(&window)
            .key(&events)
            .arg("flush")
            .arg(last + WINDOW)
            .invoke_async(&mut con)
            .await
            .unwrap();
        let again: i64 = script
            .key(&window)
            .key(&events)
            .arg("flush")
            .arg(last + 2 * WINDOW)
            .invoke_async(&mut con)
            .await
            .unwrap();
        let stream_bytes: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&events)
            .query_async(&mut con)
            .await
            .unwrap();
        let window_bytes: Option<i64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&window)
            .query_async(&mut con)
            .await
            .unwrap();
        let mem1 = used_memory(&mut con).await;
        println!(
            "denial flood, keep {keep} per {WINDOW} ms: {N} denials -> {recorded} events ({carried} folded \
             denials carried by them, {flushed} flushed after the last window); events stream {stream_bytes} bytes, \
             window HASH {} bytes; used_memory {mem0} -> {mem1} (+{} bytes)",
            window_bytes.unwrap_or(0),
            mem1 - mem0
        );
        assert_eq!(
            (early, again),
            (0, 0),
            "flushed only once the window ended, and once"
        );
        assert_eq!(recorded + carried + flushed, N, "every denial accounted for");
        assert_eq!(xlen(&mut con, &events).await as i64, recorded);
        if keep == 0 {
            assert_eq!(recorded, N, "keep 0 records every denial");
            assert_eq!(window_bytes, None, "and keeps no window");
        } else {
            assert!(
                recorded <= keep * 11,
                "at most {keep} events per window (ten windows and a partial one): {recorded}"
            );
        }
        figures.push((stream_bytes, mem1 - mem0));
        let _: i64 = redis::cmd("DEL")
            .arg(&window)
            .query_async(&mut con)
            .await
            .unwrap();
    }
    assert!(
        figures[1].0 * 20 < figures[0].0,
        "the sampled events take a twentieth of the bytes at most: {figures:?}"
    );
}

/// Denials past a rate, through a real worker and reaper: 10,000 acquires
/// refused by a full one-seat license, `events.denials_per_window` 20 per
/// 1 s window. The events stream holds at most 20 `denied` events per window
/// (plus one aggregate per window the reaper flushes), every denial is
/// accounted for (the recorded ones plus the `folded` counts sum to the
/// denials sent), and the license's `seq` stays gapless: a folded denial
/// takes none.
#[tokio::test]
async fn denials_through_a_worker_are_bounded_and_all_accounted_for() {
    const N: usize = 10_000;
    const KEEP: u64 = 20;
    const WINDOW: u64 = 1_000;
    let TestApp(_redis, mut settings, mut con) = spawn_app().await;
    settings.limits.session_requests = 0;
    settings.limits.license_requests = 0;
    settings.events.denials_window_ms = WINDOW;
    settings.events.denials_per_window = KEEP;
    put_license(&settings, "lic", 1).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let _reaper = reaping(&settings).await;
    let client = client(&settings).await;
    take_the_seat(&client).await;
    let events = settings.events_stream_for("lic");
    let replies = reply_stream(&settings, "denied");
    let (mem0, events0) = (used_memory(&mut con).await, xlen(&mut con, &events).await);
    let started = Instant::now();
    let last = flood(&mut con, &settings, N, |i| {
        vec![
            field("id", format!("d-{i}")),
            field("op", "acquire"),
            field("license", "lic"),
            field("session", format!("denied-{i}")),
            field("lease", crate::support::lease_of(&format!("denied-{i}"))),
            field("user", "flooder"),
            field("reply_to", replies.clone()),
        ]
    })
    .await;
    drained(&mut con, &settings, &last, Duration::from_secs(120)).await;
    let flood_took = started.elapsed();
    let answers = stream_entries(&mut con, &replies).await;
    let refused = answers
        .iter()
        .filter(|r| r.fields["status"] == Status::NoSeatsAvailable.as_str())
        .count();
    // The reaper flushes the last window's count once it has ended.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (denied, recorded, aggregates, folded) = loop {
        let entries = stream_entries(&mut con, &events).await;
        let denied: Vec<&crate::support::Entry> = entries
            .iter()
            .filter(|e| e.fields.get("license").map(String::as_str) == Some("lic"))
            .filter(|e| e.fields["type"] == "denied")
            .collect();
        let folded: u64 = denied
            .iter()
            .map(|e| e.fields.get("folded").map_or(0, |f| f.parse::<u64>().unwrap()))
            .sum();
        let aggregates = denied.iter().filter(|e| e.fields["session"].is_empty()).count();
        let recorded = denied.len() - aggregates;
        if recorded as u64 + folded >= N as u64 || Instant::now() > deadline {
            break (denied.len(), recorded, aggregates, folded);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let entries = stream_entries(&mut con, &events).await;
    let mut seqs: Vec<u64> = entries
        .iter()
        .filter(|e| e.fields.get("license").map(String::as_str) == Some("lic"))
        .map(|e| e.fields["seq"].parse().unwrap())
        .collect();
    let in_order = seqs.windows(2).all(|w| w[0] < w[1]);
    seqs.sort_unstable();
    let gapless = seqs.iter().enumerate().all(|(i, s)| *s == i as u64 + 1);
    for e in entries
        .iter()
        .filter(|e| e.fields["type"] == "denied" && !e.fields["session"].is_empty())
    {
        assert_eq!(e.fields["reason"], "NO_SEATS_AVAILABLE");
        assert_eq!(e.fields.get("user").map(String::as_str), Some("flooder"));
    }
    for e in entries
        .iter()
        .filter(|e| e.fields["type"] == "denied" && e.fields["session"].is_empty())
    {
        assert!(
            !e.fields.contains_key("reason"),
            "an aggregate names no reason: {:?}",
            e.fields
        );
        assert!(e.fields["folded"].parse::<u64>().unwrap() > 0);
    }
    let stream_bytes: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(&events)
        .query_async(&mut con)
        .await
        .unwrap();
    let _: i64 = redis::cmd("DEL")
        .arg(&replies)
        .query_async(&mut con)
        .await
        .unwrap();
    trim_requests(&mut con, &settings).await;
    let mem1 = used_memory(&mut con).await;
    let events1 = xlen(&mut con, &events).await;
    let windows = flood_took.as_millis() as u64 / WINDOW + 2;
    println!(
        "denial flood through a worker, events.denials_per_window {KEEP} per {WINDOW} ms: {N} acquires refused \
         ({refused} NO_SEATS_AVAILABLE replies) within {flood_took:.1?} -> {denied} denied events ({recorded} \
         recorded one by one, {aggregates} aggregates flushed by the reaper; {folded} denials folded into \
         their counts); events stream {events0} -> {events1} entries, {stream_bytes} bytes ({} per event); \
         used_memory {mem0} -> {mem1} (+{} bytes, the requests' dedupe records included)",
        stream_bytes / events1.max(1) as i64,
        mem1 - mem0
    );
    assert_eq!(refused, N, "every acquire refused");
    assert_eq!(recorded as u64 + folded, N as u64, "every denial accounted for");
    assert!(
        recorded as u64 <= KEEP * windows,
        "at most {KEEP} denials recorded per window over {windows} windows: {recorded}"
    );
    assert!(
        aggregates as u64 <= windows,
        "at most one aggregate per window: {aggregates}"
    );
    assert!(in_order, "the license's events are in seq order");
    assert!(
        gapless,
        "seq is gapless: a folded denial takes none ({} events)",
        seqs.len()
    );
    assert_eq!(holders(&settings, "lic").await, ["holder"]);
    worker.stop().await;
}

/// Floods a full one-seat license with 1,000 waits by one user at priority
/// 9 under `queue_max_per_user` 5: five queue, the rest are refused
/// NO_SEATS_AVAILABLE naming the quota, and the license's keys grow by five
/// waiters' worth, not a thousand.
#[tokio::test]
async fn one_users_waiters_are_held_to_the_queue_quota() {
    const N: usize = 1_000;
    const QUOTA: u64 = 5;
    let TestApp(_redis, mut settings, mut con) = spawn_app().await;
    settings.limits.session_requests = 0;
    settings.limits.license_requests = 0;
    put_license(&settings, "lic", 1).await;
    let policy = seatgate_core::policy::LicensePolicy {
        queue_max_per_user: Some(QUOTA),
        ..Default::default()
    };
    crate::support::put_policy(&settings, "lic", &policy).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let client = client(&settings).await;
    take_the_seat(&client).await;
    let replies = reply_stream(&settings, "quota");
    let (mem0, lic0) = (
        used_memory(&mut con).await,
        license_bytes(&mut con, &settings, "lic").await,
    );
    let last = flood(&mut con, &settings, N, |i| {
        vec![
            field("id", format!("q-{i}")),
            field("op", "acquire"),
            field("license", "lic"),
            field("session", format!("waiter-{i}")),
            field("lease", crate::support::lease_of(&format!("waiter-{i}"))),
            field("user", "mallory"),
            field("wait_ms", "3600000"),
            field("priority", "9"),
            field("reply_to", replies.clone()),
        ]
    })
    .await;
    drained(&mut con, &settings, &last, Duration::from_secs(60)).await;
    let answers = stream_entries(&mut con, &replies).await;
    let count = |status: Status| {
        answers
            .iter()
            .filter(|r| r.fields["status"] == status.as_str())
            .count()
    };
    let (queued, refused) = (count(Status::Queued), count(Status::NoSeatsAvailable));
    let quota_errors = answers
        .iter()
        .filter(|r| {
            r.fields
                .get("error")
                .is_some_and(|e| e.contains("user mallory") && e.contains("queue_max_per_user"))
        })
        .count();
    let lic = crate::support::license_keys(&settings, "lic");
    let waiting: usize = redis::cmd("ZCARD")
        .arg(&lic.queue)
        .query_async(&mut con)
        .await
        .unwrap();
    let count_field: Option<String> = redis::cmd("HGET")
        .arg(&lic.owners)
        .arg("w:mallory")
        .query_async(&mut con)
        .await
        .unwrap();
    let lic1 = license_bytes(&mut con, &settings, "lic").await;
    let _: i64 = redis::cmd("DEL")
        .arg(&replies)
        .query_async(&mut con)
        .await
        .unwrap();
    trim_requests(&mut con, &settings).await;
    let mem1 = used_memory(&mut con).await;
    println!(
        "waiter quota flood: {N} waits by one user at priority 9, queue_max_per_user {QUOTA}: {queued} queued, \
         {refused} refused NO_SEATS_AVAILABLE ({quota_errors} naming the quota); the license's keys {lic0} -> \
         {lic1} bytes (+{}); used_memory {mem0} -> {mem1} (+{} bytes: the requests' dedupe records, which \
         expire within two dedupe windows, and the denials' events, at most events.denials_per_window a window)",
        lic1 - lic0,
        mem1 - mem0
    );
    assert_eq!(queued, QUOTA as usize, "the quota's waiters queue");
    assert_eq!(refused, N - QUOTA as usize, "the rest are refused");
    assert_eq!(quota_errors, refused, "each refusal names the user's quota");
    assert_eq!(waiting, QUOTA as usize);
    assert_eq!(count_field.as_deref(), Some("5"), "the user's waiter count");
    assert!(
        lic1 - lic0 < 4_096,
        "five waiters' worth of the license's keys, not a thousand: +{} bytes",
        lic1 - lic0
    );
    assert_eq!(holders(&settings, "lic").await, ["holder"]);
    worker.stop().await;
}

/// A denial window's first fold files the license due at the window's end
/// (the outcome's due time, which the worker files); a reaper pass before
/// then records nothing and keeps it due then, one after it records the
/// aggregate `denied` (no session, no reason, `folded`) with the next seq.
#[tokio::test]
async fn a_folded_denial_makes_the_license_due_at_its_windows_end() {
    const WINDOW: u64 = 400;
    let TestApp(_redis, mut settings, mut con) = spawn_app().await;
    settings.events.denials_window_ms = WINDOW;
    settings.events.denials_per_window = 2;
    put_license(&settings, "lic", 1).await;
    let direct = |session: &str| crate::support::direct(&settings, "lic", session);
    assert_eq!(
        direct("holder").acquire(&mut con).await.decision.status(),
        Status::Acquired
    );
    let due = seatgate::runtime::due::DueIndex::new(&settings);
    // Only the reaper's own filings from here on.
    let _: i64 = redis::cmd("DEL")
        .arg(due.shard_for("lic").due)
        .query_async(&mut con)
        .await
        .unwrap();
    let mut outcomes = Vec::new();
    for i in 0..4 {
        let o = direct(&format!("d{i}")).acquire(&mut con).await;
        assert_eq!(o.decision.status(), Status::NoSeatsAvailable);
        outcomes.push(o);
    }
    let window_start = outcomes[0].now_ms;
    assert_eq!(outcomes[0].due_ms, None, "a recorded denial files nothing");
    assert_eq!(outcomes[1].due_ms, None);
    assert_eq!(
        outcomes[2].due_ms,
        Some(window_start + WINDOW as i64),
        "the window's first fold: due at its end"
    );
    assert_eq!(outcomes[3].due_ms, None, "filed once per window");
    let denied = |entries: &[crate::support::Entry]| -> Vec<(String, String, String)> {
        entries
            .iter()
            .filter(|e| e.fields["type"] == "denied")
            .map(|e| {
                let get = |f: &str| e.fields.get(f).cloned().unwrap_or_default();
                (get("session"), get("folded"), get("seq"))
            })
            .collect()
    };
    let events = crate::support::events(&settings, "lic").await;
    assert_eq!(
        denied(&events),
        [
            ("d0".into(), String::new(), "2".into()),
            ("d1".into(), String::new(), "3".into())
        ],
        "two recorded, two folded with no seq"
    );
    // Filed as the worker files it; a pass before the window's end records
    // nothing and leaves the license due at the end.
    let _: i64 = due
        .file_due("lic", outcomes[2].due_ms.unwrap())
        .query_async(&mut con)
        .await
        .unwrap();
    let reaper = crate::support::reaper(&settings).await;
    let _ = reaper.pass().await.unwrap();
    let score: Option<i64> = redis::cmd("ZSCORE")
        .arg(due.shard_for("lic").due)
        .arg("lic")
        .query_async(&mut con)
        .await
        .unwrap();
    let now = crate::support::redis_ms(&mut con).await;
    if now < window_start + WINDOW as i64 {
        assert_eq!(denied(&crate::support::events(&settings, "lic").await).len(), 2);
        assert_eq!(
            score,
            Some(window_start + WINDOW as i64),
            "still due at the window's end"
        );
    }
    tokio::time::sleep(Duration::from_millis(WINDOW + 50)).await;
    let _ = reaper.pass().await.unwrap();
    let events = crate::support::events(&settings, "lic").await;
    assert_eq!(
        denied(&events)[2..],
        [(String::new(), "2".into(), "4".into())],
        "the aggregate of the two folded denials, seq gapless"
    );
    let aggregate = events.iter().rfind(|e| e.fields["type"] == "denied").unwrap();
    assert!(!aggregate.fields.contains_key("reason"));
    // Flushed once: another pass records nothing more.
    let _ = reaper.pass().await.unwrap();
    assert_eq!(denied(&crate::support::events(&settings, "lic").await).len(), 3);
}

/// A heartbeat's denial (RATE_LIMITED) is sampled like an acquire's, and
/// its first fold in a window reports the window's end as the license's
/// due time too (heartbeat.lua fills in its due slots itself).
#[tokio::test]
async fn a_heartbeats_folded_denial_makes_the_license_due_too() {
    let TestApp(_redis, mut settings, mut con) = spawn_app().await;
    settings.events.denials_window_ms = 60_000;
    settings.events.denials_per_window = 1;
    put_license(&settings, "lic", 1).await;
    let holder = crate::support::direct(&settings, "lic", "holder");
    assert_eq!(holder.acquire(&mut con).await.decision.status(), Status::Acquired);
    let keys = crate::support::keys(&settings);
    let mut guard = seatgate_core::request::Guard::none(&keys, "lic", "holder");
    (guard.session_limit, guard.window_ms) = (1, 60_000);
    let limited = holder.with_guard(guard);
    let beats = [
        limited.heartbeat(&mut con).await,
        limited.heartbeat(&mut con).await,
        limited.heartbeat(&mut con).await,
        limited.heartbeat(&mut con).await,
    ];
    let statuses: Vec<Status> = beats.iter().map(|o| o.decision.status()).collect();
    assert_eq!(
        statuses,
        [
            Status::HeartbeatUpdated,
            Status::RateLimited,
            Status::RateLimited,
            Status::RateLimited
        ]
    );
    assert_eq!(beats[1].due_ms, None, "recorded");
    assert_eq!(beats[2].due_ms, Some(beats[1].now_ms + 60_000), "the first fold");
    assert_eq!(beats[3].due_ms, None);
    let events = crate::support::events(&settings, "lic").await;
    let denied: Vec<_> = events.iter().filter(|e| e.fields["type"] == "denied").collect();
    assert_eq!(denied.len(), 1, "one recorded, two folded");
    assert_eq!(denied[0].fields["reason"], "RATE_LIMITED");
}

/// ops/redis.conf's settings that bound one command (`proto-max-bulk-len`,
/// `client-query-buffer-limit`), as `--name value` arguments for a test Redis.
fn shipped_command_bounds() -> Vec<String> {
    let conf = std::fs::read_to_string(crate::support::repo_file("ops/redis.conf")).expect("ops/redis.conf");
    let mut args = Vec::new();
    for line in conf.lines() {
        let mut words = line.split_whitespace();
        if let (Some(name @ ("proto-max-bulk-len" | "client-query-buffer-limit")), Some(value)) =
            (words.next(), words.next())
        {
            args.push(format!("--{name}"));
            args.push(value.to_owned());
        }
    }
    assert_eq!(args.len(), 4, "ops/redis.conf bounds both: {args:?}");
    args
}

/// Oversize values (issue 35, M3): under ops/redis.conf's bounds no client
/// can put a 50 MB value on a requests stream, so no worker reads one into
/// memory and Redis does not fill with it; a request of the protocol's
/// largest size still passes, and the worker serves on. (An entry of many
/// fields, each under the bound, is not refused by Redis: the worker reads
/// it once and answers it INVALID_REQUEST past `limits.max_entry_bytes`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_redis_conf_refuses_an_oversize_entry_and_the_worker_serves_on() {
    let bounds = shipped_command_bounds();
    let bounds: Vec<&str> = bounds.iter().map(String::as_str).collect();
    let TestApp(redis, s, mut con) = crate::support::spawn_app_with(&bounds).await;
    put_license(&s, "cad", 1).await;
    let worker = spawn_worker(s.clone(), "w1").await;
    let before = used_memory(&mut con).await;
    let url = redis.url();
    let attempt = |fields: Vec<(String, Vec<u8>)>| {
        let url = url.clone();
        let stream = s.stream.requests.clone();
        async move {
            let mut raw = redis::Client::open(url)
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let mut xadd = redis::cmd("XADD");
            xadd.arg(&stream).arg("*");
            for (k, v) in fields {
                xadd.arg(k).arg(v);
            }
            xadd.query_async::<String>(&mut raw).await
        }
    };
    let one_big = attempt(vec![field("op", "acquire"), field("meta", vec![b'x'; 50 << 20])]).await;
    assert!(one_big.is_err(), "a 50 MB value was stored: {one_big:?}");
    let just_over = attempt(vec![
        field("op", "acquire"),
        field("meta", vec![b'x'; (1 << 20) + 1]),
    ])
    .await;
    assert!(
        just_over.is_err(),
        "a value of 1 MB and a byte was stored: {just_over:?}"
    );
    assert_eq!(
        xlen(&mut con, &s.stream.requests).await,
        0,
        "nothing reached the stream"
    );
    let grew = used_memory(&mut con).await - before;
    println!("oversize entries refused; used_memory grew {grew} bytes");
    assert!(grew < 1 << 20, "Redis grew {grew} bytes");

    // The largest entry the protocol takes still goes through, and the
    // worker answers as before.
    let meta = format!("{{\"pad\":\"{}\"}}", "z".repeat(4_000));
    let c = client(&s).await;
    let reply = c
        .call(
            &Call::acquire("cad", "s1").with_meta(crate::support::json(&meta)),
            T,
        )
        .await
        .unwrap();
    assert_eq!(reply.status(), Status::Acquired, "{reply:?}");
    worker.stop().await;
}

/// `events.denials_per_window = 0` records every denial as its own event
/// (as config/default.toml says), folding none and filing nothing due.
#[tokio::test]
async fn no_denial_sampling_records_every_denial() {
    let TestApp(_redis, mut settings, mut con) = spawn_app().await;
    settings.events.denials_per_window = 0;
    put_license(&settings, "lic", 1).await;
    let direct = |session: &str| crate::support::direct(&settings, "lic", session);
    assert_eq!(
        direct("holder").acquire(&mut con).await.decision.status(),
        Status::Acquired
    );
    for i in 0..3 {
        let o = direct(&format!("d{i}")).acquire(&mut con).await;
        assert_eq!(o.decision.status(), Status::NoSeatsAvailable);
        assert_eq!(o.due_ms, None, "nothing folded, nothing due");
    }
    let denied: Vec<(String, String)> = crate::support::events(&settings, "lic")
        .await
        .iter()
        .filter(|e| e.fields["type"] == "denied")
        .map(|e| {
            (
                e["session"].clone(),
                e.fields.get("folded").cloned().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        denied,
        [("d0", ""), ("d1", ""), ("d2", "")].map(|(s, f)| (s.to_owned(), f.to_owned()))
    );
}
