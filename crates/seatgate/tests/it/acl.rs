//! Access control and credentials: ops/redis-users.acl loaded into a real
//! redis-server, every seatgate process logging in as its own user (the
//! password from the environment, never on a command line), and what each
//! user is refused. Also ops/run-local.sh keeping a password out of sight.

use std::collections::HashMap;
use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use seatgate::config::Settings;
use seatgate_core::keys::consumer_alive;

use crate::support::{
    add_request, free_port, http_get, keys, license_keys, metric, output, reply_stream, repo_file,
    seatgate_cmd, stream_entries, RedisServer, RedisServerExt, Spawned, WorkerProcess, BIN,
};

pub(crate) const WORKER: &str = "seatgate-worker";
pub(crate) const ADMIN: &str = "seatgate-admin";
const DASHBOARD: &str = "seatgate-dashboard";
const CLIENT: &str = "seatgate-client-demo";
/// A second application's client user, beside `demo`'s.
const BILLING: &str = "seatgate-client-billing";
/// The applications with requests streams of their own: the two client users'.
const APPLICATIONS: &str = "demo,billing";
/// A superuser added to the test's copy only, to read ACL LOG.
pub(crate) const ROOT: &str = "test-root";

fn password(user: &str) -> String {
    format!("pw-of-{user}")
}

fn shipped_acl() -> String {
    std::fs::read_to_string(repo_file("ops/redis-users.acl")).expect("ops/redis-users.acl")
}

/// A redis-server loading ops/redis-users.acl, its placeholder password hashes
/// replaced by test passwords, plus a test-only superuser.
pub(crate) struct AclRedis {
    server: RedisServer,
    _dir: tempfile::TempDir,
}

impl AclRedis {
    pub(crate) async fn start() -> AclRedis {
        let mut acl = String::new();
        for line in shipped_acl().lines() {
            let user = line.split_whitespace().nth(1).unwrap_or_default();
            let line: Vec<String> = line
                .split_whitespace()
                .map(|token| {
                    if token.starts_with("#REPLACE_") {
                        format!(">{}", password(user))
                    } else {
                        token.to_owned()
                    }
                })
                .collect();
            acl.push_str(&line.join(" "));
            acl.push('\n');
        }
        acl.push_str(&format!("user {ROOT} on >{} ~* &* +@all\n", password(ROOT)));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("users.acl");
        std::fs::write(&path, acl).unwrap();
        let server = RedisServer::start_with(&["--aclfile", path.to_str().unwrap()]).await;
        let redis = AclRedis { server, _dir: dir };
        // The seat library, loaded as a worker's start (or an operator's
        // install step) loads it: only the worker's user may, and the tests
        // provision before their workers run.
        let mut root = redis.con_as(ROOT).await;
        seatgate_core::scripts::Scripts::get()
            .load_all(&mut root)
            .await
            .unwrap();
        redis
    }

    /// The URL without credentials, as a process is given it.
    pub(crate) fn url(&self) -> String {
        self.server.url()
    }

    /// The settings every process here runs with (but for the login): the
    /// key and stream names the ACL file's patterns must cover.
    pub(crate) fn settings(&self) -> Settings {
        let mut s = self.server.settings();
        s.stream.applications = APPLICATIONS.split(',').map(str::to_owned).collect();
        s.client.name = "demo".to_owned();
        s
    }

    /// The environment that logs a process in as `user`: a client user's
    /// application (`seatgate-client-<app>`) is its client name, `demo` for
    /// the other users.
    pub(crate) fn login(&self, user: &str) -> Vec<(&'static str, String)> {
        let app = user.strip_prefix("seatgate-client-").unwrap_or("demo");
        vec![
            ("SEATGATE__REDIS__USERNAME", user.to_owned()),
            ("SEATGATE__REDIS__PASSWORD", password(user)),
            ("SEATGATE__CLIENT__NAME", app.to_owned()),
            ("SEATGATE__STREAM__APPLICATIONS", APPLICATIONS.to_owned()),
        ]
    }

    /// `seatgate <args>` logged in as `user`, to its end.
    pub(crate) async fn seatgate(&self, user: &str, args: &[&str]) -> Output {
        output(self.command(user, args)).await
    }

    fn command(&self, user: &str, args: &[&str]) -> Command {
        let mut cmd = seatgate_cmd(&self.url(), args);
        for (k, v) in self.login(user) {
            cmd.env(k, v);
        }
        cmd
    }

    pub(crate) async fn con_as(&self, user: &str) -> redis::aio::MultiplexedConnection {
        let url = format!(
            "redis://{user}:{}@127.0.0.1:{}",
            password(user),
            self.server.port()
        );
        redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The error code a command gets as that connection's user.
async fn refusal(con: &mut redis::aio::MultiplexedConnection, cmd: &redis::Cmd) -> String {
    match cmd.query_async::<redis::Value>(con).await {
        Ok(v) => panic!("{cmd:?} was allowed: {v:?}"),
        Err(e) => e.code().unwrap_or("(none)").to_owned(),
    }
}

/// A Redis command from its words.
fn command(words: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd(words[0]);
    for word in &words[1..] {
        cmd.arg(*word);
    }
    cmd
}

/// Runs each command (its words) as that connection's user: Redis must
/// refuse every one for want of permission (NOPERM).
async fn assert_refused(con: &mut redis::aio::MultiplexedConnection, commands: &[&[&str]]) {
    for words in commands {
        assert_eq!(refusal(con, &command(words)).await, "NOPERM", "{words:?}");
    }
}

/// `seatgate <verb> --license cad --session <session> <more>`'s arguments.
fn on_cad<'a>(verb: &'a str, session: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![verb, "--license", "cad", "--session", session];
    args.extend_from_slice(more);
    args
}

#[test]
fn the_shipped_file_refuses_to_load_until_its_passwords_are_set() {
    let dir = tempfile::tempdir().unwrap();
    // A unix socket only: nothing listens on the network, even if it started.
    let out = Command::new("redis-server")
        .args(["--port", "0", "--save", "", "--unixsocket"])
        .arg(dir.path().join("redis.sock"))
        .arg("--dir")
        .arg(dir.path())
        .arg("--aclfile")
        .arg(repo_file("ops/redis-users.acl"))
        .stdin(Stdio::null())
        .output()
        .expect("run redis-server");
    assert!(
        !out.status.success(),
        "redis-server started with placeholder passwords"
    );
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(
        log.contains("password hash must be exactly 64 characters"),
        "{log}"
    );
    // Every user but `default` (which is off) has a placeholder to replace.
    for line in shipped_acl().lines() {
        let user = line.split_whitespace().nth(1).unwrap();
        if user == "default" {
            assert!(line.contains(" off "), "{line}");
        } else {
            assert!(line.contains(" #REPLACE_WITH_SHA256_OF_THE_"), "{line}");
            assert!(!line.contains("nopass") && !line.contains(" >"), "{line}");
        }
    }
}

/// The whole life of a seat with every process as its own least-privilege
/// user: the admin provisions, the worker and reaper serve, clients acquire,
/// queue, get a seat freed by eviction and heartbeat, the dashboard reads
/// status and events, the admin revokes the seat through the admin stream and
/// the client's release hears it. Then each user is refused what is not its
/// own (a client may not revoke, by either stream), and Redis's ACL LOG shows
/// no denial but those provoked on purpose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_process_works_as_its_own_user_and_nothing_more() {
    let redis = AclRedis::start().await;
    let settings = redis.settings();
    let put = redis
        .seatgate(
            ADMIN,
            &[
                "license",
                "put",
                "cad",
                "--seats",
                "1",
                "--heartbeat-timeout",
                "2s",
                // A policy, so the scripts' policy commands run as the worker too.
                "--max-per-user",
                "1",
            ],
        )
        .await;
    assert!(put.status.success(), "admin provisions: {put:?}");
    let show = redis.seatgate(ADMIN, &["license", "show", "cad", "--json"]).await;
    assert!(show.status.success(), "{show:?}");

