//! Changing the topology while it serves: `stream.shards` grown from 1 to 4
//! with a rolling restart of real `seatgate run` processes, clients sending
//! throughout, some started before the change (they keep the old count),
//! some after (they read the new one from `seat:config`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use seatgate_client::{Call, Client};
use seatgate_core::status::Status;
use tokio_util::sync::CancellationToken;

use crate::support::{output, put_license, seatgate_cmd, spawn_app, watch_holders, TestApp, WorkerProcess};

/// How long one request may wait for its reply.
const T: Duration = Duration::from_secs(10);

/// What a client loop saw.
#[derive(Default)]
struct Tally {
    answered: AtomicUsize,
    failed: AtomicUsize,
    /// Whether each loop's client sends to a shard (`<requests>:{i}`)
    /// rather than the unsharded stream.
    sharded: std::sync::Mutex<Vec<bool>>,
}

/// A client that reads the deployment's streams from Redis (as a program
/// that names only its Redis does), acquiring and releasing seats of
/// `license` until `stop`; every call must be answered.
fn client_loop(
    url: String,
    license: String,
    tag: String,
    tally: Arc<Tally>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client: Client = Client::builder()
            .url(url)
            .connect()
            .await
            .expect("client connects");
        let sharded = client.requests_stream_for(&license).ends_with('}');
        tally.sharded.lock().unwrap().push(sharded);
        let mut i = 0;
        while !stop.is_cancelled() {
            let session = format!("{tag}-{i}");
            i += 1;
            let acquire = Call::acquire(&license, &session);
            match client.call(&acquire, T).await {
                Ok(reply) => {
                    tally.answered.fetch_add(1, Ordering::Relaxed);
                    if reply.status() == Status::Acquired {
                        match client.call(&Call::release(&license, &session), T).await {
                            Ok(_) => tally.answered.fetch_add(1, Ordering::Relaxed),
                            Err(e) => {
                                eprintln!("release {session}: {e}");
                                tally.failed.fetch_add(1, Ordering::Relaxed)
                            }
                        };
                    }
                }
                Err(e) => {
                    eprintln!("acquire {session}: {e}");
                    tally.failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

/// 1 → 4 shards while serving: a worker with `stream.shards = 4` (and
/// `events.shards = 1`, the events staying put) joins two with 1, records
/// the new count, the old workers are stopped one by one, a second new one
/// starts; clients started before keep writing the unsharded stream, those
/// started after write the shards. Every request is answered, no license is
/// overbooked, a worker still on 1 shard now refuses to start, and the
/// audit of the whole history is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_shards_grow_while_workers_and_clients_keep_running() {
    let TestApp(redis, settings, _) = spawn_app().await;
    let url = redis.url();
    let licenses: Vec<String> = (0..8).map(|i| format!("grow-{i}")).collect();
    for l in &licenses {
        put_license(&settings, l, 2).await;
    }
    let old_env: Vec<(&str, String)> = Vec::new();
    let new_env = vec![
        ("SEATGATE__STREAM__SHARDS", "4".to_owned()),
        ("SEATGATE__EVENTS__SHARDS", "1".to_owned()),
    ];
    let old1 = WorkerProcess::start(&url, &old_env).await;
    let old2 = WorkerProcess::start(&url, &old_env).await;

    let tally = Arc::new(Tally::default());
    let stop = CancellationToken::new();
    let watched: Vec<&str> = licenses.iter().map(String::as_str).collect();
    let sampler = watch_holders(&settings, &watched, stop.clone());
    let mut loops = Vec::new();
    for (i, l) in licenses.iter().enumerate() {
        loops.push(client_loop(
            url.clone(),
            l.clone(),
            format!("old{i}"),
            tally.clone(),
            stop.clone(),
        ));
    }
    let progress = |tally: &Tally| tally.answered.load(Ordering::Relaxed);
    let served = |tally: Arc<Tally>, more: usize| async move {
        let goal = progress(&tally) + more;
        let deadline = Instant::now() + Duration::from_secs(30);
        while progress(&tally) < goal {
            assert!(Instant::now() < deadline, "the clients stopped being answered");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    served(tally.clone(), 200).await;

    // A worker on 4 shards joins and records the new count.
    let new1 = WorkerProcess::start(&url, &new_env).await;
    let mut con = crate::support::db(&settings).await;
    let recorded: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(seatgate_core::keys::Keys::new(settings.keys.prefix.clone()).deployment())
        .arg("shards")
        .arg("events_shards")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(recorded, [Some("4".to_owned()), Some("1".to_owned())]);
    served(tally.clone(), 200).await;

    // Clients started now read 4 shards.
    for (i, l) in licenses.iter().enumerate() {
        loops.push(client_loop(
            url.clone(),
            l.clone(),
            format!("new{i}"),
            tally.clone(),
            stop.clone(),
        ));
    }
    served(tally.clone(), 200).await;

    // The rolling restart: the old workers go (SIGTERM: they finish their
    // batches), a second new one comes.
    let stopped_cleanly = Arc::new(AtomicBool::new(true));
    for mut old in [old1, old2] {
        old.signal("TERM");
        let status = old.exited(Duration::from_secs(20)).await;
        stopped_cleanly.fetch_and(status.is_some_and(|s| s.success()), Ordering::Relaxed);
        served(tally.clone(), 100).await;
    }
    assert!(
        stopped_cleanly.load(Ordering::Relaxed),
        "the old workers stopped cleanly"
    );
    let new2 = WorkerProcess::start(&url, &new_env).await;
    served(tally.clone(), 300).await;

    // A worker still on 1 shard would leave the new streams unread: refused.
    let refused = output(seatgate_cmd(&url, &["run"])).await;
    assert!(!refused.status.success(), "{refused:?}");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("stream.shards is 1") && err.contains("runs with 4"),
        "{err}"
    );

    // Growing again without keeping the events where they are: refused,
    // naming the setting.
    let mut moved = seatgate_cmd(&url, &["run"]);
    moved.env("SEATGATE__STREAM__SHARDS", "8");
    let moved = output(moved).await;
    assert!(!moved.status.success(), "{moved:?}");
    let err = String::from_utf8_lossy(&moved.stderr);
    assert!(err.contains("set events.shards = 1"), "{err}");

    stop.cancel();
    for l in loops {
        l.await.expect("client loop");
    }
    let watch = sampler.await.expect("sampler");
    let seen = tally.sharded.lock().unwrap().clone();
    eprintln!(
        "topology: {} requests answered, {} failed; clients on 1 shard: {}, on 4: {}; most holders of a 2-seat license seen {}",
        progress(&tally),
        tally.failed.load(Ordering::Relaxed),
        seen.iter().filter(|s| !**s).count(),
        seen.iter().filter(|s| **s).count(),
        watch.most.0,
    );
    assert_eq!(tally.failed.load(Ordering::Relaxed), 0, "every request answered");
    assert_eq!(
        seen[..8],
        [false; 8],
        "clients started before the change keep the unsharded stream"
    );
    assert_eq!(
        seen[8..],
        [true; 8],
        "clients started after it send to the shards"
    );
    assert!(watch.most.0 <= 2, "overbooked: {:?}", watch.most);

    // Both the unsharded stream and the shards were used, and drained.
    let mut streams = vec![settings.stream.requests.clone()];
    streams.extend((0..4).map(|i| format!("{}:{{{i}}}", settings.stream.requests)));
    for stream in streams {
        let len: i64 = redis::cmd("XLEN")
            .arg(&stream)
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(len > 0, "{stream} was never written");
    }
    // The history, read with the new settings, audits clean.
    let mut audit = seatgate_cmd(&url, &["audit"]);
    audit.envs(new_env.iter().map(|(k, v)| (*k, v.as_str())));
    let audit = output(audit).await;
    let out = String::from_utf8_lossy(&audit.stdout);
    assert!(
        audit.status.success() && out.starts_with("audit clean:"),
        "{audit:?}"
    );
    drop((new1, new2));
}
