//! Backup and restore under load (issue 38), as docs/backup.md says to do
//! them: a backup taken while real `seatgate run` workers serve clients,
//! the live Redis going on past it and then lost, the backup restored into
//! a fresh Redis on the same address, the service running on. Then
//! `seatgate audit` is clean, and no event id, `(license, epoch, seq)` or
//! the stream entry id, names two different events among those a consumer
//! (`seatgate events --json`) copied out of the live Redis and those in the
//! restored one, although the restore took the licenses' `seq` counters
//! back (checked: else the test would prove nothing).
//!
//! One test per kind of backup: an RDB taken with `redis-cli --rdb` and
//! restored the way backup.md says for a Redis that runs with the AOF on
//! (load it with `appendonly no`, then turn the AOF on), and a copy of the
//! AOF directory.

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use seatgate::config::Settings;
use seatgate_client::{Call, Client};
use seatgate_core::status::Status;
use tokio_util::sync::CancellationToken;

use crate::support::{
    acquire, db, direct, events, output, provision, put_license, seatgate_cmd, seats_with_timeout,
    spawn_app_with, stream_entries, Entry, RedisServer, Spawned, TestApp, WorkerProcess, BIN,
};

/// The licenses under load: fewer seats than sessions, so there are
/// denials as well as acquires, releases and evictions.
const LICENSES: [&str; 4] = ["cad", "sim", "eda", "fpga"];
/// Seats of each.
const SEATS: u64 = 2;
/// Sessions per license, each its own loop.
const SESSIONS: usize = 3;
/// How long each phase of the load runs: before the backup, after it on
/// the live Redis, and after the restore.
const PHASE: Duration = Duration::from_millis(1500);

/// An event as a consumer keeps it: every field, and its stream entry id
/// as `id` (what `seatgate events --json` prints).
type Event = BTreeMap<String, String>;