    let mut env = redis.login(WORKER);
    env.push(("SEATGATE__REAPER__SCHEDULE", "* * * * * *".to_owned()));
    let worker = WorkerProcess::start(&redis.url(), &env).await;

    let alice = redis
        .seatgate(CLIENT, &on_cad("acquire", "alice", &["--user", "alice"]))
        .await;
    assert_eq!(alice.status.code(), Some(0), "{alice:?}");
    assert!(stdout(&alice).starts_with("ACQUIRED"), "{}", stdout(&alice));

    // Bob waits; alice never heartbeats, so the reaper evicts her and bob gets her seat.
    let bob = redis
        .command(
            CLIENT,
            &on_cad("acquire", "bob", &["--user", "bob", "--wait", "30s"]),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let bob = tokio::task::spawn_blocking(move || bob.wait_with_output().unwrap());
    let bob = tokio::time::timeout(Duration::from_secs(40), bob)
        .await
        .expect("bob got no answer")
        .unwrap();
    assert_eq!(bob.status.code(), Some(0), "{bob:?}");
    let lines: Vec<String> = stdout(&bob).lines().map(str::to_owned).collect();
    assert!(lines[0].starts_with("QUEUED"), "{lines:?}");
    assert!(lines.last().unwrap().starts_with("GRANTED"), "{lines:?}");

    let status = stdout(&redis.seatgate(DASHBOARD, &["status"]).await);
    assert!(
        status.contains("cad: 1 of 1 seats in use") && status.contains("bob"),
        "{status}"
    );
    let mut events = Spawned(
        redis
            .command(DASHBOARD, &["events", "--from-start", "--json"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = events.0.stdout.take().unwrap();
    let seen = tokio::task::spawn_blocking(move || {
        let mut text = String::new();
        let mut buf = [0u8; 4096];
        let deadline = Instant::now() + Duration::from_secs(10);
        while !text.contains("\"granted\"") && Instant::now() < deadline {
            match out.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => text.push_str(&String::from_utf8_lossy(&buf[..n])),
            }
        }
        text
    });
    let seen = tokio::time::timeout(Duration::from_secs(15), seen).await;
    drop(events);
    let seen = seen.expect("events stalled").unwrap();
    for kind in ["acquired", "queued", "evicted", "granted"] {
        assert!(
            seen.contains(&format!("\"type\":\"{kind}\"")),
            "{kind} not in {seen}"
        );
    }
    // The dashboard user reads usage reports too (XRANGE, XREVRANGE, TIME).
    let report = redis
        .seatgate(DASHBOARD, &["report", "--license", "cad", "--format", "csv"])
        .await;
    assert!(stdout(&report).contains("cad,peak_seats,,1"), "{report:?}");

    let lease = crate::support::printed_lease(&stdout(&bob));
    let hb = redis
        .seatgate(CLIENT, &on_cad("heartbeat", "bob", &["--lease", &lease]))
        .await;
    assert!(stdout(&hb).starts_with("HEARTBEAT_UPDATED"), "{hb:?}");
    let revoke = redis
        .seatgate(
            ADMIN,
            // demo's session bob, as the administrator names it.
            &on_cad("revoke", "demo/bob", &["--reason", "audit", "--actor", "ada"]),
        )
        .await;
    assert_eq!(revoke.status.code(), Some(0), "{revoke:?}");
    assert!(stdout(&revoke).starts_with("REVOKED"), "{revoke:?}");
    let rel = redis
        .seatgate(CLIENT, &on_cad("release", "bob", &["--lease", &lease]))
        .await;
    assert!(
        stdout(&rel).starts_with("SESSION_REVOKED") && stdout(&rel).contains("(revoked by ada: audit)"),
        "{rel:?}"
    );

    // What each user may not do.
    let license_key = license_keys(&settings, "cad").license;
    let other_apps_replies = reply_stream(&settings, "other-app:1");
    let mut client = redis.con_as(CLIENT).await;
    assert_refused(
        &mut client,
        &[
            &["HSET", &license_key, "seats_total", "100"],
            &["XADD", &settings.events.stream, "*", "type", "acquired"],
            &["XREAD", "STREAMS", &other_apps_replies, "0"],
            &["XADD", &settings.stream.dead_letter, "*", "x", "y"],
            &["XRANGE", &settings.stream.requests, "-", "+"],
        ],
    )
    .await;
    // A client may read the shard count the workers recorded, and no more of it.
    let deployment = keys(&settings).deployment();
    let shards: redis::RedisResult<String> = redis::cmd("HGET")
        .arg(&deployment)
        .arg("shards")
        .query_async(&mut client)
        .await;
    assert_eq!(shards.ok().as_deref(), Some("1"), "clients find the shard count");
    // A client cannot revoke: the admin stream is not its to write, and the
    // requests stream it may write refuses the op.
    assert_refused(
        &mut client,
        &[&["XADD", &settings.stream.admin_requests, "*", "op", "revoke"]],
    )
    .await;
    let own_replies = reply_stream(&settings, "demo:revoke-attempt");
    add_request(
        &mut client,
        &settings,
        &[
            ("op", "revoke"),
            ("id", "r-1"),
            ("license", "cad"),
            ("session", "alice"),
            ("reason", "mine now"),
            ("reply_to", &own_replies),
        ],
    )
    .await;
    let read: redis::streams::StreamReadReply = redis::cmd("XREAD")
        .arg("BLOCK")
        .arg(5000)
        .arg("STREAMS")
        .arg(&own_replies)
        .arg("0")
        .query_async(&mut client)
        .await
        .unwrap();
    let status = read
        .keys
        .first()
        .and_then(|k| k.ids.first())
        .and_then(|e| e.get::<String>("status"));
    assert_eq!(status.as_deref(), Some("INVALID_REQUEST"), "{read:?}");
    let mut dashboard = redis.con_as(DASHBOARD).await;
    assert_refused(&mut dashboard, &[&["HSET", &license_key, "active", "0"]]).await;
    let mut admin = redis.con_as(ADMIN).await;
    assert_refused(
        &mut admin,
        &[&["XADD", &settings.stream.requests, "*", "op", "acquire"]],
    )
    .await;
    let mut as_worker = redis.con_as(WORKER).await;
    // The worker cannot write outside seat:.
    assert_refused(&mut as_worker, &[&["XADD", "orders:jobs", "*", "x", "y"]]).await;
    // What the worker does on rarer paths than the flow above: the consumer
    // cleanup's liveness check, and handing back deliveries Redis refused.
    let alive = consumer_alive(&settings.stream.requests, &settings.stream.group, "gone");
    let exists: redis::RedisResult<bool> = redis::cmd("EXISTS").arg(&alive).query_async(&mut as_worker).await;
    assert_eq!(exists.ok(), Some(false), "the worker may check a liveness key");
    let handed: redis::RedisResult<Vec<String>> = redis::cmd("XCLAIM")
        .arg(&settings.stream.requests)
        .arg(&settings.stream.group)
        .arg("gone")
        .arg(0)
        .arg("0-1")
        .arg("RETRYCOUNT")
        .arg(0)
        .arg("JUSTID")
        .query_async(&mut as_worker)
        .await;
    assert_eq!(handed.ok(), Some(Vec::new()), "the worker may XCLAIM");

    // The reaper's stream upkeep has run by now; nothing of the flow was denied.
    let (_, metrics) = http_get(&worker.metrics, "/metrics").await.unwrap();
    assert!(metrics.contains("seatgate_evictions_total 1"), "{metrics}");
    let mut root = redis.con_as(ROOT).await;
    let log: Vec<HashMap<String, redis::Value>> = redis::cmd("ACL")
        .arg("LOG")
        .arg(1000)
        .query_async(&mut root)
        .await
        .unwrap();
    let text = |e: &HashMap<String, redis::Value>, k: &str| {
        e.get(k)
            .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
            .unwrap_or_default()
    };
    let mut denied: Vec<(String, String)> = log
        .iter()
        .map(|e| (text(e, "username"), text(e, "object")))
        // redis-rs names its library on connect (Redis 7.2+); the reply is ignored.
        .filter(|(_, object)| object != "client|setinfo")
        .collect();
    denied.sort();
    denied.dedup();
    let mut provoked: Vec<(String, String)> = [
        // The admin may XADD (to the admin stream), just not to the requests stream.
        (ADMIN, settings.stream.requests.as_str()),
        (CLIENT, "hset"),
        (CLIENT, settings.events.stream.as_str()),
        (CLIENT, other_apps_replies.as_str()),
        (CLIENT, settings.stream.dead_letter.as_str()),
        (CLIENT, settings.stream.admin_requests.as_str()),
        (CLIENT, "xrange"),
        (DASHBOARD, "hset"),
        (WORKER, "orders:jobs"),
        // The worker's startup check of maxmemory-policy: not granted, on purpose.
        (WORKER, "config|get"),
    ]
    .iter()
    .map(|(u, o)| (u.to_string(), o.to_string()))
    .collect();
    provoked.sort();
    assert_eq!(denied, provoked, "ACL LOG: {log:?}");
}

/// The first entry of `stream`, read as `con`'s user, waiting up to 10 s.
async fn first_reply(
    con: &mut redis::aio::MultiplexedConnection,
    stream: &str,
) -> Option<HashMap<String, String>> {
    let read: redis::streams::StreamReadReply = redis::cmd("XREAD")
        .arg("BLOCK")
        .arg(10_000)
        .arg("STREAMS")
        .arg(stream)
        .arg("0")
        .query_async(con)
        .await
        .unwrap();
    let entry = read.keys.into_iter().next()?.ids.into_iter().next()?;
    Some(
        entry
            .map
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    redis::from_redis_value::<String>(v.clone()).unwrap_or_default(),
                )
            })
            .collect(),
    )
}

