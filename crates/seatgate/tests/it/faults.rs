//! Crash safety, Redis faults and hostile input: nothing lost, nothing overbooked.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::future::Future;

use seatgate::config::Settings;
use seatgate_client::Call;
use seatgate_core::status::Status;
use tokio_util::sync::CancellationToken;

use crate::support::{
    add_request, client, consumers, create_group, db, direct, events, free_memory, holders, http_get,
    lease_of, license_keys, metric, output, pending, put_license, reaper, redis_ms, reply_stream,
    request_xadd, run_out_of_memory, seatgate_cmd, spawn_app, spawn_app_with, spawn_worker, stream_entries,
    take, watch_holders, Consumer, Direct, TestApp, WorkerProcess, T,
};

/// A worker crashed after its script ran but before it replied: another
/// worker claims the entry, and the redelivery has the effect of one.
#[tokio::test]
async fn a_redelivered_entry_has_the_effect_of_one_delivery() {
    let TestApp(_redis, mut settings, mut con) = spawn_app().await;
    settings.stream.claim_idle_ms = 200;
    put_license(&settings, "lic", 2).await;
    // The group exists, and a consumer that will "crash" takes two entries.
    create_group(&settings).await;
    let replies = reply_stream(&settings, "t");
    let acquire = [
        ("op", "acquire"),
        ("id", "a1"),
        ("license", "lic"),
        ("session", "s1"),
        ("lease", &lease_of("s1")),
        ("reply_to", &replies),
    ];
    let acquire_id = add_request(&mut con, &settings, &acquire).await;
    let release = [
        ("op", "release"),
        ("id", "r1"),
        ("license", "lic"),
        ("session", "held"),
        ("lease", &lease_of("held")),
        ("reply_to", &replies),
    ];
    let release_id = add_request(&mut con, &settings, &release).await;
    take(&settings, "crashed", 10).await;
    // "held" already has a seat; the crashed worker ran both scripts, then died.
    direct(&settings, "lic", "held")
        .with_lease(Some(&lease_of("held")))
        .acquire(&mut con)
        .await;
    // As the crashed worker guarded them: keyed by their ids.
    let now = redis_ms(&mut con).await;
    let first = Direct::for_request(&settings, &acquire_id, &acquire, now)
        .acquire(&mut con)
        .await;
    assert_eq!(first.status(), Status::Acquired);
    let first_release = Direct::for_request(&settings, &release_id, &release, now)
        .release(&mut con)
        .await;
    assert_eq!(first_release.status(), Status::Released);

    let worker = spawn_worker(settings.clone(), "survivor").await;
    let deadline = Instant::now() + T;
    while pending(&settings).await > 0 {
        assert!(Instant::now() < deadline, "claimed entries were not answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.stop().await;
    let got = stream_entries(&mut con, &replies).await;
    let by_id: HashMap<&str, &str> = got
        .iter()
        .map(|r| (r["id"].as_str(), r["status"].as_str()))
        .collect();
    assert_eq!(by_id["a1"], "ACQUIRED", "the same outcome, not ALREADY_ACTIVE");
    assert_eq!(by_id["r1"], "RELEASED", "the same outcome, not SESSION_NOT_FOUND");
    assert_eq!(
        holders(&settings, "lic").await,
        ["s1"],
        "one seat taken, one freed, once each"
    );
    // The scripts recorded their events with the changes (the setup's
    // acquire, then the crashed worker's two); the survivor's replays
    // recorded none again.
    let recorded: Vec<(String, String, String)> = events(&settings, "lic")
        .await
        .iter()
        .map(|e| (e["type"].clone(), e["session"].clone(), e["seq"].clone()))
        .collect();
    let expected = [
        ("acquired", "held", "1"),
        ("acquired", "s1", "2"),
        ("released", "held", "3"),
    ];
    assert_eq!(
        recorded,
        expected.map(|(t, s, q)| (t.to_owned(), s.to_owned(), q.to_owned())),
        "a replay records no second event"
    );
}

/// A request whose script fails on every delivery is dead-lettered after
/// max_deliveries, answered ERROR, and never holds back the requests behind it.
#[tokio::test]
async fn a_poison_message_is_dead_lettered_while_the_rest_flow() {
    let TestApp(_redis, mut settings, mut con) = spawn_app().await;
    settings.stream.max_deliveries = 3;
    put_license(&settings, "good", 100).await;
    // A hand-broken key: every script on this license fails with WRONGTYPE.
    let _: () = redis::cmd("SET")
        .arg(license_keys(&settings, "poison").holders)
        .arg("oops")
        .query_async(&mut con)
        .await
        .unwrap();
    let worker = spawn_worker(settings.clone(), "w1").await;
    let replies = reply_stream(&settings, "p");
    add_request(
        &mut con,
        &settings,
        &[
            ("op", "acquire"),
            ("id", "p1"),
            ("license", "poison"),
            ("session", "x"),
            ("lease", &lease_of("x")),
            ("reply_to", &replies),
        ],
    )
    .await;
    let client = client(&settings).await;
    let started = Instant::now();
    for i in 0..20 {
        let r = client
            .call(&Call::acquire("good", format!("s{i}")), T)
            .await
            .unwrap();
        assert_eq!(r.status(), Status::Acquired);
    }
    let flowing = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(10);
    let dead = loop {
        let dead = stream_entries(&mut con, &settings.stream.dead_letter).await;
        if !dead.is_empty() {
            break dead;
        }
        assert!(Instant::now() < deadline, "poison message was not dead-lettered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    worker.stop().await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0]["dead_deliveries"].as_str(), dead[0]["license"].as_str()),
        ("3", "poison")
    );
    assert!(
        dead[0]["dead_reason"].contains("WRONGTYPE"),
        "{:?}",
        dead[0]["dead_reason"]
    );
    let answer = stream_entries(&mut con, &replies).await;
    assert_eq!(answer.len(), 1);
    assert_eq!(
        (answer[0]["status"].as_str(), answer[0]["id"].as_str()),
        ("ERROR", "p1")
    );
    assert_eq!(pending(&settings).await, 0);
    assert!(
        flowing < Duration::from_secs(3),
        "good requests were held back for {flowing:?}"
    );
}

#[tokio::test]
async fn a_client_in_a_retry_loop_is_rate_limited_and_others_are_not() {
    let TestApp(_redis, mut settings, _) = spawn_app().await;
    settings.limits.session_requests = 5;
    put_license(&settings, "lic", 5).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let c = client(&settings).await;
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(c.call(&Call::acquire("lic", "loop"), T).await.unwrap().status());
    }
    assert_eq!(statuses[0], Status::Acquired);
    assert!(
        statuses[1..5].iter().all(|s| *s == Status::AlreadyActive),
        "{statuses:?}"
    );
    assert!(
        statuses[5..].iter().all(|s| *s == Status::RateLimited),
        "{statuses:?}"
    );
    assert_eq!(
        c.call(&Call::acquire("lic", "polite"), T).await.unwrap().status(),
        Status::Acquired
    );
    // Giving a seat back is never limited.
    assert_eq!(
        c.call(&Call::release("lic", "loop"), T).await.unwrap().status(),
        Status::Released
    );
    worker.stop().await;
}

// ---------------------------------------------------------------------------
// Bursts against real processes, with a fault in the middle.

const LICENSES: [&str; 3] = ["alpha", "beta", "gamma"];
const SEATS: usize = 20;

/// What was sent and what came back.
#[derive(Default)]
struct Ledger {
    /// request id -> (license, session, op)
    sent: HashMap<String, (String, String, String)>,
    /// request id -> statuses received, in order
    got: HashMap<String, Vec<String>>,
}

impl Ledger {
    fn finished(&self) -> usize {
        self.got
            .values()
            .filter(|s| s.iter().any(|st| st != "QUEUED"))
            .count()
    }
}

/// Collects every reply on `streams` into the ledger, surviving Redis restarts.
fn collect(
    url: String,
    streams: Vec<String>,
    ledger: Arc<Mutex<Ledger>>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last: Vec<String> = streams.iter().map(|_| "0".to_owned()).collect();
        let client = redis::Client::open(url).unwrap();
        let cfg = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        let mut con = None;
        while !stop.is_cancelled() {
            if con.is_none() {
                match client.get_multiplexed_async_connection_with_config(&cfg).await {
                    Ok(c) => con = Some(c),
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                }
            }
            let Some(c) = con.as_mut() else { continue };
            let mut cmd = redis::cmd("XREAD");
            cmd.arg("COUNT").arg(1000).arg("BLOCK").arg(200).arg("STREAMS");
            cmd.arg(&streams).arg(&last);
            let read: redis::RedisResult<redis::streams::StreamReadReply> = cmd.query_async(c).await;
            let Ok(read) = read else {
                con = None;
                continue;
            };
            let mut ledger = ledger.lock().unwrap();
            for key in read.keys {
                let i = streams.iter().position(|s| *s == key.key).unwrap();
                for entry in key.ids {
                    last[i] = entry.id.clone();
                    let f: HashMap<String, String> = entry
                        .map
                        .into_iter()
                        .map(|(k, v)| (k, redis::from_redis_value::<String>(v).unwrap_or_default()))
                        .collect();
                    ledger
                        .got
                        .entry(f["id"].clone())
                        .or_default()
                        .push(f["status"].clone());
                }
            }
        }
    })
}

