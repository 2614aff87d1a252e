//! An administrator's revoke: over the admin stream, through a real worker
//! and as the `seatgate revoke` process; what the revoked session hears
//! after it, cooldowns, waiters, and what the requests stream refuses.

use std::collections::HashMap;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use seatgate::client::{Call, Client, ReplyMsg, Revoke};
use seatgate::config::Settings;
use seatgate::engine::keys::Keys;
use seatgate::engine::protocol::Op;
use seatgate::engine::status::Status;

use crate::support::{
    holders, http_get, put_license, snapshot, spawn_worker, stream_entries, RedisServer, RedisServerExt,
    WorkerProcess, BIN,
};

const T: Duration = Duration::from_secs(5);

fn revoke(license: &str, session: &str, reason: &str, cooldown_ms: u64) -> Revoke {
    Revoke {
        license: license.into(),
        session: session.into(),
        reason: reason.into(),
        actor: "ada".into(),
        cooldown_ms,
    }
}

async fn call(client: &mut Client, op: Op, license: &str, session: &str) -> ReplyMsg {
    client.call(&Call::new(op, license, session), T).await.unwrap()
}

async fn events(redis: &RedisServer) -> Vec<HashMap<String, String>> {
    stream_entries(&mut redis.con().await, "seat:events").await
}