/// Two applications, `demo` and `billing`, each with its own client user of
/// ops/redis-users.acl as shipped and its own requests streams (sharded two
/// ways): billing's acquire waits unread while demo's user tries everything
/// that would destroy or hide it (DEL, trimming by MAXLEN or MINID, XADD with
/// a trim or an id of its own, on billing's streams), all refused, and what
/// it may do to its own stream (XADD MAXLEN 0) touches nothing of billing's.
/// The worker then answers billing's acquire, and each application's requests
/// are served as usual; a request on demo's stream naming billing's reply
/// namespace is dead-lettered, not answered there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_application_can_touch_another_applications_requests() {
    let redis = AclRedis::start().await;
    let mut settings = redis.settings();
    settings.stream.shards = 2;
    let put = redis
        .seatgate(ADMIN, &["license", "put", "cad", "--seats", "3"])
        .await;
    assert!(put.status.success(), "{put:?}");

    // Billing's acquire, sent before any worker runs: unread.
    let mut billing = redis.con_as(BILLING).await;
    let billing_base = settings.app_requests("billing");
    let billing_shard = seatgate_core::keys::shard_name(&billing_base, 2, "cad");
    let billing_replies = reply_stream(&settings, "billing:pending-1");
    let _: String = command(&[
        "XADD",
        &billing_shard,
        "*",
        "op",
        "acquire",
        "id",
        "b-1",
        "license",
        "cad",
        "session",
        "b1",
        "lease",
        &crate::support::lease_of("b1"),
        "reply_to",
        &billing_replies,
    ])
    .query_async(&mut billing)
    .await
    .expect("billing's user writes its own requests stream");

    // Everything demo's user might do to it, and to billing's other streams.
    let mut demo = redis.con_as(CLIENT).await;
    for stream in [billing_shard.as_str(), billing_base.as_str()] {
        assert_refused(
            &mut demo,
            &[
                &["DEL", stream],
                &["UNLINK", stream],
                &["XTRIM", stream, "MAXLEN", "0"],
                &["XTRIM", stream, "MINID", "99999999999999-0"],
                &["XADD", stream, "MAXLEN", "0", "*", "op", "x"],
                &["XADD", stream, "MINID", "99999999999999-0", "*", "op", "x"],
                &["XADD", stream, "99999999999999-0", "op", "x"],
                &["XDEL", stream, "0-1"],
                &["XGROUP", "DESTROY", stream, "seatgate"],
                &["XREAD", "STREAMS", stream, "0"],
                &["RENAME", stream, "seat:reply:demo:mine"],
            ],
        )
        .await;
    }
    // Nor the shared stream, which the workers still read.
    assert_refused(
        &mut demo,
        &[
            &["XADD", &settings.stream.requests, "*", "op", "acquire"],
            &["DEL", &settings.stream.requests],
        ],
    )
    .await;
    // Its own stream it may not delete or trim either; an XADD that trims it
    // to nothing wipes only demo's own entries.
    let demo_shard = seatgate_core::keys::shard_name(&settings.app_requests("demo"), 2, "cad");
    assert_refused(
        &mut demo,
        &[&["DEL", &demo_shard], &["XTRIM", &demo_shard, "MAXLEN", "0"]],
    )
    .await;
    let _: String = command(&["XADD", &demo_shard, "MAXLEN", "0", "*", "op", "x"])
        .query_async(&mut demo)
        .await
        .expect("demo may trim its own stream with XADD");
    // A request on demo's own stream aimed at billing's reply namespace.
    let _: String = command(&[
        "XADD",
        &demo_shard,
        "*",
        "op",
        "acquire",
        "id",
        "d-evil",
        "license",
        "cad",
        "session",
        "d-evil",
        "lease",
        &crate::support::lease_of("d-evil"),
        "reply_to",
        &reply_stream(&settings, "billing:pending-1"),
    ])
    .query_async(&mut demo)
    .await
    .unwrap();

    let mut root = redis.con_as(ROOT).await;
    let len: usize = redis::cmd("XLEN")
        .arg(&billing_shard)
        .query_async(&mut root)
        .await
        .unwrap();
    assert_eq!(len, 1, "billing's acquire is still there, unread");

    let mut env = redis.login(WORKER);
    env.push(("SEATGATE__STREAM__SHARDS", "2".to_owned()));
    let _worker = WorkerProcess::start(&redis.url(), &env).await;
    let reply = first_reply(&mut billing, &billing_replies)
        .await
        .expect("billing's pending acquire was never answered");
    assert_eq!(
        reply.get("status").map(String::as_str),
        Some("ACQUIRED"),
        "{reply:?}"
    );
    assert_eq!(reply.get("id").map(String::as_str), Some("b-1"), "{reply:?}");

    // Each application's own requests are served as usual, through the CLI.
    for (user, session) in [(CLIENT, "d1"), (BILLING, "b2")] {
        let mut cmd = redis.command(user, &on_cad("acquire", session, &[]));
        cmd.env("SEATGATE__STREAM__SHARDS", "2");
        let out = output(cmd).await;
        assert!(stdout(&out).starts_with("ACQUIRED"), "{user}: {out:?}");
    }
    // demo's request aimed at billing's replies was dead-lettered, and
    // billing's reply stream holds its own reply only.
    let dead: usize = redis::cmd("XLEN")
        .arg(&settings.stream.dead_letter)
        .query_async(&mut root)
        .await
        .unwrap();
    assert_eq!(dead, 1, "the misdirected request is dead-lettered");
    let replies: usize = redis::cmd("XLEN")
        .arg(&billing_replies)
        .query_async(&mut root)
        .await
        .unwrap();
    assert_eq!(replies, 1, "nothing of demo's reached billing's reply stream");
    let holders: Vec<String> = redis::cmd("ZRANGE")
        .arg(license_keys(&settings, "cad").holders)
        .arg(0)
        .arg(-1)
        .query_async(&mut root)
        .await
        .unwrap();
    assert_eq!(holders.len(), 3, "b1, d1 and b2 hold seats: {holders:?}");
    assert!(!holders.contains(&"d-evil".to_owned()), "{holders:?}");
}