/// Which backup the test takes and restores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backup {
    /// `redis-cli --rdb <file>`.
    Rdb,
    /// A copy of the AOF directory, automatic rewrites held off meanwhile.
    Aof,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rdb_backup_restored_under_load_audits_clean_and_names_no_event_twice() {
    restore_under_load(Backup::Rdb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aof_backup_restored_under_load_audits_clean_and_names_no_event_twice() {
    restore_under_load(Backup::Aof).await;
}

/// Events of one life of Redis share an epoch; a restart (which lost
/// nothing here: SHUTDOWN flushes the AOF) starts a new one, and `seq`
/// goes on from where it was.
#[tokio::test]
async fn each_life_of_redis_has_an_epoch_of_its_own() {
    let TestApp(mut redis, s, mut con) = spawn_app_with(&["--appendonly", "yes"]).await;
    put_license(&s, "lic", 1).await;
    let ids = |entries: &[Entry]| -> Vec<(String, String)> {
        entries
            .iter()
            .map(|e| (e["epoch"].clone(), e["seq"].clone()))
            .collect()
    };
    for session in ["a", "b"] {
        direct(&s, "lic", session).acquire(&mut con).await;
    }
    let first = ids(&events(&s, "lic").await);
    let epoch = first[0].0.clone();
    assert!(epoch.parse::<u64>().is_ok(), "an epoch is a number: {first:?}");
    assert_eq!(first, [(epoch.clone(), "1".into()), (epoch.clone(), "2".into())]);

    redis.shutdown().await;
    redis.restart().await.expect("restart redis");
    let mut con = db(&s).await;
    direct(&s, "lic", "c").acquire(&mut con).await;
    let after = ids(&events(&s, "lic").await);
    assert_eq!(after.len(), 3, "{after:?}");
    assert_eq!(
        after[..2],
        first[..],
        "the events before the restart are as they were"
    );
    assert_ne!(after[2].0, epoch, "a new life, a new epoch: {after:?}");
    assert_eq!(after[2].1, "3", "seq goes on: {after:?}");
}

async fn restore_under_load(kind: Backup) {
    // As ops/redis.conf runs Redis: the AOF on, no automatic snapshots.
    let TestApp(mut redis, s, _) = spawn_app_with(&["--appendonly", "yes"]).await;
    for license in LICENSES {
        provision(&s, license, &seats_with_timeout(SEATS, 2_000)).await;
    }
    // Every answer an event: the sessions' loops are not rate limited, and
    // every denial is an event of its own.
    let worker_env = [
        ("SEATGATE__REAPER__SCHEDULE", "* * * * * *".to_owned()),
        ("SEATGATE__REAPER__LOCK_MS", "2000".to_owned()),
        ("SEATGATE__LIMITS__SESSION_REQUESTS", "0".to_owned()),
        ("SEATGATE__EVENTS__DENIALS_PER_WINDOW", "0".to_owned()),
    ];
    let mut workers = vec![
        WorkerProcess::start(&redis.url(), &worker_env).await,
        WorkerProcess::start(&redis.url(), &worker_env).await,
    ];
    let follower = Follower::start(&redis.url());
    let load = Load::start(&s);

    tokio::time::sleep(PHASE).await;
    let backup = tempfile::tempdir().expect("backup dir");
    match kind {
        Backup::Rdb => rdb_backup(&redis, &backup.path().join("seatgate.rdb")).await,
        Backup::Aof => aof_backup(&redis, &backup.path().join("appendonlydir")).await,
    }
    let at_backup = load.answered();
    tokio::time::sleep(PHASE).await;
    // The live Redis is lost, with everything written since the backup.
    let before_loss = load.answered();
    redis.kill9();
    let lost_events = follower.len();

    let restored_events = restore(&mut redis, kind, backup.path(), &s.events_streams()[0]).await;
    let restored_at = Instant::now();
    let at_restore = load.answered();
    tokio::time::sleep(PHASE).await;
    while load.answered() < at_restore + 20 {
        assert!(
            restored_at.elapsed() < Duration::from_secs(20),
            "the service does not answer after the restore ({} answers)",
            load.answered() - at_restore
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answered = load.stop().await;

    // Quiet: the workers (and their reapers) stopped, the consumer has
    // every event the restored Redis holds.
    for worker in &mut workers {
        assert!(worker.terminate(Duration::from_secs(10)).await.success());
    }
    let mut con = db(&s).await;
    let mut restored: Vec<Event> = Vec::new();
    for stream in s.events_streams() {
        restored.extend(stream_entries(&mut con, &stream).await.into_iter().map(|e| {
            let mut ev: Event = e.fields.into_iter().collect();
            ev.insert("id".into(), e.id);
            ev
        }));
    }
    let copied = follower.caught_up(&restored).await;
    eprintln!(
        "{kind:?}: {answered} answers ({at_backup} at the backup, {before_loss} when the live Redis was lost, \
         {at_restore} at the restore); the consumer copied {} events ({lost_events} before the loss), \
         the restore brought back {restored_events}, the restored Redis holds {} at the end",
        copied.len(),
        restored.len()
    );

    let audit = output(seatgate_cmd(&redis.url(), &["audit"])).await;
    let stdout = String::from_utf8_lossy(&audit.stdout);
    eprintln!("seatgate audit: {}", stdout.trim_end());
    assert_eq!(
        audit.status.code(),
        Some(0),
        "seatgate audit after the restore: {stdout}{}",
        String::from_utf8_lossy(&audit.stderr)
    );
    assert!(stdout.starts_with("audit clean: "), "{stdout}");

    // The restore really went back: some (license, seq) names one event in
    // the copy of the live history and another in the restored one.
    let reissued = clashes(&copied, &restored, |e| {
        Some((e.get("license")?.clone(), e.get("seq")?.clone()))
    });
    eprintln!("(license, seq) reissued after the restore: {}", reissued.len());
    assert!(
        !reissued.is_empty(),
        "no seq was reissued: the live Redis went on too little past the backup to test anything"
    );
    let by_epoch = clashes(&copied, &restored, |e| {
        Some((
            e.get("license")?.clone(),
            e.get("epoch").cloned().unwrap_or_default(),
            e.get("seq")?.clone(),
        ))
    });
    assert!(
        by_epoch.is_empty(),
        "{} (license, epoch, seq) name two different events, e.g. {:?}",
        by_epoch.len(),
        &by_epoch[..by_epoch.len().min(2)]
    );
    let by_id = clashes(&copied, &restored, |e| e.get("id").cloned());
    assert!(
        by_id.is_empty(),
        "{} stream entry ids name two different events, e.g. {:?}",
        by_id.len(),
        &by_id[..by_id.len().min(2)]
    );
}

/// The pairs of different events, one from `a` and one from `b` (or both
/// from one), that `id` names alike; events it gives no id are left out.
fn clashes<K: std::hash::Hash + Eq>(
    a: &[Event],
    b: &[Event],
    id: impl Fn(&Event) -> Option<K>,
) -> Vec<(Event, Event)> {
    let mut seen: HashMap<K, &Event> = HashMap::new();
    let mut found = Vec::new();
    for e in a.iter().chain(b) {
        let Some(key) = id(e) else { continue };
        match seen.get(&key) {
            Some(first) if *first != e => found.push(((*first).clone(), e.clone())),
            Some(_) => {}
            None => {
                seen.insert(key, e);
            }
        }
    }
    found
}

/// A backup as docs/backup.md takes it with `redis-cli --rdb`.
async fn rdb_backup(redis: &RedisServer, file: &Path) {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-h", "127.0.0.1", "-p", &redis.port().to_string(), "--rdb"])
        .arg(file);
    let out = output(cmd).await;
    assert!(
        out.status.success(),
        "redis-cli --rdb: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::metadata(file).expect("the RDB file").len() > 0);
}

/// A copy of the AOF directory as docs/backup.md takes it: automatic
/// rewrites off, none in progress, copy, rewrites as they were.
async fn aof_backup(redis: &RedisServer, to: &Path) {
    let mut con = admin(redis).await;
    let (_, percentage): (String, String) = redis::cmd("CONFIG")
        .arg("GET")
        .arg("auto-aof-rewrite-percentage")
        .query_async(&mut con)
        .await
        .unwrap();
    config_set(&mut con, "auto-aof-rewrite-percentage", "0").await;
    wait_for_persistence(&mut con, "aof_rewrite_in_progress:0").await;
    copy_dir(&redis.dir().join("appendonlydir"), to);
    config_set(&mut con, "auto-aof-rewrite-percentage", &percentage).await;
}

/// Puts the backup in the lost Redis's place, into a data directory of
/// nothing else, and starts Redis on it as docs/backup.md says; the events
/// it brought back.
async fn restore(redis: &mut RedisServer, kind: Backup, backup: &Path, events_stream: &str) -> i64 {
    let dir = redis.dir();
    for data in ["dump.rdb", "appendonlydir"] {
        let path = dir.join(data);
        if path.is_dir() {
            std::fs::remove_dir_all(&path).unwrap();
        } else if path.exists() {
            std::fs::remove_file(&path).unwrap();
        }
    }
    match kind {
        Backup::Aof => {
            copy_dir(&backup.join("appendonlydir"), &dir.join("appendonlydir"));
            redis.restart().await.expect("redis-server on the AOF copy");
            let mut con = admin(redis).await;
            xlen(&mut con, events_stream).await
        }
        Backup::Rdb => {
            std::fs::copy(backup.join("seatgate.rdb"), dir.join("dump.rdb")).unwrap();
            // With the AOF on and none there, Redis would start empty.
            redis
                .restart_with(&["--appendonly", "no"])
                .await
                .expect("redis-server on the RDB");
            let mut con = admin(redis).await;
            config_set(&mut con, "appendonly", "yes").await;
            wait_for_persistence(&mut con, "aof_rewrite_in_progress:0").await;
            wait_for_persistence(&mut con, "aof_enabled:1").await;
            // The AOF it wrote holds the restore: a restart with the AOF
            // on (redis.conf as before) starts from it, every event there.
            let events = xlen(&mut con, events_stream).await;
            assert!(events > 0, "the RDB restored no events");
            redis.shutdown().await;
            redis
                .restart_with(&["--appendonly", "yes"])
                .await
                .expect("redis-server on the new AOF");
            let mut con = admin(redis).await;
            let again = xlen(&mut con, events_stream).await;
            assert!(
                again >= events,
                "the AOF written after the RDB restore holds it: {events} events, {again} after a restart"
            );
            events
        }
    }
}

/// A connection of the operator's, for what seatgate never does itself.
async fn admin(redis: &RedisServer) -> redis::aio::MultiplexedConnection {
    let client = redis.client().expect("a client of the test redis");
    client.get_multiplexed_async_connection().await.expect("connect")
}

/// `CONFIG SET name value`.
async fn config_set(con: &mut impl redis::aio::ConnectionLike, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async(con)
        .await
        .unwrap();
}

/// `XLEN stream`.
async fn xlen(con: &mut impl redis::aio::ConnectionLike, stream: &str) -> i64 {
    redis::cmd("XLEN").arg(stream).query_async(con).await.unwrap()
}

/// Waits until `INFO persistence` has `line`.
async fn wait_for_persistence(con: &mut impl redis::aio::ConnectionLike, line: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("persistence")
            .query_async(con)
            .await
            .unwrap();
        if info.lines().any(|l| l.trim() == line) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no {line} in INFO persistence:\n{info}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Copies the files of directory `from` (no subdirectories: an AOF
/// directory has none) into a new directory `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for file in std::fs::read_dir(from).expect("the AOF directory") {
        let file = file.unwrap();
        std::fs::copy(file.path(), to.join(file.file_name())).unwrap();
    }
}

/// A consumer of the events: `seatgate events --json --from-start`, which
/// rides out the loss of Redis and reads the restored one on, every line
/// kept.
struct Follower {
    /// The process, killed on drop.
    _child: Spawned,
    /// The events printed so far.
    events: Arc<Mutex<Vec<Event>>>,
}

impl Follower {
    fn start(url: &str) -> Follower {
        let mut child = Command::new(BIN)
            .args(["--redis", url, "events", "--json", "--from-start"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start seatgate events");
        let stdout = child.stdout.take().expect("its stdout");
        let events: Arc<Mutex<Vec<Event>>> = Arc::default();
        let kept = events.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let event: Event = serde_json::from_str(&line).expect("seatgate events --json prints JSON");
                kept.lock().unwrap().push(event);
            }
        });
        Follower {
            _child: Spawned(child),
            events,
        }
    }

    /// How many events it printed so far.
    fn len(&self) -> usize {
        self.events.lock().unwrap().len()
    }

    /// Its events, once it printed the last of `stream` (or fails).
    async fn caught_up(&self, stream: &[Event]) -> Vec<Event> {
        let last = stream.last().map(|e| e["id"].clone());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let events = self.events.lock().unwrap().clone();
            if last.is_none() || events.iter().any(|e| e.get("id") == last.as_ref()) {
                return events;
            }
            assert!(
                Instant::now() < deadline,
                "seatgate events did not print {last:?} ({} events printed)",
                events.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Clients acquiring and releasing seats of [`LICENSES`], a loop per
/// session, each with a client of its own that it makes again after a
/// failure (so the loss of Redis and the restore are ridden out).
struct Load {
    /// Stops the loops.
    stop: CancellationToken,
    /// Requests answered so far, by all loops.
    answered: Arc<std::sync::atomic::AtomicU64>,
    /// The loops.
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(s: &Settings) -> Load {
        let stop = CancellationToken::new();
        let answered: Arc<std::sync::atomic::AtomicU64> = Arc::default();
        let mut tasks = Vec::new();
        for license in LICENSES {
            for i in 0..SESSIONS {
                let (s, stop, answered) = (s.clone(), stop.clone(), answered.clone());
                let session = format!("{license}-{i}");
                tasks.push(tokio::spawn(async move {
                    let mut c: Option<Client> = None;
                    while !stop.is_cancelled() {
                        if c.is_none() {
                            c = tokio::time::timeout(Duration::from_secs(1), s.client().connect())
                                .await
                                .ok()
                                .and_then(Result::ok);
                            if c.is_none() {
                                tokio::time::sleep(Duration::from_millis(100)).await;
                                continue;
                            }
                        }
                        let client = c.as_ref().expect("a client");
                        let ok = cycle(client, license, &session, &answered).await;
                        if !ok {
                            c = None;
                        }
                    }
                }));
            }
        }
        Load {
            stop,
            answered,
            tasks,
        }
    }

    fn answered(&self) -> u64 {
        self.answered.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops the loops; the requests answered.
    async fn stop(self) -> u64 {
        self.stop.cancel();
        let answered = self.answered.clone();
        for task in self.tasks {
            task.await.expect("a load loop panicked");
        }
        answered.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// One acquire of `session`, and its release when it got the seat; false
/// when a call was not answered.
async fn cycle(c: &Client, license: &str, session: &str, answered: &std::sync::atomic::AtomicU64) -> bool {
    let count = || answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let Ok(reply) = c
        .call(&acquire(license, session, 0), Duration::from_secs(1))
        .await
    else {
        return false;
    };
    count();
    if reply.status() == Status::Acquired {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut release = Call::release(license, session);
        if let Some(lease) = c.lease(license, session) {
            release = release.with_lease(lease);
        }
        if c.call(&release, Duration::from_secs(1)).await.is_err() {
            return false;
        }
        count();
    } else {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}