/// Sends a burst of `n` mixed requests (acquire, queued acquire, heartbeat,
/// release) over the three licenses, runs `fault` once a tenth of them are
/// answered, waits until every request has a final reply, and checks that
/// the final state is the one the replies imply.
async fn burst_with_fault(s: &Settings, n: usize, fault: impl Future<Output = ()>) {
    let mut con = db(s).await;
    for l in LICENSES {
        put_license(s, l, SEATS as u64).await;
    }
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let reply_streams: Vec<String> = (0..4).map(|i| reply_stream(s, &format!("burst:{i}"))).collect();
    let stop = CancellationToken::new();
    let collector = collect(
        s.redis.url.clone(),
        reply_streams.clone(),
        ledger.clone(),
        stop.clone(),
    );
    let sampler = watch_holders(s, &LICENSES, stop.clone());

    // Ten holders per license before the burst; the burst releases or heartbeats them.
    let c = client(s).await;
    let mut held: HashSet<(String, String)> = HashSet::new();
    for l in LICENSES {
        for i in 0..10 {
            let session = format!("pre-{i}");
            assert_eq!(
                c.call(&Call::acquire(l, &session), T).await.unwrap().status(),
                Status::Acquired
            );
            held.insert((l.to_owned(), session));
        }
    }

    let mut pipe = redis::pipe();
    {
        let mut ledger = ledger.lock().unwrap();
        for i in 0..n {
            let license = LICENSES[i % 3];
            let (op, session, wait) = match i % 10 {
                0 if i / 10 < 30 => ("release", format!("pre-{}", (i / 30) % 10), 0),
                1 if i / 10 < 30 => ("heartbeat", format!("pre-{}", (i / 30) % 10), 0),
                2 | 3 => ("acquire", format!("q-{i}"), 1500),
                _ => ("acquire", format!("n-{i}"), 0),
            };
            let id = format!("req-{i}");
            let mut xadd = request_xadd(s);
            xadd.arg("op")
                .arg(op)
                .arg("id")
                .arg(&id)
                .arg("license")
                .arg(license)
                .arg("session")
                .arg(&session)
                .arg("reply_to")
                .arg(&reply_streams[i % 4])
                .arg("wait_ms")
                .arg(wait);
            // The holders' seats are bound to the leases their acquires
            // carried; a new session brings its own.
            match c.lease(license, &session) {
                Some(lease) => xadd.arg("lease").arg(lease.as_str()),
                None => xadd.arg("lease").arg(lease_of(&session)),
            };
            pipe.add_command(xadd).ignore();
            ledger
                .sent
                .insert(id, (license.to_owned(), session, op.to_owned()));
        }
    }
    let _: () = pipe.query_async(&mut con).await.unwrap();

    let wait_for = |target: usize, within: Duration| {
        let ledger = ledger.clone();
        async move {
            let deadline = Instant::now() + within;
            loop {
                let done = ledger.lock().unwrap().finished();
                if done >= target {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "only {done} of {target} requests answered in {within:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    wait_for(n / 10, Duration::from_secs(30)).await;
    fault.await;
    wait_for(n, Duration::from_secs(60)).await;
    stop.cancel();
    collector.await.unwrap();
    let watch = sampler.await.unwrap();
    assert!(watch.samples > 10, "the sampler ran ({})", watch.samples);
    assert!(
        watch.most.0 <= SEATS,
        "overbooked: {:?} holders of {SEATS}",
        watch.most
    );

    // Every request answered; a repeated reply (a redelivery) repeats the outcome.
    let (sent, got) = {
        let ledger = ledger.lock().unwrap();
        (ledger.sent.clone(), ledger.got.clone())
    };
    let mut implied = held;
    for (id, (license, session, op)) in &sent {
        let statuses = got.get(id).unwrap_or_else(|| panic!("{id} ({op}) got no reply"));
        let finals: Vec<&String> = statuses.iter().filter(|s| *s != "QUEUED").collect();
        assert!(!finals.is_empty(), "{id} has no final reply: {statuses:?}");
        assert!(
            finals.iter().all(|s| *s == finals[0]),
            "{id} got different outcomes: {statuses:?}"
        );
        let key = (license.clone(), session.clone());
        match finals[0].as_str() {
            "ACQUIRED" | "GRANTED" => {
                implied.insert(key);
            }
            "RELEASED" => {
                implied.remove(&key);
            }
            "HEARTBEAT_UPDATED" | "NO_SEATS_AVAILABLE" | "QUEUE_TIMEOUT" | "SESSION_NOT_ACTIVE"
            | "SESSION_NOT_FOUND" => {}
            other => panic!("{id} ({op}): unexpected {other}"),
        }
    }
    for l in LICENSES {
        let mut want: Vec<String> = implied
            .iter()
            .filter(|(lic, _)| lic == l)
            .map(|(_, s)| s.clone())
            .collect();
        want.sort();
        let have = holders(s, l).await;
        assert_eq!(have, want, "license {l}: Redis disagrees with the replies");
        assert!(want.len() <= SEATS);
    }
}

fn burst_env() -> Vec<(&'static str, String)> {
    vec![
        ("SEATGATE__STREAM__CLAIM_IDLE_MS", "500".into()),
        ("SEATGATE__STREAM__BATCH_SIZE", "32".into()),
        ("SEATGATE__REPLIES__MAXLEN", "100000".into()),
        ("SEATGATE__REAPER__SCHEDULE", "* * * * * *".into()),
        ("SEATGATE__REAPER__REDELIVER_AFTER_MS", "1000".into()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_a_worker_mid_burst_loses_nothing_and_overbooks_nothing() {
    let TestApp(redis, settings, _) = spawn_app_with(&["--appendonly", "yes"]).await;
    let mut env = burst_env();
    env.push(("SEATGATE__STREAM__CONSUMER", "victim".into()));
    let mut victim = WorkerProcess::start(&redis.url(), &env).await;
    env.pop();
    env.push(("SEATGATE__STREAM__CONSUMER", "survivor".into()));
    let survivor = WorkerProcess::start(&redis.url(), &env).await;
    let mut left_pending = 0;
    burst_with_fault(&settings, 4000, async {
        // Kill the victim while it holds unacknowledged entries, so that the
        // survivor must claim and answer them.
        let mut con = db(&settings).await;
        let mut victim_pending = async || -> usize {
            redis::cmd("XPENDING")
                .arg(&settings.stream.requests)
                .arg(&settings.stream.group)
                .arg("-")
                .arg("+")
                .arg(1000)
                .arg("victim")
                .query_async::<Vec<redis::Value>>(&mut con)
                .await
                .map(|v| v.len())
                .unwrap_or(0)
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while victim_pending().await == 0 && Instant::now() < deadline {}
        victim.kill9();
        left_pending = victim_pending().await;
    })
    .await;
    let metrics = survivor.scrape().await;
    let claimed = metrics
        .lines()
        .find(|l| l.starts_with("seatgate_claimed_requests_total"))
        .unwrap_or("none");
    eprintln!("kill -9: the victim left {left_pending} entries pending; survivor: {claimed}");
    assert!(left_pending > 0, "the kill was meant to leave work behind");
    assert_eq!(
        pending(&settings).await,
        0,
        "the victim's pending entries were claimed and answered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_and_restarted_mid_burst_loses_nothing() {
    let TestApp(mut redis, settings, _) = spawn_app_with(&["--appendonly", "yes"]).await;
    let env = burst_env();
    let _a = WorkerProcess::start(&redis.url(), &env).await;
    let _b = WorkerProcess::start(&redis.url(), &env).await;
    burst_with_fault(&settings, 4000, async {
        redis.shutdown().await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        redis.restart().await.expect("restart redis");
    })
    .await;
    assert_eq!(pending(&settings).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_burst_is_a_clean_exit_and_the_other_worker_finishes() {
    let TestApp(redis, settings, _) = spawn_app().await;
    let mut env = burst_env();
    env.push(("SEATGATE__STREAM__CONSUMER", "leaving".into()));
    let mut leaving = WorkerProcess::start(&redis.url(), &env).await;
    env.pop();
    env.push(("SEATGATE__STREAM__CONSUMER", "staying".into()));
    let _staying = WorkerProcess::start(&redis.url(), &env).await;
    let mut exit = None;
    burst_with_fault(&settings, 4000, async {
        exit = Some(leaving.terminate(Duration::from_secs(10)).await)
    })
    .await;
    let status = exit.expect("fault ran");
    assert!(status.success(), "SIGTERM exit status {status:?}");
    // Nothing of the stopped worker is left pending: it finished its batch and left the group.
    for Consumer { name, pending, .. } in consumers(&settings).await {
        assert!(
            name != "leaving" || pending == 0,
            "the stopped worker left {pending} entries pending"
        );
    }
    assert_eq!(pending(&settings).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_makes_the_worker_not_ready_and_it_resumes_when_redis_returns() {
    let TestApp(mut redis, settings, _) = spawn_app_with(&["--appendonly", "yes"]).await;
    put_license(&settings, "lic", 1).await;
    let worker = WorkerProcess::start(&redis.url(), &[]).await;
    assert_eq!(worker.status("/ready").await, Some(200));

    redis.shutdown().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while worker.status("/ready").await != Some(503) {
        assert!(
            Instant::now() < deadline,
            "/ready did not turn 503 while Redis was down"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(worker.status("/live").await, Some(200));

    redis.restart().await.expect("restart redis");
    let back = Instant::now();
    while worker.status("/ready").await != Some(200) {
        assert!(back.elapsed() < Duration::from_secs(5), "/ready did not recover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ready_after = back.elapsed();
    let c = client(&settings).await;
    let r = c.call(&Call::acquire("lic", "after"), T).await.unwrap();
    eprintln!(
        "redis outage: ready again {ready_after:?} after restart; first request served {:?} after restart",
        back.elapsed()
    );
    assert_eq!(r.status(), Status::Acquired);
}

/// Redis's memory is exported; a hung Redis (SIGSTOP: the connection stays
/// open, nothing answers, no error comes): `/ready` turns 503 within a few PING deadlines and
/// `seatgate_redis_up` reads 0; once Redis resumes, `/ready` is 200 again
/// and a request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_makes_the_worker_not_ready_and_it_resumes_when_redis_does() {
    let TestApp(redis, settings, _) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    let worker = WorkerProcess::start(&redis.url(), &[]).await;
    // Redis's memory against its limit is read too (none set here: 0).
    let before = worker.scrape().await;
    let used = before
        .lines()
        .find_map(|l| l.strip_prefix("seatgate_redis_memory_used_bytes "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert!(used.is_some_and(|u| u > 100_000.0), "used memory: {before}");
    assert!(before.contains("seatgate_redis_maxmemory_bytes 0"), "{before}");
    let hang = |signal: &str| {
        let ok = std::process::Command::new("kill")
            .args([signal, &redis.pid().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {signal} redis-server");
    };
    hang("-STOP");
    let stopped = Instant::now();
    while worker.status("/ready").await != Some(503) {
        if stopped.elapsed() > Duration::from_secs(10) {
            hang("-CONT");
            panic!("/ready stayed 200 while Redis hung");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let noticed = stopped.elapsed();
    let scrape = worker.scrape().await;
    let why = http_get(&worker.metrics, "/ready").await.map(|(_, body)| body);
    hang("-CONT");
    assert!(
        why.as_deref()
            .is_some_and(|b| b.contains("not ready: Redis does not answer PING within its deadline")),
        "/ready's reason while Redis hung: {why:?}"
    );
    assert!(
        scrape.contains("seatgate_redis_up 0"),
        "redis_up while hung: {scrape}"
    );
    assert_eq!(worker.status("/live").await, Some(200));
    let back = Instant::now();
    while worker.status("/ready").await != Some(200) {
        assert!(back.elapsed() < Duration::from_secs(10), "/ready did not recover");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "hung redis: /ready 503 after {noticed:?}, 200 again {:?} after it resumed",
        back.elapsed()
    );
    let c = client(&settings).await;
    let r = c.call(&Call::acquire("lic", "after"), T).await.unwrap();
    assert_eq!(r.status(), Status::Acquired);
}

/// Redis out of memory (noeviction): the worker reports not-ready, the
/// request is not lost (it stays on the stream or pending), nothing is
/// evicted, and once memory is freed it is answered, with its effect applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_out_of_memory_is_not_ready_and_recovers() {
    let TestApp(_redis, settings, mut con) = spawn_app_with(&["--maxmemory-policy", "noeviction"]).await;
    put_license(&settings, "lic", 2).await;
    // The group and a request exist before memory runs out (under OOM even an XADD is refused).
    create_group(&settings).await;
    let c = client(&settings).await;
    let id = c.send(&Call::acquire("lic", "patient")).await.unwrap();
    run_out_of_memory(&mut con).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while worker.ready.get() {
        assert!(Instant::now() < deadline, "the worker did not report the OOM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let replies: i64 = redis::cmd("XLEN")
        .arg(c.reply_to())
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(replies, 0, "no reply can be written while Redis is out of memory");
    free_memory(&mut con).await;
    let r = c.wait_for(&id, Duration::from_secs(10)).await.unwrap();
    assert_eq!(r.status(), Status::Acquired, "served once memory was freed");
    assert_eq!(holders(&settings, "lic").await, ["patient"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !worker.ready.get() {
        assert!(Instant::now() < deadline, "the worker did not recover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.stop().await;
}

/// Issue 38: Redis full (maxmemory below used_memory, noeviction) refuses
/// every write, and nothing goes blind: `seatgate status` (text and JSON),
/// `/status.json`, `seatgate report` and `seatgate audit` still answer (a
/// MULTI is refused under OOM even when it only reads: the views read in a
/// plain pipeline then); `/ready` is 503 naming OOM, `seatgate_redis_oom`
/// is 1, the worker's log names Redis and OOM in one line; the client's
/// error (the CLI and the Rust client) says Redis is out of memory. Once
/// memory is freed, `/ready` is 200 again and the log says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_out_of_memory_leaves_the_views_working_and_is_named_everywhere() {
    let TestApp(redis, settings, mut con) = spawn_app_with(&["--maxmemory-policy", "noeviction"]).await;
    let url = redis.url();
    let run = |args: &[&str]| output(seatgate_cmd(&url, args));
    let put = run(&["license", "put", "cad", "--seats", "2"]).await;
    assert!(put.status.success(), "{put:?}");
    let log = tempfile::NamedTempFile::new().unwrap();
    let worker = WorkerProcess::start_logging(
        &url,
        &[
            ("SEATGATE__HTTP__PAGE_REFRESH_MS", "200".into()),
            ("RUST_LOG", "info".into()),
        ],
        log.reopen().unwrap(),
    )
    .await;
    let held = run(&["acquire", "--license", "cad", "--session", "s1", "--user", "ada"]).await;
    assert_eq!(held.status.code(), Some(0), "{held:?}");

    run_out_of_memory(&mut con).await;
    let full = Instant::now();
    let ready = loop {
        let (code, body) = http_get(&worker.metrics, "/ready").await.expect("/ready answers");
        if code == 503 {
            break body;
        }
        assert!(
            full.elapsed() < Duration::from_secs(10),
            "/ready stayed 200 under OOM: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let noticed = full.elapsed();
    assert!(
        ready.contains("not ready: Redis refuses writes: OOM")
            && ready.contains("raise maxmemory or free memory"),
        "{ready}"
    );
    let scrape = worker.scrape().await;
    assert_eq!(metric(&scrape, "seatgate_redis_oom"), Some(1.0), "{scrape}");

    // The views answer.
    let status = run(&["status"]).await;
    let text = String::from_utf8_lossy(&status.stdout);
    assert_eq!(status.status.code(), Some(0), "{status:?}");
    assert!(
        text.contains("cad: 1 of 2 seats in use") && text.contains("s1"),
        "{text}"
    );
    let json = run(&["status", "--json"]).await;
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("status --json");
    assert_eq!(json["licenses"][0]["holders"][0]["session"], "s1", "{json}");
    let (code, page) = loop {
        let (code, body) = http_get(&worker.metrics, "/status.json")
            .await
            .expect("/status.json answers");
        // Past the refresh interval of a snapshot taken before memory ran out.
        if full.elapsed() > Duration::from_millis(400) {
            break (code, body);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(code, 200, "/status.json under OOM: {page}");
    assert!(page.contains(r#""license":"cad""#), "{page}");
    let report = run(&["report", "--license", "cad", "--format", "json"]).await;
    assert_eq!(report.status.code(), Some(0), "{report:?}");
    let report: serde_json::Value = serde_json::from_slice(&report.stdout).expect("report json");
    assert_eq!(report["licenses"][0]["license"], "cad", "{report}");
    let audit = run(&["audit"]).await;
    assert_eq!(audit.status.code(), Some(0), "{audit:?}");

    // The client's error names OOM, in one line.
    let refused = run(&["acquire", "--license", "cad", "--session", "s2"]).await;
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(3), "{refused:?}");
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(
        said.contains("Redis is out of memory (OOM)") && said.contains("maxmemory"),
        "{said}"
    );
    let direct = async {
        let c = settings.client().connect().await?;
        c.call(&Call::acquire("cad", "s3"), T).await.map(|r| r.status())
    };
    match direct.await {
        Err(e) => assert!(e.to_string().contains("Redis is out of memory (OOM)"), "{e}"),
        Ok(status) => panic!("an acquire under OOM answered {status:?}"),
    }

    free_memory(&mut con).await;
    let recovered = worker.ready_turns(200, Duration::from_secs(10)).await;
    eprintln!(
        "redis out of memory: /ready 503 naming OOM after {noticed:?}, 200 again {recovered:?} after memory was freed"
    );
    assert_eq!(metric(&worker.scrape().await, "seatgate_redis_oom"), Some(0.0));
    let logged = std::fs::read_to_string(log.path()).unwrap();
    let oom_lines: Vec<&str> = logged
        .lines()
        .filter(|l| {
            l.contains("Redis is out of memory (OOM: used_memory above maxmemory) and refuses writes")
        })
        .collect();
    assert_eq!(oom_lines.len(), 1, "one line names Redis and OOM: {logged}");
    assert!(logged.contains("Redis accepts writes again"), "{logged}");
}

/// The reaper's stream upkeep trims what every consumer acknowledged (never
/// what is pending or undelivered) and removes long-idle empty consumers.
#[tokio::test]
async fn stream_upkeep_trims_acknowledged_entries_and_removes_idle_consumers() {
    let TestApp(_redis, mut settings, mut con) = spawn_app().await;
    settings.stream.consumer_idle_ms = 20;
    create_group(&settings).await;
    let mut ids = Vec::new();
    for i in 0..10 {
        let session = format!("s{i}");
        let fields = [("op", "heartbeat"), ("license", "l"), ("session", &session)];
        ids.push(add_request(&mut con, &settings, &fields).await);
    }
    // "gone" reads 6 and acknowledges them; "busy" reads 2 and holds them; 2 stay undelivered.
    take(&settings, "gone", 6).await;
    let _: i64 = redis::cmd("XACK")
        .arg(&settings.stream.requests)
        .arg(&settings.stream.group)
        .arg(&ids[..6])
        .query_async(&mut con)
        .await
        .unwrap();
    take(&settings, "busy", 2).await;
    tokio::time::sleep(Duration::from_millis(50)).await;

    reaper(&settings).await.maintain_stream().await.unwrap();

    let left: Vec<String> = stream_entries(&mut con, &settings.stream.requests)
        .await
        .into_iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(left, ids[6..], "only acknowledged entries trimmed");
    let names: Vec<String> = consumers(&settings).await.into_iter().map(|c| c.name).collect();
    assert_eq!(
        names,
        ["busy"],
        "the idle consumer with nothing pending is removed, the one holding entries kept"
    );
}