/// The seat library is the worker's (issue 35, M2): the admin user may not
/// `FUNCTION LOAD` (so cannot replace it), and when someone who may puts
/// other code under the library's name, the worker notices within its check
/// period: not ready, `seatgate_library_foreign 1`, and it answers nothing
/// (a request sent meanwhile waits, unread). Once the foreign library is
/// deleted the worker loads its own and answers the waiting request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_library_is_refused_and_the_worker_serves_again_once_it_is_its_own() {
    use seatgate_core::scripts::Scripts;
    let redis = AclRedis::start().await;
    let put = redis
        .seatgate(ADMIN, &["license", "put", "cad", "--seats", "2"])
        .await;
    assert!(put.status.success(), "{put:?}");
    let worker = WorkerProcess::start(&redis.url(), &redis.login(WORKER)).await;
    let first = redis.seatgate(CLIENT, &on_cad("acquire", "s1", &[])).await;
    assert!(stdout(&first).starts_with("ACQUIRED"), "{first:?}");

    let library = Scripts::get().library();
    let name = Scripts::get().library_name();
    // The same name, other code: what a replaced function would be.
    let forged = format!("{library}\n-- forged\n");
    let mut admin = redis.con_as(ADMIN).await;
    let refused = refusal(
        &mut admin,
        redis::cmd("FUNCTION").arg("LOAD").arg("REPLACE").arg(&forged),
    )
    .await;
    assert_eq!(refused, "NOPERM", "the admin user may not load a library");
    let mut root = redis.con_as(ROOT).await;
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(&forged)
        .query_async(&mut root)
        .await
        .expect("a superuser replaces the library");

    let deadline = Instant::now() + Duration::from_secs(25);
    while worker.status("/ready").await != Some(503) {
        assert!(
            Instant::now() < deadline,
            "the worker stayed ready on a foreign library"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        metric(&worker.scrape().await, "seatgate_library_foreign"),
        Some(1.0)
    );
    // A request sent now is not decided by the foreign code.
    let mut waiting = redis.command(
        CLIENT,
        &on_cad("acquire", "s2", &["--timeout", "40s", "--ttl", "40s"]),
    );
    waiting.stdout(Stdio::piped()).stderr(Stdio::piped());
    let waiting = waiting.spawn().unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let holders: Vec<String> = redis::cmd("ZRANGE")
        .arg(license_keys(&redis.settings(), "cad").holders)
        .arg(0)
        .arg(-1)
        .query_async(&mut root)
        .await
        .unwrap();
    assert_eq!(
        holders,
        ["demo/s1"],
        "nothing decided while the library is foreign"
    );

    let _: String = redis::cmd("FUNCTION")
        .arg("DELETE")
        .arg(name)
        .query_async(&mut root)
        .await
        .unwrap();
    let answered = tokio::task::spawn_blocking(move || waiting.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&answered.stdout).starts_with("ACQUIRED"),
        "answered once the library is the worker's own: {answered:?}"
    );
    assert_eq!(worker.status("/ready").await, Some(200));
    assert_eq!(
        metric(&worker.scrape().await, "seatgate_library_foreign"),
        Some(0.0)
    );
}

/// A client user reads and deletes its own reply streams, and writes none:
/// only the workers write replies, so no application can fill the shared
/// Redis through its reply namespace (an entry there has no trim and, under
/// `noeviction`, one large enough stops every application).
#[tokio::test]
async fn a_client_user_reads_and_deletes_its_replies_but_writes_none() {
    let redis = AclRedis::start().await;
    let mut root = redis.con_as(ROOT).await;
    let own = "seat:reply:demo:mine";
    let _: String = command(&["XADD", own, "*", "status", "ACQUIRED"])
        .query_async(&mut root)
        .await
        .unwrap();
    let mut demo = redis.con_as(CLIENT).await;
    assert_refused(
        &mut demo,
        &[
            &["XADD", own, "*", "filler", "x"],
            &["XADD", "seat:reply:demo:new", "*", "filler", "x"],
            &["XTRIM", own, "MAXLEN", "0"],
            &["XDEL", own, "0-1"],
            &["SET", "seat:reply:demo:k", "v"],
        ],
    )
    .await;
    let read: redis::Value = command(&["XREAD", "STREAMS", own, "0"])
        .query_async(&mut demo)
        .await
        .unwrap();
    assert!(
        matches!(read, redis::Value::Array(ref a) if !a.is_empty())
            || matches!(read, redis::Value::Map(ref m) if !m.is_empty()),
        "{read:?}"
    );
    let deleted: i64 = command(&["DEL", own]).query_async(&mut demo).await.unwrap();
    assert_eq!(deleted, 1, "its own reply stream it may delete");
}

/// A program as a Rust user writes it: `Client::builder()` with the URL (the
/// application's ACL user in it) and the application's name, nothing of the
/// deployment's settings. It finds the sharded application stream and its
/// reply namespace in `seat:config`, as the workers (two shards, two
/// applications) recorded them, with only what the shipped client ACL
/// allows; its seat handle acquires, heartbeats and releases. A builder of
/// another application with demo's login is refused by Redis, not served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_built_from_url_and_application_finds_its_streams_under_the_shipped_acl() {
    use seatgate_client::{Call, Client, Decision, SeatOptions, SeatState, Status};
    let redis = AclRedis::start().await;
    let put = redis
        .seatgate(
            ADMIN,
            &[
                "license",
                "put",
                "cad",
                "--seats",
                "1",
                "--heartbeat-timeout",
                "3s",
            ],
        )
        .await;
    assert!(put.status.success(), "{put:?}");
    let mut env = redis.login(WORKER);
    env.push(("SEATGATE__STREAM__SHARDS", "2".to_owned()));
    let _worker = WorkerProcess::start(&redis.url(), &env).await;
    let url = format!(
        "redis://{CLIENT}:{}@127.0.0.1:{}",
        password(CLIENT),
        redis.server.port()
    );

    let client = Client::builder()
        .url(&url)
        .application("demo")
        .connect()
        .await
        .unwrap();
    assert!(
        client.reply_to().starts_with("seat:reply:demo:"),
        "{}",
        client.reply_to()
    );
    let seat = client
        .acquire_seat(
            &Call::acquire("cad", "ws-7").with_user("ada"),
            &SeatOptions::default(),
        )
        .await
        .unwrap();
    assert!(matches!(
        seat.grant().decision(),
        Decision::Seat {
            status: Status::Acquired,
            ..
        }
    ));
    let mut watch = seat.watch();
    tokio::time::timeout(
        Duration::from_secs(10),
        watch.wait_for(|s| matches!(s, SeatState::Held { heartbeats, .. } if *heartbeats >= 1)),
    )
    .await
    .expect("a heartbeat within a third of the 3 s timeout")
    .unwrap();
    // The request went to demo's own stream, on the license's shard.
    let mut root = redis.con_as(ROOT).await;
    let shard = seatgate_core::keys::shard_name("seat:requests:app:demo", 2, "cad");
    let sent: usize = redis::cmd("XLEN")
        .arg(&shard)
        .query_async(&mut root)
        .await
        .unwrap();
    assert!(sent >= 2, "the acquire and a heartbeat on {shard}: {sent}");
    let released = seat.release().await.unwrap();
    assert_eq!(
        released.reply().map(|r| r.decision()),
        Some(Decision::Released { linger: None })
    );
    client.close().await.unwrap();

    // demo's login cannot pose as billing: its requests stream and reply
    // namespace are billing's, which Redis refuses demo's user.
    let posing = Client::builder()
        .url(&url)
        .application("billing")
        .connect()
        .await
        .unwrap();
    let refused = posing
        .call(&Call::acquire("cad", "ws-8"), Duration::from_secs(2))
        .await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("no permissions")),
        "{refused:?}"
    );
}