/// A worker, a client and an admin client on a fresh server with a
/// `seats`-seat license `lic`.
async fn setup(
    redis: &RedisServer,
    settings: Settings,
    seats: u64,
) -> (crate::support::WorkerHandle, Client, Client) {
    put_license(redis, "lic", seats).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let client = Client::connect_with(&settings).await.unwrap();
    let admin = Client::connect_admin(&settings).await.unwrap();
    (worker, client, admin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_holder_loses_its_seat_to_the_queue_and_hears_why() {
    let redis = RedisServer::start_with(&[]);
    let (worker, mut client, mut admin) = setup(&redis, redis.settings(), 1).await;
    assert_eq!(
        call(&mut client, Op::Acquire, "lic", "alice").await.status(),
        Status::Acquired
    );
    let mut bob = Client::connect_with(&redis.settings()).await.unwrap();
    let bob_id = bob
        .send(&Call::new(Op::Acquire, "lic", "bob").with_wait(30_000))
        .await
        .unwrap();
    assert_eq!(bob.wait_for(&bob_id, T).await.unwrap().status(), Status::Queued);

    let reply = admin
        .revoke(&revoke("lic", "alice", "seat shared outside the team", 0), T)
        .await
        .unwrap();
    assert_eq!(
        (reply.status(), reply.get("ok")),
        (Status::Revoked, "1"),
        "{reply:?}"
    );
    assert_eq!(
        (reply.int("seats_used"), reply.int("seats_total")),
        (1, 1),
        "bob got it"
    );
    let granted = bob.wait_for(&bob_id, T).await.unwrap();
    assert_eq!(granted.status(), Status::Granted);
    assert_eq!(holders(&redis, "lic").await, ["bob"]);

    let all = events(&redis).await;
    let revoked: Vec<_> = all.iter().filter(|e| e["type"] == "revoked").collect();
    assert_eq!(revoked.len(), 1, "{all:?}");
    let e = revoked[0];
    assert_eq!(
        (e["session"].as_str(), e["actor"].as_str(), e["reason"].as_str()),
        ("alice", "ada", "seat shared outside the team")
    );
    assert_eq!((e["seats_used"].as_str(), e["seats_total"].as_str()), ("1", "1"));
    assert!(all
        .iter()
        .any(|e| e["type"] == "granted" && e["session"] == "bob"));

    // The revoked session is told why, on its heartbeat and on its release.
    for op in [Op::Heartbeat, Op::Release] {
        let r = call(&mut client, op, "lic", "alice").await;
        assert_eq!(
            (r.status(), r.get("ok")),
            (Status::SessionRevoked, "0"),
            "{op}: {r:?}"
        );
        assert_eq!(
            r.get("error"),
            "revoked by ada: seat shared outside the team",
            "{op}"
        );
    }
    // No cooldown: alice may queue again at once, and the revocation is forgotten.
    let again = call(&mut client, Op::Acquire, "lic", "alice").await;
    assert_eq!(
        again.status(),
        Status::NoSeatsAvailable,
        "bob holds the only seat"
    );
    let r = call(&mut client, Op::Heartbeat, "lic", "alice").await;
    assert_eq!(r.status(), Status::SessionNotActive, "{r:?}");
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cooldown_refuses_acquires_until_it_ends() {
    let redis = RedisServer::start_with(&[]);
    let (worker, mut client, mut admin) = setup(&redis, redis.settings(), 2).await;
    call(&mut client, Op::Acquire, "lic", "alice").await;
    let reply = admin
        .revoke(&revoke("lic", "alice", "licence audit", 1_500), T)
        .await
        .unwrap();
    assert_eq!(reply.status(), Status::Revoked);
    let started = Instant::now();
    let refused = call(&mut client, Op::Acquire, "lic", "alice").await;
    assert_eq!(
        (refused.status(), refused.get("ok")),
        (Status::SessionRevoked, "0")
    );
    assert!(
        refused
            .get("error")
            .starts_with("revoked by ada: licence audit; acquires refused for another "),
        "{refused:?}"
    );
    assert!(holders(&redis, "lic").await.is_empty());
    // Another session is not concerned.
    assert_eq!(
        call(&mut client, Op::Acquire, "lic", "carol").await.status(),
        Status::Acquired
    );
    tokio::time::sleep(Duration::from_millis(1_600).saturating_sub(started.elapsed())).await;
    let after = call(&mut client, Op::Acquire, "lic", "alice").await;
    assert_eq!(after.status(), Status::Acquired, "{after:?}");
    assert_eq!(
        call(&mut client, Op::Heartbeat, "lic", "alice").await.status(),
        Status::HeartbeatUpdated
    );
    assert_eq!(
        call(&mut client, Op::Release, "lic", "alice").await.status(),
        Status::Released
    );
    assert_eq!(
        call(&mut client, Op::Heartbeat, "lic", "alice").await.status(),
        Status::SessionNotActive,
        "the acquire after the cooldown forgot the revocation"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_waiter_leaves_the_queue_and_its_acquire_is_answered() {
    let redis = RedisServer::start_with(&[]);
    let (worker, mut client, mut admin) = setup(&redis, redis.settings(), 1).await;
    call(&mut client, Op::Acquire, "lic", "alice").await;
    let mut bob = Client::connect_with(&redis.settings()).await.unwrap();
    let bob_id = bob
        .send(&Call::new(Op::Acquire, "lic", "bob").with_wait(30_000))
        .await
        .unwrap();
    assert_eq!(bob.wait_for(&bob_id, T).await.unwrap().status(), Status::Queued);

    let reply = admin
        .revoke(&revoke("lic", "bob", "not entitled", 0), T)
        .await
        .unwrap();
    assert_eq!((reply.status(), reply.int("seats_used")), (Status::Revoked, 1));
    let last = bob.wait_for(&bob_id, T).await.unwrap();
    assert_eq!(
        (last.status(), last.get("op")),
        (Status::SessionRevoked, "acquire"),
        "{last:?}"
    );
    assert!(last.fields.contains_key("waited_ms"));
    let mut con = redis.con().await;
    let k = Keys::new("seat").license("lic");
    for key in [&k.queue, &k.waiters, &k.deadlines, &k.outbox] {
        let n: i64 = redis::cmd("EXISTS").arg(key).query_async(&mut con).await.unwrap();
        assert_eq!(n, 0, "{key} left behind");
    }
    assert_eq!(
        holders(&redis, "lic").await,
        ["alice"],
        "the holder keeps its seat"
    );
    let e = events(&redis).await;
    assert!(
        e.iter()
            .any(|e| e["type"] == "revoked" && e["session"] == "bob" && e["reason"] == "not entitled"),
        "{e:?}"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_session_is_not_found_and_nothing_changes() {
    let redis = RedisServer::start_with(&[]);
    let (worker, mut client, mut admin) = setup(&redis, redis.settings(), 1).await;
    call(&mut client, Op::Acquire, "lic", "alice").await;
    let before = snapshot(&redis).await;
    let reply = admin
        .revoke(&revoke("lic", "nobody", "typo", 60_000), T)
        .await
        .unwrap();
    assert_eq!((reply.status(), reply.get("ok")), (Status::SessionNotFound, "0"));
    let after: Vec<_> = snapshot(&redis)
        .await
        .into_iter()
        .filter(|(k, _)| !k.contains(":done:"))
        .collect();
    let before: Vec<_> = before
        .into_iter()
        .filter(|(k, _)| !k.contains(":done:"))
        .collect();
    assert_eq!(before, after, "nothing but the dedupe record changed");
    assert!(events(&redis).await.iter().all(|e| e["type"] != "revoked"));
    // Nothing remembered: its release is not found, not revoked.
    assert_eq!(
        call(&mut client, Op::Release, "lic", "nobody").await.status(),
        Status::SessionNotFound
    );
    worker.stop().await;
}

/// The requests stream refuses `op revoke` (any caller may write it), and the
/// admin stream every other op.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_stream_takes_its_own_ops_only() {
    let redis = RedisServer::start_with(&[]);
    let (worker, mut client, mut admin) = setup(&redis, redis.settings(), 1).await;
    call(&mut client, Op::Acquire, "lic", "alice").await;
    let before = snapshot(&redis).await;
    let mut con = redis.con().await;
    let _: String = redis::cmd("XADD")
        .arg("seat:requests")
        .arg("*")
        .arg("op")
        .arg("revoke")
        .arg("id")
        .arg("sneaky")
        .arg("license")
        .arg("lic")
        .arg("session")
        .arg("alice")
        .arg("reason")
        .arg("I want it")
        .arg("reply_to")
        .arg(client.reply_to())
        .query_async(&mut con)
        .await
        .unwrap();
    let refused = client.wait_for("sneaky", T).await.unwrap();
    assert_eq!(
        (refused.status(), refused.get("op")),
        (Status::InvalidRequest, "revoke")
    );
    assert!(
        refused.get("error").contains("only on the admin stream"),
        "{refused:?}"
    );
    assert_eq!(snapshot(&redis).await, before, "nothing changed");
    assert_eq!(holders(&redis, "lic").await, ["alice"]);

    let wrong = admin
        .call(&Call::new(Op::Release, "lic", "alice"), T)
        .await
        .unwrap();
    assert_eq!(wrong.status(), Status::InvalidRequest, "{wrong:?}");
    assert!(
        wrong.get("error").contains("only on the requests stream"),
        "{wrong:?}"
    );
    assert_eq!(holders(&redis, "lic").await, ["alice"]);
    worker.stop().await;
}

/// A revoke entry and an acquire entry of one license may carry the same id
/// (ids are per stream): neither must be taken for a redelivery of the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_entry_never_replays_a_request_with_the_same_id() {
    let redis = RedisServer::start_with(&[]);
    let (worker, client, mut admin) = setup(&redis, redis.settings(), 1).await;
    let mut con = redis.con().await;
    let now: (u64, u64) = redis::cmd("TIME").query_async(&mut con).await.unwrap();
    let id = format!("{}-0", now.0 * 1000 + 1_000);
    let xadd = |stream: &str, op: &str, reply_to: &str, rid: &str| {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(stream)
            .arg(&id)
            .arg("op")
            .arg(op)
            .arg("id")
            .arg(rid)
            .arg("license")
            .arg("lic")
            .arg("session")
            .arg("alice")
            .arg("reason")
            .arg("same id")
            .arg("reply_to")
            .arg(reply_to);
        cmd
    };
    let _: String = xadd("seat:requests", "acquire", client.reply_to(), "a-1")
        .query_async(&mut con)
        .await
        .unwrap();
    let mut client = client;
    assert_eq!(
        client.wait_for("a-1", T).await.unwrap().status(),
        Status::Acquired
    );
    let _: String = xadd("seat:admin:requests", "revoke", admin.reply_to(), "r-1")
        .query_async(&mut con)
        .await
        .unwrap();
    let r = admin.wait_for("r-1", T).await.unwrap();
    assert_eq!(r.status(), Status::Revoked, "{r:?}");
    assert!(holders(&redis, "lic").await.is_empty());
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocations_are_forgotten_in_time_and_bounded_per_license() {
    let redis = RedisServer::start_with(&[]);
    let mut settings = redis.settings();
    settings.revoke.remember_ms = 800;
    settings.revoke.max_per_license = 2;
    let (worker, mut client, mut admin) = setup(&redis, settings, 5).await;
    for s in ["s1", "s2", "s3"] {
        call(&mut client, Op::Acquire, "lic", s).await;
        let r = admin.revoke(&revoke("lic", s, "cleanup", 0), T).await.unwrap();
        assert_eq!(r.status(), Status::Revoked);
    }
    let k = Keys::new("seat").license("lic");
    let mut con = redis.con().await;
    let remembered: Vec<String> = redis::cmd("ZRANGE")
        .arg(&k.revoked)
        .arg(0)
        .arg(-1)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        remembered,
        ["s2", "s3"],
        "at most two, the soonest forgotten dropped"
    );
    let records: i64 = redis::cmd("HLEN")
        .arg(&k.revocations)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(records, 2);
    for key in [&k.revoked, &k.revocations] {
        let ttl: i64 = redis::cmd("PTTL").arg(key).query_async(&mut con).await.unwrap();
        assert!(
            (1..=800).contains(&ttl),
            "{key} expires with its last entry: {ttl}"
        );
    }
    assert_eq!(
        call(&mut client, Op::Heartbeat, "lic", "s1").await.status(),
        Status::SessionNotActive,
        "dropped past the bound"
    );
    assert_eq!(
        call(&mut client, Op::Heartbeat, "lic", "s3").await.status(),
        Status::SessionRevoked
    );
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(
        call(&mut client, Op::Heartbeat, "lic", "s3").await.status(),
        Status::SessionNotActive,
        "forgotten after revoke.remember_ms"
    );
    for key in [&k.revoked, &k.revocations] {
        let n: i64 = redis::cmd("EXISTS").arg(key).query_async(&mut con).await.unwrap();
        assert_eq!(n, 0, "{key} expired");
    }
    worker.stop().await;
}

fn seatgate(redis: &RedisServer, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("--redis")
        .arg(redis.url())
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run seatgate")
}

/// `seatgate revoke` as a process against `seatgate run`: exit codes, the
/// default actor, the event and the metric.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_revokes_through_a_running_worker() {
    let redis = RedisServer::start_with(&[]);
    let put = seatgate(&redis, &["license", "put", "cad", "--seats", "1"]);
    assert!(put.status.success(), "{put:?}");
    let worker = WorkerProcess::start(&redis.url(), &[]);
    let acquired = seatgate(&redis, &["acquire", "--license", "cad", "--session", "alice"]);
    assert_eq!(acquired.status.code(), Some(0), "{acquired:?}");

    let args = [
        "revoke",
        "--license",
        "cad",
        "--session",
        "alice",
        "--reason",
        "left the company",
        "--cooldown",
        "1m",
    ];
    let out = seatgate(&redis, &args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        text.starts_with("REVOKED  license=cad session=alice seats=0/1"),
        "{text}"
    );

    let again = seatgate(&redis, &args);
    assert_eq!(again.status.code(), Some(1), "{again:?}");
    assert!(String::from_utf8_lossy(&again.stdout).starts_with("SESSION_NOT_FOUND"));

    let refused = seatgate(&redis, &["acquire", "--license", "cad", "--session", "alice"]);
    assert_eq!(refused.status.code(), Some(1));
    let line = String::from_utf8_lossy(&refused.stdout);
    assert!(line.starts_with("SESSION_REVOKED"), "{line}");
    let me = whoami::username().unwrap();
    assert!(
        line.contains(&format!(
            "(revoked by {me}: left the company; acquires refused for another "
        )),
        "{line}"
    );

    let e = events(&redis).await;
    let revoked: Vec<_> = e.iter().filter(|e| e["type"] == "revoked").collect();
    assert_eq!(revoked.len(), 1);
    assert_eq!(
        (revoked[0]["actor"].as_str(), revoked[0]["reason"].as_str()),
        (me.as_str(), "left the company")
    );

    let (_, metrics) = http_get(&worker.metrics, "/metrics").unwrap();
    assert!(metrics.contains("\nseatgate_revocations_total 1\n"), "{metrics}");
    assert!(metrics.contains("# HELP seatgate_revocations_total "));
    let no_reason = seatgate(&redis, &["revoke", "--license", "cad", "--session", "alice"]);
    assert_eq!(
        no_reason.status.code(),
        Some(2),
        "clap refuses a revoke without --reason"
    );
}