/// `seatgate license delete` as the admin user ends what is on the license:
/// it runs lua/delete_license.lua, publishes the holds' ends on the events
/// stream, tells the waiter on its own app's reply stream and files the due
/// index, all within what ops/redis-users.acl grants it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_user_may_delete_a_license_with_holders_and_waiters() {
    let redis = AclRedis::start().await;
    let settings = redis.settings();
    let put = redis
        .seatgate(ADMIN, &["license", "put", "cad", "--seats", "1"])
        .await;
    assert!(put.status.success(), "{put:?}");
    let worker = WorkerProcess::start(&redis.url(), &redis.login(WORKER)).await;
    let alice = redis.seatgate(CLIENT, &on_cad("acquire", "alice", &[])).await;
    assert!(stdout(&alice).starts_with("ACQUIRED"), "{alice:?}");
    let mut bob = Spawned(
        redis
            .command(CLIENT, &on_cad("acquire", "bob", &["--wait", "60s"]))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let queue = license_keys(&settings, "cad").queue;
    let mut root = redis.con_as(ROOT).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n: i64 = redis::cmd("ZCARD")
            .arg(&queue)
            .query_async(&mut root)
            .await
            .unwrap();
        if n == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "bob never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deleted = redis
        .seatgate(ADMIN, &["license", "delete", "cad", "--yes"])
        .await;
    assert!(deleted.status.success(), "{deleted:?}");
    assert!(
        stdout(&deleted).contains("ended 1 seats and 1 waits"),
        "{deleted:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let code = loop {
        if let Some(status) = bob.0.try_wait().unwrap() {
            break status.code();
        }
        assert!(Instant::now() < deadline, "bob got no final reply: {deleted:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut out = String::new();
    bob.0.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("LICENSE_NOT_FOUND"), "{out}");
    let events: Vec<redis::Value> = redis::cmd("XRANGE")
        .arg(&settings.events.stream)
        .arg("-")
        .arg("+")
        .query_async(&mut root)
        .await
        .unwrap();
    assert!(format!("{events:?}").contains("license_deleted"), "{events:?}");
    drop(worker);
    let log: Vec<HashMap<String, redis::Value>> = redis::cmd("ACL")
        .arg("LOG")
        .arg(1000)
        .query_async(&mut root)
        .await
        .unwrap();
    let denied: Vec<String> = log
        .iter()
        .filter_map(|e| e.get("object"))
        .filter_map(|v| redis::from_redis_value::<String>(v.clone()).ok())
        .filter(|object| object != "client|setinfo" && object != "config|get")
        .collect();
    assert!(denied.is_empty(), "ACL LOG: {log:?}");
}

/// ops/run-local.sh against a password-protected Redis: the password reaches
/// seatgate and redis-cli through the environment only, and the URL it
/// prints is masked.
#[tokio::test]
async fn run_local_keeps_the_password_off_command_lines_and_output() {
    let secret = "s3cret-Pw";
    let redis = RedisServer::start_with(&["--requirepass", secret]).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("argv.log");
    let mut which = Command::new("sh");
    which.args(["-c", "command -v redis-cli"]);
    let real_cli = String::from_utf8(output(which).await.stdout)
        .unwrap()
        .trim()
        .to_owned();
    let wrapper = |name: &str, target: &str| {
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\necho \"{name} $*\" >> '{}'\nexec {target} \"$@\"\n",
                log.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        path
    };
    wrapper("redis-cli", &real_cli);
    wrapper("cargo", "false");
    let bin = wrapper("seatgate", BIN);
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new("bash")
        .arg(repo_file("ops/run-local.sh"))
        .env(
            "PATH",
            format!("{}:{}", dir.path().display(), std::env::var("PATH").unwrap()),
        )
        .env(
            "SEATGATE__REDIS__URL",
            format!("redis://:{secret}@127.0.0.1:{}", redis.port()),
        )
        .env("SEATGATE_BIN", &bin)
        .env("SEATGATE__METRICS__LISTEN", &metrics)
        .env("SEATGATE__STREAM__BLOCK_MS", "100")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let printed = Arc::new(Mutex::new(String::new()));
    let mut readers = Vec::new();
    for pipe in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let printed = printed.clone();
        readers.push(std::thread::spawn(move || {
            let mut pipe = pipe;
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                printed
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut ready = false;
    while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
        if http_get(&metrics, "/ready").await.map(|(c, _)| c) == Some(200) {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The running worker's own command line, while it runs.
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", child.id())).unwrap_or_default();
    // SIGTERM, then wait for the script and the end of its output, off the runtime's threads.
    tokio::task::spawn_blocking(move || {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let _ = child.wait();
        for r in readers {
            let _ = r.join();
        }
    })
    .await
    .unwrap();
    let output = printed.lock().unwrap().clone();
    let argv = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!argv.contains(secret), "a password on a command line: {argv}");
    assert!(!String::from_utf8_lossy(&cmdline).contains(secret));
    assert!(!output.contains(secret), "a password printed: {output}");
    assert!(ready, "the worker never became ready: {output}");
    assert!(output.contains("license demo: 1 seats"), "{output}");
    assert!(
        output.contains(&format!(
            "seatgate is starting against redis://:***@127.0.0.1:{}",
            redis.port()
        )),
        "{output}"
    );
}

/// `seatgate <verb> --license shared --session <session> <more> --json` as
/// `user`, with the worker's `[tenancy]` the test runs: the reply's status
/// and `error`.
async fn on_shared(
    redis: &AclRedis,
    user: &str,
    verb: &str,
    session: &str,
    more: &[&str],
) -> (String, String) {
    // Each application's own lease for each of its sessions: the other
    // does not know it.
    let lease = crate::support::lease_of(&format!("{user}-{session}"));
    let mut args = vec![verb, "--license", "shared", "--session", session, "--json"];
    if ["acquire", "heartbeat", "release"].contains(&verb) {
        args.extend_from_slice(&["--lease", &lease]);
    }
    args.extend_from_slice(more);
    let out = redis.seatgate(user, &args).await;
    let text = stdout(&out);
    let reply: serde_json::Value = serde_json::from_str(text.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{user} {verb} {session}: {e}: {out:?}"));
    let field = |k: &str| {
        reply
            .get(k)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned()
    };
    (field("status"), field("error"))
}

/// The application is part of every identity (issue 35, H1 and M1), with
/// the shipped ACL and two applications, `demo` and `billing`, on one
/// license. What one application says names only its own sessions, users
/// and groups: demo claiming billing's user, session or reserved group, or
/// spending past its own limits, changes nothing of billing's, and an
/// administrator's user-wide revocation of demo's user leaves billing's
/// user of the same name alone. Each attempt below failed on the main of
/// before (demo's `user ada` took billing's ada's one seat of
/// max_per_user, demo's `user bob` took eng's reserved seat, demo's session
/// `ws-7` was refused LEASE_MISMATCH as billing's, and nothing bounded
/// demo's seats, waiters or requests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_application_can_claim_squat_or_outspend_anothers_identities() {
    let redis = AclRedis::start().await;
    let settings = redis.settings();
    for args in [
        &[
            "license",
            "put",
            "shared",
            "--seats",
            "8",
            "--max-per-user",
            "1",
            "--group-reserve",
            "billing/eng=1",
        ][..],
        &["license", "groups", "shared", "set", "billing/bob", "billing/eng"],
    ] {
        let out = redis.seatgate(ADMIN, args).await;
        assert!(out.status.success(), "{args:?}: {out:?}");
    }
    let mut env = redis.login(WORKER);
    env.push(("SEATGATE__TENANCY__APPLICATION_SESSIONS", "4".to_owned()));
    env.push(("SEATGATE__TENANCY__APPLICATION_REQUESTS", "30".to_owned()));
    let _worker = WorkerProcess::start(&redis.url(), &env).await;
    let acquired = |r: (String, String)| assert_eq!(r.0, "ACQUIRED", "{r:?}");

    // H1: demo says it is billing's user ada: it is demo's ada, and billing's
    // ada still gets her one seat of max_per_user.
    acquired(on_shared(&redis, CLIENT, "acquire", "d-ada", &["--user", "ada"]).await);
    acquired(on_shared(&redis, BILLING, "acquire", "b-ada", &["--user", "ada"]).await);
    let again = on_shared(&redis, BILLING, "acquire", "b-ada-2", &["--user", "ada"]).await;
    assert_eq!(
        again.0, "LIMIT_REACHED",
        "billing's own ada is at her limit: {again:?}"
    );
    assert!(
        again.1.contains("billing/ada"),
        "the reply names whose user: {again:?}"
    );

    // H1: demo as bob of group eng, whose seat is reserved for billing's
    // eng: the group map speaks of billing/bob, so demo's claim of a group is
    // refused, and billing's bob takes the reserved seat.
    let squat = on_shared(
        &redis,
        CLIENT,
        "acquire",
        "d-bob",
        &["--user", "bob", "--group", "eng"],
    )
    .await;
    assert_eq!(squat.0, "LIMIT_REACHED", "{squat:?}");
    acquired(on_shared(&redis, BILLING, "acquire", "b-bob", &["--user", "bob"]).await);

    // Nor can demo name billing's kept names itself: a `/` is in no id a
    // request may send, so session, user and group `billing/...` are
    // refused INVALID_REQUEST and change nothing.
    for (field, args) in [
        (
            "session",
            vec![
                "acquire",
                "--license",
                "shared",
                "--session",
                "billing/b-ada",
                "--json",
            ],
        ),
        (
            "user",
            vec![
                "acquire",
                "--license",
                "shared",
                "--session",
                "d-x",
                "--user",
                "billing/ada",
                "--json",
            ],
        ),
        (
            "group",
            vec![
                "acquire",
                "--license",
                "shared",
                "--session",
                "d-y",
                "--group",
                "billing/eng",
                "--json",
            ],
        ),
        (
            "session",
            vec![
                "release",
                "--license",
                "shared",
                "--session",
                "billing/b-ada",
                "--json",
            ],
        ),
    ] {
        let out = redis.seatgate(CLIENT, &args).await;
        let text = stdout(&out);
        assert!(
            text.contains("INVALID_REQUEST") && text.contains(&format!("`{field}`")),
            "{field}: {out:?}"
        );
    }

    // M1: the same session id is two sessions, one per application; demo's
    // release of its ws-7 leaves billing's holding.
    acquired(on_shared(&redis, BILLING, "acquire", "ws-7.example.com", &[]).await);
    acquired(on_shared(&redis, CLIENT, "acquire", "ws-7.example.com", &[]).await);

    // The raw reply echoes the session as its caller sent it.
    let mut demo = redis.con_as(CLIENT).await;
    let replies = reply_stream(&settings, "demo:raw-1");
    let demo_stream = settings.app_requests("demo");
    let _: String = command(&[
        "XADD",
        &demo_stream,
        "*",
        "op",
        "heartbeat",
        "id",
        "hb-raw",
        "license",
        "shared",
        "session",
        "d-ada",
        "lease",
        &crate::support::lease_of(&format!("{CLIENT}-d-ada")),
        "reply_to",
        &replies,
    ])
    .query_async(&mut demo)
    .await
    .unwrap();
    let raw = first_reply(&mut demo, &replies).await.expect("a reply");
    assert_eq!(raw.get("session").map(String::as_str), Some("d-ada"), "{raw:?}");

    // The administrator sees whose each session is.
    let mut root = redis.con_as(ROOT).await;
    let holders: Vec<String> = redis::cmd("ZRANGE")
        .arg(license_keys(&settings, "shared").holders)
        .arg(0)
        .arg(-1)
        .query_async(&mut root)
        .await
        .unwrap();
    let mut holders_sorted = holders.clone();
    holders_sorted.sort();
    assert_eq!(
        holders_sorted,
        [
            "billing/b-ada",
            "billing/b-bob",
            "billing/ws-7.example.com",
            "demo/d-ada",
            "demo/ws-7.example.com"
        ],
        "{holders:?}"
    );
    let status = stdout(
        &redis
            .seatgate(DASHBOARD, &["status", "--license", "shared"])
            .await,
    );
    assert!(
        status.contains("billing/ws-7.example.com") && status.contains("demo/ws-7.example.com"),
        "{status}"
    );

    // A user-wide revocation of demo's ada binds demo's ada only.
    let revoke = redis
        .seatgate(
            ADMIN,
            &[
                "revoke",
                "--license",
                "shared",
                "--session",
                "demo/d-ada",
                "--reason",
                "abuse",
                "--cooldown",
                "10m",
                "--user-wide",
            ],
        )
        .await;
    assert!(revoke.status.success(), "{revoke:?}");
    let refused = on_shared(&redis, CLIENT, "acquire", "d-ada-2", &["--user", "ada"]).await;
    assert_eq!(refused.0, "SESSION_REVOKED", "{refused:?}");
    let billing_ada = on_shared(&redis, BILLING, "heartbeat", "b-ada", &[]).await;
    assert_eq!(
        billing_ada.0, "HEARTBEAT_UPDATED",
        "billing's ada still holds: {billing_ada:?}"
    );

    // Per-application limits: demo holds ws-7 and may hold or wait for 4 in
    // all; billing is under its own.
    acquired(on_shared(&redis, CLIENT, "acquire", "d-2", &[]).await);
    acquired(on_shared(&redis, CLIENT, "acquire", "d-3", &[]).await);
    acquired(on_shared(&redis, CLIENT, "acquire", "d-4", &[]).await);
    let fifth = on_shared(&redis, CLIENT, "acquire", "d-5", &[]).await;
    assert_eq!(fifth.0, "LIMIT_REACHED", "{fifth:?}");
    assert!(fifth.1.contains("application_sessions"), "{fifth:?}");
    // Billing takes the last free seat (8: billing 4, demo 4; eng's reserve
    // used by b-bob): its limit is its own.
    acquired(on_shared(&redis, BILLING, "acquire", "b-3", &[]).await);

    // A license that lists its applications serves them alone.
    let put = redis
        .seatgate(
            ADMIN,
            &[
                "license",
                "put",
                "billing-only",
                "--seats",
                "2",
                "--applications",
                "billing",
            ],
        )
        .await;
    assert!(put.status.success(), "{put:?}");
    let only = |user: &'static str, session: &'static str| {
        let redis = &redis;
        async move {
            let out = redis
                .seatgate(
                    user,
                    &[
                        "acquire",
                        "--license",
                        "billing-only",
                        "--session",
                        session,
                        "--json",
                    ],
                )
                .await;
            let reply: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
            (
                reply["status"].as_str().unwrap_or_default().to_owned(),
                reply["error"].as_str().unwrap_or_default().to_owned(),
            )
        }
    };
    let refused = only(CLIENT, "d-only").await;
    assert_eq!(refused.0, "LIMIT_REACHED", "{refused:?}");
    assert!(refused.1.contains("not among them"), "{refused:?}");
    assert_eq!(only(BILLING, "b-only").await.0, "ACQUIRED");
    let show = stdout(&redis.seatgate(ADMIN, &["license", "show", "billing-only"]).await);
    assert!(show.contains("applications billing"), "{show}");

    // Rate: demo's requests about the license run out; billing's do not.
    let mut limited = None;
    for i in 0..40 {
        let r = on_shared(&redis, CLIENT, "acquire", &format!("d-r{i}"), &[]).await;
        if r.0 == "RATE_LIMITED" {
            limited = Some(r);
            break;
        }
    }
    let limited = limited.expect("demo's requests were never rate limited");
    assert!(limited.1.contains("application"), "{limited:?}");
    // Billing's budget is its own: decided (and refused by its own seat
    // limit), not rate limited.
    let billing_now = on_shared(&redis, BILLING, "acquire", "b-5", &[]).await;
    assert_eq!(billing_now.0, "LIMIT_REACHED", "{billing_now:?}");
}

/// A request's fields, as sent.
type Fields = Vec<(&'static str, String)>;

/// XADDs `fields` to `stream` as `con`'s user.
async fn xadd_as(con: &mut redis::aio::MultiplexedConnection, stream: &str, fields: &[(&str, &str)]) {
    let mut xadd = command(&["XADD", stream, "*"]);
    for (k, v) in fields {
        xadd.arg(*k).arg(*v);
    }
    let _: String = xadd.query_async(con).await.unwrap();
}

/// Application `app`'s part of license `license`, read as the test's
/// superuser: its seats (holders and their records), its waiters (their
/// records and their places in the whole queue), its counts in the owners
/// hash, its reply stream, and how many events name its sessions. What the other application must not change.
async fn application_state(
    root: &mut redis::aio::MultiplexedConnection,
    settings: &Settings,
    license: &str,
    app: &str,
    replies: &str,
) -> Vec<String> {
    let keys = license_keys(settings, license);
    let mine = |name: &str| {
        name.starts_with(&format!("{app}/"))
            || name == format!("a:{app}")
            || name == format!("wa:{app}")
            || name.contains(&format!(":{app}/"))
    };
    let mut state = Vec::new();
    for (what, key) in [("holders", &keys.holders), ("queue", &keys.queue)] {
        let members: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(root)
            .await
            .unwrap();
        for (rank, (member, score)) in members.iter().enumerate() {
            if mine(member) {
                state.push(format!("{what} #{rank} {member} {score}"));
            }
        }
    }
    for (what, key) in [
        ("session", &keys.sessions),
        ("waiter", &keys.waiters),
        ("owners", &keys.owners),
    ] {
        let map: HashMap<String, String> = redis::cmd("HGETALL").arg(key).query_async(root).await.unwrap();
        let mut rows: Vec<String> = map
            .into_iter()
            .filter(|(k, _)| mine(k))
            .map(|(k, v)| format!("{what} {k}={v}"))
            .collect();
        rows.sort();
        state.extend(rows);
    }
    let replies = stream_entries(root, replies).await;
    state.push(format!(
        "replies {:?}",
        replies.iter().map(|e| &e.id).collect::<Vec<_>>()
    ));
    let events = stream_entries(root, &settings.events_stream_for(license)).await;
    let named = events
        .iter()
        .filter(|e| e.fields.get("session").is_some_and(|s| mine(s)))
        .count();
    state.push(format!("events naming its sessions {named}"));
    state
}

/// The whole matrix, each of two applications against the other, under the
/// shipped ACL (issue 35): every command either client user is granted, and
/// the ones it is not, aimed at every key of the other application; then
/// every field of a request on its own stream aimed at the other's seat,
/// waiter, user, group, lease, request id and replies, with the longest
/// wait and the highest priority. Afterwards the other's holders, waiters
/// (and their places), counts, replies, requests and events are exactly as
/// they were, its seat still answers to its lease and its waiter is still
/// first in line. Each attempt and what it got is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_application_tries_every_command_and_field_on_the_other_and_changes_nothing() {
    let redis = AclRedis::start().await;
    let settings = redis.settings();
    let mut root = redis.con_as(ROOT).await;
    let _worker = WorkerProcess::start(&redis.url(), &redis.login(WORKER)).await;
    for (me, other) in [(CLIENT, BILLING), (BILLING, CLIENT)] {
        let my_app = me.strip_prefix("seatgate-client-").unwrap();
        let other_app = other.strip_prefix("seatgate-client-").unwrap();
        let license = format!("m-{other_app}");
        let put = redis
            .seatgate(
                ADMIN,
                &["license", "put", &license, "--seats", "1", "--max-per-user", "1"],
            )
            .await;
        assert!(put.status.success(), "{put:?}");

        // The other application holds the one seat and has a waiter.
        let mut theirs = redis.con_as(other).await;
        let their_replies = reply_stream(&settings, &format!("{other_app}:holds-{license}"));
        let their_stream = settings.app_requests(other_app);
        let held_lease = crate::support::lease_of(&format!("{other_app}-held"));
        let wait_lease = crate::support::lease_of(&format!("{other_app}-wait"));
        // One after the other: requests in flight have no order
        // (docs/protocol.md), and the waiter must come second.
        for (sent, (id, session, lease, user, wait)) in [
            ("o-held-1", "o-held", &held_lease, "ada", "0"),
            ("o-wait-1", "o-wait", &wait_lease, "bob", "3600000"),
        ]
        .into_iter()
        .enumerate()
        {
            xadd_as(
                &mut theirs,
                &their_stream,
                &[
                    ("op", "acquire"),
                    ("id", id),
                    ("license", &license),
                    ("session", session),
                    ("lease", lease),
                    ("user", user),
                    ("group", "eng"),
                    ("wait_ms", wait),
                    ("reply_to", &their_replies),
                ],
            )
            .await;
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let n: usize = redis::cmd("XLEN")
                    .arg(&their_replies)
                    .query_async(&mut root)
                    .await
                    .unwrap();
                if n > sent {
                    break;
                }
                assert!(Instant::now() < deadline, "the other's {id} was not answered");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let before = application_state(&mut root, &settings, &license, other_app, &their_replies).await;
        assert!(
            before
                .iter()
                .any(|row| row.starts_with(&format!("holders #0 {other_app}/o-held")))
                && before
                    .iter()
                    .any(|row| row.starts_with(&format!("queue #0 {other_app}/o-wait"))),
            "{before:?}"
        );

        // A: every command, granted or not, on every key of the other's.
        let mut mine = redis.con_as(me).await;
        let keys = license_keys(&settings, &license);
        let their_shard = seatgate_core::keys::shard_name(&their_stream, 1, &license);
        let their_keys = [
            their_stream.as_str(),
            their_shard.as_str(),
            their_replies.as_str(),
            keys.holders.as_str(),
            keys.sessions.as_str(),
            keys.queue.as_str(),
            keys.waiters.as_str(),
            keys.owners.as_str(),
            keys.license.as_str(),
        ];
        let mut attempts = 0;
        for key in their_keys {
            for words in [
                &["XADD", key, "*", "op", "release"][..],
                &["XADD", key, "MAXLEN", "0", "*", "x", "y"],
                &["XREAD", "STREAMS", key, "0"],
                &["XRANGE", key, "-", "+"],
                &["XTRIM", key, "MAXLEN", "0"],
                &["XDEL", key, "0-1"],
                &["XACK", key, "seatgate", "0-1"],
                &["XREADGROUP", "GROUP", "seatgate", "evil", "STREAMS", key, ">"],
                &["XAUTOCLAIM", key, "seatgate", "evil", "0", "0-0"],
                &["XGROUP", "DESTROY", key, "seatgate"],
                &["XSETID", key, "99999999999999-0"],
                &["DEL", key],
                &["RENAME", key, "seat:requests:app:x"],
                &["EXPIRE", key, "1"],
                &["HGET", key, "f"],
                &["HSET", key, "f", "v"],
                &["HGETALL", key],
                &["ZRANGE", key, "0", "-1"],
                &["ZADD", key, "0", "m"],
                &["ZREM", key, "m"],
                &["TYPE", key],
                &["OBJECT", "ENCODING", key],
                &["DUMP", key],
            ] {
                assert_eq!(
                    refusal(&mut mine, &command(words)).await,
                    "NOPERM",
                    "{me}: {words:?}"
                );
                attempts += 1;
            }
        }
        for words in [
            &["FCALL", "seatgate_x", "0"][..],
            &["EVAL", "return 1", "0"],
            &[
                "FUNCTION",
                "LOAD",
                "#!lua name=x\nredis.register_function('x', function() end)",
            ],
            &["FUNCTION", "DELETE", "seatgate"],
            &["FUNCTION", "FLUSH"],
            &["SCRIPT", "FLUSH"],
            &["KEYS", "*"],
            &["SCAN", "0"],
            &["CONFIG", "SET", "maxmemory", "1"],
            &["CLIENT", "LIST"],
            &["CLIENT", "KILL", "TYPE", "normal"],
            &["PUBLISH", "c", "m"],
            &["FLUSHALL"],
            &["ACL", "LIST"],
            &["HSET", "seat:config", "shards", "9"],
        ] {
            assert_eq!(
                refusal(&mut mine, &command(words)).await,
                "NOPERM",
                "{me}: {words:?}"
            );
            attempts += 1;
        }
        println!("{my_app} against {other_app}: {attempts} commands on its keys and the server: NOPERM each");

        // B: every request field, on my own stream, aimed at the other's.
        let my_replies = reply_stream(&settings, &format!("{my_app}:tries-{license}"));
        let my_stream = settings.app_requests(my_app);
        let stolen = held_lease.as_str();
        let mut tried: Vec<(String, Vec<(&str, String)>)> = Vec::new();
        let plain = |op: &str, session: &str| {
            vec![
                ("op", op.to_owned()),
                ("license", license.clone()),
                ("session", session.to_owned()),
                ("lease", stolen.to_owned()),
            ]
        };
        for op in ["acquire", "heartbeat", "release"] {
            tried.push((
                format!("{op} of its session id, with its lease"),
                plain(op, "o-held"),
            ));
            tried.push((format!("{op} of its waiter's id"), plain(op, "o-wait")));
            tried.push((
                format!("{op} of its kept session name"),
                plain(op, &format!("{other_app}/o-held")),
            ));
        }
        let kept = |id: &str| format!("{other_app}/{id}");
        let acquires: [(&str, &str, Fields); 5] = [
            (
                "acquire as its user",
                "m-ada",
                vec![("user", "ada".into()), ("group", "eng".into())],
            ),
            ("acquire as its kept user", "m-ada2", vec![("user", kept("ada"))]),
            ("acquire in its kept group", "m-eng", vec![("group", kept("eng"))]),
            (
                "acquire under its request id",
                "m-id",
                vec![("id", "o-held-1".into())],
            ),
            (
                "acquire waiting an hour at priority 9",
                "m-first",
                vec![("wait_ms", "3600000".into()), ("priority", "9".into())],
            ),
        ];
        for (what, session, more) in acquires {
            let mut fields = plain("acquire", session);
            fields.extend(more);
            tried.push((what.to_owned(), fields));
        }
        let mut revoke = plain("revoke", &kept("o-held"));
        revoke.push(("reason", "x".into()));
        tried.push(("revoke of its seat".into(), revoke));
        let mut answered = Vec::new();
        for (what, fields) in &tried {
            let mut xadd = command(&["XADD", &my_stream, "*", "reply_to", &my_replies]);
            for (k, v) in fields {
                xadd.arg(*k).arg(v);
            }
            let id: String = xadd.query_async(&mut mine).await.unwrap();
            answered.push((what.clone(), id));
        }
        // Aimed at its replies: dead-lettered, never written there.
        xadd_as(
            &mut mine,
            &my_stream,
            &[
                ("op", "acquire"),
                ("license", &license),
                ("session", "m-r"),
                ("lease", stolen),
                ("reply_to", &their_replies),
            ],
        )
        .await;
        let deadline = Instant::now() + Duration::from_secs(10);
        let replies = loop {
            let replies = stream_entries(&mut root, &my_replies).await;
            if replies.len() >= answered.len() {
                break replies;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {} answered",
                replies.len(),
                answered.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let by_id: HashMap<String, (String, String)> = replies
            .iter()
            .map(|e| {
                let field = |k: &str| e.fields.get(k).cloned().unwrap_or_default();
                (field("id"), (field("status"), field("error")))
            })
            .collect();
        for (what, entry) in &answered {
            // A request without an `id` is answered under its entry id.
            let key = if what == "acquire under its request id" {
                "o-held-1"
            } else {
                entry.as_str()
            };
            let (status, error) = by_id.get(key).cloned().unwrap_or_default();
            println!("{my_app} against {other_app}: {what} -> {status} {error}");
            assert_ne!(status, "", "{what}: no answer");
        }
        println!("{my_app} against {other_app}: acquire with reply_to in its reply namespace -> dead-lettered, nothing written there");

        // Nothing of the other's changed, and its seat and place still answer to it.
        let after = application_state(&mut root, &settings, &license, other_app, &their_replies).await;
        assert_eq!(after, before, "{my_app} changed {other_app}'s state");
        xadd_as(
            &mut theirs,
            &their_stream,
            &[
                ("op", "heartbeat"),
                ("id", "o-beat"),
                ("license", &license),
                ("session", "o-held"),
                ("lease", &held_lease),
                ("reply_to", &their_replies),
            ],
        )
        .await;
        let deadline = Instant::now() + Duration::from_secs(10);
        let beat = loop {
            let replies = stream_entries(&mut root, &their_replies).await;
            if let Some(e) = replies
                .iter()
                .find(|e| e.fields.get("id").map(String::as_str) == Some("o-beat"))
            {
                break e["status"].clone();
            }
            assert!(Instant::now() < deadline, "no answer to the other's heartbeat");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(beat, "HEARTBEAT_UPDATED");
        let queue: Vec<String> = redis::cmd("ZRANGE")
            .arg(&keys.queue)
            .arg(0)
            .arg(0)
            .query_async(&mut root)
            .await
            .unwrap();
        assert_eq!(
            queue,
            [format!("{other_app}/o-wait")],
            "its waiter is still first in line"
        );
    }
}
