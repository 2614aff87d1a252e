//! An administrator's revoke: lua/revoke.lua against its documented
//! outcomes, over the admin stream through a real worker, and as the
//! `seatgate revoke` process; what the revoked session hears after it,
//! cooldowns, waiters, bounded memory, and what each stream refuses.

use std::time::{Duration, Instant};

use seatgate::config::Settings;
use seatgate_client::{AdminClient, Call, Client, Reply, Revoke, SeatOp};
use seatgate_core::policy::RequestPolicy;
use seatgate_core::records::parse_dedupe_record;
use seatgate_core::request::Guard;
use seatgate_core::scripts::{Decision, Outcome};
use seatgate_core::status::Status;

use crate::support::{
    add_request, client, direct, events, holders, keys, license_keys, metric, output, put_license, queue_up,
    redis_ms, seatgate_cmd, snapshot, spawn_app, spawn_worker, Entry, TestApp, WorkerHandle, WorkerProcess,
    T,
};

fn revoke(session: &str, reason: &str, cooldown_ms: u64) -> Revoke {
    Revoke {
        license: "lic".into(),
        session: session.into(),
        reason: reason.into(),
        actor: "ada".into(),
        cooldown_ms,
        user_wide: false,
    }
}

async fn call(client: &Client, op: SeatOp, session: &str) -> Reply {
    client.call(&Call::new(op, "lic", session), T).await.unwrap()
}

fn of_type<'a>(events: &'a [Entry], kind: &str) -> Vec<&'a Entry> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

/// A worker, a client and an admin client for a `seats`-seat license `lic`.
async fn serve(s: &Settings, seats: u64) -> (WorkerHandle, Client, AdminClient) {
    put_license(s, "lic", seats).await;
    let worker = spawn_worker(s.clone(), "w1").await;
    let admin = s.client().connect_admin().await.unwrap();
    (worker, client(s).await, admin)
}

/// Every outcome lua/revoke.lua documents, and SESSION_REVOKED from the
/// other scripts with the record decoded, called directly.
#[tokio::test]
async fn revoke_answers_the_documented_outcomes() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    put_license(&s, "lic", 1).await;
    let (a, b, c) = (
        direct(&s, "lic", "a"),
        direct(&s, "lic", "b"),
        direct(&s, "lic", "c"),
    );
    assert_eq!(a.acquire(&mut con).await.status(), Status::Acquired);
    assert_eq!(
        b.queue(&mut con, 60_000, "req-b", "seat:reply:b").await.status(),
        Status::Queued
    );

    // A holder: its seat goes to the head of the queue in the same script.
    let o = a.revoke(&mut con, "audit", "ada", 0).await;
    assert_eq!(
        (o.status(), o.seats_used, o.seats_total, o.changed, o.replayed),
        (Status::Revoked, 1, 1, true, false)
    );
    assert_eq!(o.decision, Decision::Revoked { held: true });
    let notes: Vec<(Status, &str)> = o.notes.iter().map(|n| (n.status, n.session.as_str())).collect();
    assert_eq!(notes, [(Status::Granted, "b")]);
    assert_eq!(holders(&s, "lic").await, ["b"]);
    for heard in [a.heartbeat(&mut con).await, a.release(&mut con).await] {
        assert_eq!(heard.status(), Status::SessionRevoked);
        let Decision::SessionRevoked(Some(r)) = heard.decision else {
            panic!("the record comes back: {heard:?}")
        };
        assert_eq!(
            (r.reason.as_str(), r.actor.as_str(), r.cooldown_until),
            ("audit", "ada", 0)
        );
        assert!(r.at <= heard.now_ms);
    }

    // A waiter: out of the queue, its acquire answered through the outbox.
    assert_eq!(
        c.queue(&mut con, 60_000, "req-c", "seat:reply:c").await.status(),
        Status::Queued
    );
    let o = c.revoke(&mut con, "not entitled", "ada", 60_000).await;
    assert_eq!(
        (&o.decision, o.seats_used),
        (&Decision::Revoked { held: false }, 1)
    );
    let [n] = &o.notes[..] else {
        panic!("{:?}", o.notes)
    };
    assert_eq!(
        (
            n.status,
            n.session.as_str(),
            n.request_id.as_str(),
            n.reply_to.as_str()
        ),
        (Status::SessionRevoked, "c", "req-c", "seat:reply:c")
    );
    assert_eq!(n.note_id, format!("SESSION_REVOKED:c:{}", o.now_ms));
    let k = license_keys(&s, "lic");
    let kept: bool = redis::cmd("HEXISTS")
        .arg(&k.outbox)
        .arg(&n.note_id)
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(kept, "the note waits in the outbox until delivered");
    let queued: i64 = redis::cmd("ZCARD")
        .arg(&k.queue)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(queued, 0);
    let refused = c.acquire(&mut con).await;
    assert_eq!(refused.status(), Status::SessionRevoked, "in its cooldown");
    let Decision::SessionRevoked(Some(revocation)) = &refused.decision else {
        panic!("{refused:?}")
    };
    let until = revocation.cooldown_until;
    assert!(until > refused.now_ms && until <= o.now_ms + 60_000, "{until}");

    // Neither: nothing changes, nothing is remembered.
    let before = snapshot(&s).await;
    let ghost = direct(&s, "lic", "ghost");
    assert_eq!(
        ghost.revoke(&mut con, "typo", "ada", 60_000).await.status(),
        Status::SessionNotFound
    );
    assert_eq!(snapshot(&s).await, before);
    assert_eq!(ghost.heartbeat(&mut con).await.status(), Status::SessionNotActive);
}

/// A redelivered revoke (and a redelivered SESSION_REVOKED) answers its
/// stored outcome, and the dedupe record decodes to it, record and all.
#[tokio::test]
async fn a_replayed_revoke_answers_its_stored_outcome() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    put_license(&s, "lic", 1).await;
    direct(&s, "lic", "a").acquire(&mut con).await;
    // Entry ids of now: their dedupe bucket lives a window or two from now.
    let now = redis_ms(&mut con).await;
    let (revoke_id, heartbeat_id) = (format!("{now}-0"), format!("{now}-1"));
    // As a worker guards an entry: it always asks for the earlier reply.
    let guard = |id: &str| Guard {
        redelivery: true,
        ..Guard::for_entry(&s.guard_policy(), &keys(&s), id, "lic", "a")
    };
    let entry = |id: &str| direct(&s, "lic", "a").with_guard(guard(id));
    let revoked = entry(&revoke_id).revoke(&mut con, "audit", "ada", 0).await;
    let heard = entry(&heartbeat_id).heartbeat(&mut con).await;
    assert_eq!(
        (revoked.status(), heard.status()),
        (Status::Revoked, Status::SessionRevoked)
    );
    assert!(matches!(heard.decision, Decision::SessionRevoked(Some(_))));
    let again = [
        entry(&revoke_id).revoke(&mut con, "other", "eve", 0).await,
        entry(&heartbeat_id).heartbeat(&mut con).await,
    ];
    for ((id, first), again) in [(&revoke_id, revoked), (&heartbeat_id, heard)]
        .into_iter()
        .zip(again)
    {
        // The same answer; the time is the replay's own (no reply carries it).
        let replayed = Outcome {
            changed: false,
            replayed: true,
            now_ms: again.now_ms,
            ..first
        };
        assert_eq!(again, replayed, "{id}");
        let done = guard(id).done_key;
        let raw: String = redis::cmd("HGET")
            .arg(&done)
            .arg(id)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(
            parse_dedupe_record(&raw, again.now_ms).unwrap(),
            replayed,
            "{raw}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_holder_loses_its_seat_to_the_queue_and_hears_why() {
    let TestApp(_redis, s, _) = spawn_app().await;
    let (worker, alice, admin) = serve(&s, 1).await;
    assert_eq!(
        call(&alice, SeatOp::Acquire, "alice").await.status(),
        Status::Acquired
    );
    let (queued, bob_id, bob) = queue_up(&s, "lic", "bob", 30_000).await;
    assert_eq!(queued.status(), Status::Queued);

    let reply = admin
        .revoke(&revoke("alice", "seat shared outside the team", 0), T)
        .await
        .unwrap();
    assert_eq!(
        (reply.status(), reply.get("ok")),
        (Status::Revoked, "1"),
        "{reply:?}"
    );
    assert_eq!(
        (reply.get("op"), reply.int("seats_used"), reply.int("seats_total")),
        ("revoke", 1, 1),
        "bob got the seat in the same script"
    );
    assert_eq!(bob.wait_for(&bob_id, T).await.unwrap().status(), Status::Granted);
    assert_eq!(holders(&s, "lic").await, ["bob"]);

    let all = events(&s, "lic").await;
    let revoked = of_type(&all, "revoked");
    assert_eq!(revoked.len(), 1, "{all:?}");
    let e = revoked[0];
    assert_eq!(
        (e["session"].as_str(), e["actor"].as_str(), e["reason"].as_str()),
        ("alice", "ada", "seat shared outside the team")
    );
    assert_eq!(
        (
            e["seats_used"].as_str(),
            e["seats_total"].as_str(),
            e["held"].as_str()
        ),
        ("1", "1", "1")
    );
    let granted = of_type(&all, "granted");
    assert_eq!(granted.len(), 1);
    assert_eq!(
        (granted[0]["session"].as_str(), granted[0]["at_ms"].as_str()),
        ("bob", e["at_ms"].as_str())
    );

    // The revoked session is told why, on its heartbeat and on its release.
    for op in [SeatOp::Heartbeat, SeatOp::Release] {
        let r = call(&alice, op, "alice").await;
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
    // No cooldown: alice may acquire again at once (bob holds the only
    // seat), and that acquire forgets the revocation.
    assert_eq!(
        call(&alice, SeatOp::Acquire, "alice").await.status(),
        Status::NoSeatsAvailable
    );
    assert_eq!(
        call(&alice, SeatOp::Heartbeat, "alice").await.status(),
        Status::SessionNotActive
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cooldown_refuses_acquires_until_it_ends() {
    let TestApp(_redis, s, _) = spawn_app().await;
    let (worker, c, admin) = serve(&s, 2).await;
    call(&c, SeatOp::Acquire, "alice").await;
    let reply = admin
        .revoke(&revoke("alice", "licence audit", 1_500), T)
        .await
        .unwrap();
    assert_eq!(reply.status(), Status::Revoked);
    let started = Instant::now();
    let refused = call(&c, SeatOp::Acquire, "alice").await;
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
    assert!(holders(&s, "lic").await.is_empty());
    assert_eq!(
        call(&c, SeatOp::Acquire, "carol").await.status(),
        Status::Acquired,
        "other sessions are not concerned"
    );
    tokio::time::sleep(Duration::from_millis(1_600).saturating_sub(started.elapsed())).await;
    assert_eq!(
        call(&c, SeatOp::Acquire, "alice").await.status(),
        Status::Acquired
    );
    assert_eq!(
        call(&c, SeatOp::Heartbeat, "alice").await.status(),
        Status::HeartbeatUpdated
    );
    assert_eq!(
        call(&c, SeatOp::Release, "alice").await.status(),
        Status::Released
    );
    assert_eq!(
        call(&c, SeatOp::Heartbeat, "alice").await.status(),
        Status::SessionNotActive,
        "the acquire after the cooldown forgot the revocation"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_waiter_leaves_the_queue_and_its_acquire_is_answered() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    let (worker, c, admin) = serve(&s, 1).await;
    call(&c, SeatOp::Acquire, "alice").await;
    let (queued, bob_id, bob) = queue_up(&s, "lic", "bob", 30_000).await;
    assert_eq!(queued.status(), Status::Queued);

    let reply = admin.revoke(&revoke("bob", "not entitled", 0), T).await.unwrap();
    assert_eq!((reply.status(), reply.int("seats_used")), (Status::Revoked, 1));
    let last = bob.wait_for(&bob_id, T).await.unwrap();
    assert_eq!(
        (last.status(), last.get("op")),
        (Status::SessionRevoked, "acquire"),
        "{last:?}"
    );
    assert_eq!(last.get("error"), "the session was revoked by an administrator");
    assert!(last.fields.contains_key("waited_ms"));
    let k = license_keys(&s, "lic");
    for key in [&k.queue, &k.waiters, &k.deadlines, &k.outbox] {
        let n: i64 = redis::cmd("EXISTS").arg(key).query_async(&mut con).await.unwrap();
        assert_eq!(n, 0, "{key} left behind");
    }
    assert_eq!(holders(&s, "lic").await, ["alice"], "the holder keeps its seat");
    let all = events(&s, "lic").await;
    let revoked = of_type(&all, "revoked");
    assert_eq!(revoked.len(), 1, "{all:?}");
    assert_eq!(
        (
            revoked[0]["session"].as_str(),
            revoked[0]["reason"].as_str(),
            revoked[0]["held"].as_str()
        ),
        ("bob", "not entitled", "0"),
        "a waiter held no seat"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_session_is_not_found_and_nothing_changes() {
    let TestApp(_redis, s, _) = spawn_app().await;
    let (worker, c, admin) = serve(&s, 1).await;
    call(&c, SeatOp::Acquire, "alice").await;
    let not_dedupe = |snap: Vec<(String, Vec<u8>)>| -> Vec<(String, Vec<u8>)> {
        snap.into_iter().filter(|(k, _)| !k.contains(":done:")).collect()
    };
    let before = not_dedupe(snapshot(&s).await);
    let reply = admin.revoke(&revoke("nobody", "typo", 60_000), T).await.unwrap();
    assert_eq!((reply.status(), reply.get("ok")), (Status::SessionNotFound, "0"));
    assert_eq!(
        reply.get("error"),
        "the session neither holds a seat nor waits for one"
    );
    assert_eq!(
        not_dedupe(snapshot(&s).await),
        before,
        "only the dedupe record is new"
    );
    assert!(of_type(&events(&s, "lic").await, "revoked").is_empty());
    let lease = seatgate_core::protocol::Lease::parse(&crate::support::lease_of("nobody")).unwrap();
    let release = Call::release("lic", "nobody").with_lease(lease);
    assert_eq!(
        c.call(&release, T).await.unwrap().status(),
        Status::SessionNotFound,
        "nothing remembered"
    );
    worker.stop().await;
}

/// The requests stream refuses `op revoke` (any service may write it), and
/// the admin stream every other op.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_stream_takes_its_own_ops_only() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    let (worker, c, admin) = serve(&s, 1).await;
    call(&c, SeatOp::Acquire, "alice").await;
    let before = snapshot(&s).await;
    add_request(
        &mut con,
        &s,
        &[
            ("op", "revoke"),
            ("id", "sneaky"),
            ("license", "lic"),
            ("session", "alice"),
            ("reason", "I want it"),
            ("reply_to", c.reply_to()),
        ],
    )
    .await;
    let refused = c.wait_for("sneaky", T).await.unwrap();
    assert_eq!(
        (refused.status(), refused.get("op")),
        (Status::InvalidRequest, "revoke")
    );
    assert_eq!(
        refused.get("error"),
        "op `revoke` is not accepted on the requests stream (stream.requests), only on the admin stream (stream.admin_requests)"
    );
    assert_eq!(snapshot(&s).await, before, "nothing changed");

    // Not something an AdminClient sends (it only revokes): written by hand.
    let _: String = redis::cmd("XADD")
        .arg(&s.stream.admin_requests)
        .arg("*")
        .arg("op")
        .arg("release")
        .arg("id")
        .arg("wrong-op")
        .arg("license")
        .arg("lic")
        .arg("session")
        .arg("alice")
        .arg("reply_to")
        .arg(admin.reply_to())
        .query_async(&mut con)
        .await
        .unwrap();
    let wrong = admin.wait_for("wrong-op", T).await.unwrap();
    assert_eq!(wrong.status(), Status::InvalidRequest, "{wrong:?}");
    assert!(
        wrong.get("error").contains("only on the requests stream"),
        "{wrong:?}"
    );
    assert_eq!(snapshot(&s).await, before, "nothing changed");
    worker.stop().await;
}

/// A revoke entry and an acquire entry of one license may carry the same id
/// (ids are per stream): neither must be taken for a redelivery of the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_entry_never_replays_a_request_with_the_same_id() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    let (worker, c, admin) = serve(&s, 1).await;
    // One id for both, a second ahead of the server's clock so neither
    // stream has passed it.
    let id = format!("{}-0", redis_ms(&mut con).await + 1_000);
    let add = |stream: &str, op: &str, rid: &str, reply_to: &str| {
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
        if op == "acquire" {
            cmd.arg("lease").arg(crate::support::lease_of("alice"));
        }
        cmd
    };
    let _: String = add(&s.stream.requests, "acquire", "a-1", c.reply_to())
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(c.wait_for("a-1", T).await.unwrap().status(), Status::Acquired);
    let _: String = add(&s.stream.admin_requests, "revoke", "r-1", admin.reply_to())
        .query_async(&mut con)
        .await
        .unwrap();
    let r = admin.wait_for("r-1", T).await.unwrap();
    assert_eq!(r.status(), Status::Revoked, "{r:?}");
    assert!(holders(&s, "lic").await.is_empty());
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocations_are_forgotten_in_time_and_bounded_per_license() {
    let TestApp(_redis, mut s, mut con) = spawn_app().await;
    s.revoke.remember_ms = 800;
    s.revoke.max_per_license = 2;
    let (worker, c, admin) = serve(&s, 5).await;
    for session in ["s1", "s2", "s3"] {
        call(&c, SeatOp::Acquire, session).await;
        let r = admin.revoke(&revoke(session, "cleanup", 0), T).await.unwrap();
        assert_eq!(r.status(), Status::Revoked);
    }
    let k = license_keys(&s, "lic");
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
        call(&c, SeatOp::Heartbeat, "s1").await.status(),
        Status::SessionNotActive,
        "dropped past the bound"
    );
    assert_eq!(
        call(&c, SeatOp::Heartbeat, "s3").await.status(),
        Status::SessionRevoked
    );
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(
        call(&c, SeatOp::Heartbeat, "s3").await.status(),
        Status::SessionNotActive,
        "forgotten after revoke.remember_ms"
    );
    for key in [&k.revoked, &k.revocations] {
        let n: i64 = redis::cmd("EXISTS").arg(key).query_async(&mut con).await.unwrap();
        assert_eq!(n, 0, "{key} expired");
    }
    worker.stop().await;
}

/// `seatgate revoke` as a process against `seatgate run`: exit codes, the
/// default actor, the event, the metric.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_revokes_through_a_running_worker() {
    let TestApp(redis, s, _) = spawn_app().await;
    let url = redis.url();
    let run = |args: &[&str]| output(seatgate_cmd(&url, args));
    let put = run(&["license", "put", "lic", "--seats", "1"]).await;
    assert!(put.status.success(), "{put:?}");
    let worker = WorkerProcess::start(&url, &[]).await;
    let acquired = run(&["acquire", "--license", "lic", "--session", "alice"]).await;
    assert_eq!(acquired.status.code(), Some(0), "{acquired:?}");

    let args = [
        "revoke",
        "--license",
        "lic",
        "--session",
        "alice",
        "--reason",
        "left the company",
        "--cooldown",
        "1m",
    ];
    let out = run(&args).await;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(text, "REVOKED  license=lic session=alice seats=0/1\n");

    let again = run(&args).await;
    assert_eq!(again.status.code(), Some(1), "{again:?}");
    assert!(String::from_utf8_lossy(&again.stdout).starts_with("SESSION_NOT_FOUND"));

    let refused = run(&["acquire", "--license", "lic", "--session", "alice"]).await;
    assert_eq!(refused.status.code(), Some(1));
    let line = String::from_utf8_lossy(&refused.stdout).into_owned();
    let me = whoami::username().unwrap();
    assert!(
        line.starts_with(&format!(
            "SESSION_REVOKED  license=lic session=alice seats=0/1  (revoked by {me}: left the company; acquires refused for another "
        )),
        "{line}"
    );

    let all = events(&s, "lic").await;
    let revoked = of_type(&all, "revoked");
    assert_eq!(revoked.len(), 1);
    assert_eq!(
        (revoked[0]["actor"].as_str(), revoked[0]["reason"].as_str()),
        (me.as_str(), "left the company"),
        "the actor defaults to the OS user"
    );

    let page = worker.scrape().await;
    assert_eq!(metric(&page, "seatgate_revocations_total"), Some(1.0), "{page}");
    assert!(page.contains("# HELP seatgate_revocations_total "), "{page}");
    assert_eq!(
        metric(
            &page,
            r#"seatgate_requests_total{op="revoke",status="SESSION_NOT_FOUND"}"#
        ),
        Some(1.0)
    );
    let no_reason = run(&["revoke", "--license", "lic", "--session", "alice"]).await;
    assert_eq!(no_reason.status.code(), Some(2), "a revoke must say why");
}

/// A seat bound to a lease is revoked without it: the revoke is the
/// administrator's way around leases, even where every request must carry
/// one. The holder, lease and all, then hears why; a waiter bound to a lease
/// loses its place the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_bound_session_is_revoked_without_its_lease() {
    let TestApp(_redis, mut s, _) = spawn_app().await;
    s.sessions.require_lease = true;
    let (worker, holder, admin) = serve(&s, 1).await;
    let acquired = call(&holder, SeatOp::Acquire, "alice").await;
    assert_eq!(acquired.status(), Status::Acquired);
    assert!(acquired.lease().is_some(), "the client bound the seat to a lease");
    let (queued, bob_id, bob) = queue_up(&s, "lic", "bob", 30_000).await;
    assert_eq!(queued.status(), Status::Queued);
    let bob_lease = queued.lease().cloned().expect("bob's place is bound too");

    // Anybody else is refused: no lease, or another one.
    let other = client(&s).await;
    let stranger = Call::release("lic", "alice")
        .with_lease(seatgate_core::protocol::Lease::parse("not-the-holders-lease").unwrap());
    let refused = other.call(&stranger, T).await.unwrap();
    assert_eq!(refused.status(), Status::LeaseMismatch);
    assert_eq!(holders(&s, "lic").await, ["alice"]);

    let reply = admin
        .revoke(&revoke("alice", "laptop stolen", 0), T)
        .await
        .unwrap();
    assert_eq!(reply.status(), Status::Revoked, "{reply:?}");
    assert_eq!(bob.wait_for(&bob_id, T).await.unwrap().status(), Status::Granted);
    assert_eq!(holders(&s, "lic").await, ["bob"]);
    let heard = call(&holder, SeatOp::Heartbeat, "alice").await;
    assert_eq!(
        (heard.status(), heard.get("error")),
        (Status::SessionRevoked, "revoked by ada: laptop stolen"),
        "the holder's own lease does not bring the seat back"
    );

    // Bob's seat is bound to the lease his place was: revoked all the same.
    let reply = admin.revoke(&revoke("bob", "audit", 0), T).await.unwrap();
    assert_eq!(reply.status(), Status::Revoked);
    assert!(holders(&s, "lic").await.is_empty());
    let heard = bob
        .call(&Call::heartbeat("lic", "bob").with_lease(bob_lease), T)
        .await
        .unwrap();
    assert_eq!(heard.status(), Status::SessionRevoked);
    worker.stop().await;
}

/// A revoke's cooldown bound only the session id: the same user with a new
/// session id acquired at once. With `user_wide` the cooldown binds the
/// revoked session's user (from its owner record) until it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_wide_cooldown_refuses_the_user_under_a_new_session_id() {
    let TestApp(_redis, s, _) = spawn_app().await;
    let (worker, c, admin) = serve(&s, 3).await;
    let as_user = |session: &str, user: &str| {
        Call::acquire("lic", session).with_policy(RequestPolicy {
            user: Some(user.to_owned()),
            ..RequestPolicy::NONE
        })
    };
    let acquire = |session: &'static str, user: &'static str| {
        let (c, call) = (&c, as_user(session, user));
        async move { c.call(&call, T).await.unwrap() }
    };
    assert_eq!(acquire("a1", "alice").await.status(), Status::Acquired);
    let reply = admin
        .revoke(
            &Revoke {
                user_wide: true,
                ..revoke("a1", "shared account", 1_500)
            },
            T,
        )
        .await
        .unwrap();
    assert_eq!(reply.status(), Status::Revoked);
    let started = Instant::now();
    let refused = acquire("a2", "alice").await;
    assert_eq!(
        (refused.status(), refused.get("ok")),
        (Status::SessionRevoked, "0"),
        "{refused:?}"
    );
    assert!(
        refused
            .get("error")
            .starts_with("revoked by ada: shared account; acquires refused for another "),
        "{refused:?}"
    );
    assert_eq!(
        acquire("b1", "bob").await.status(),
        Status::Acquired,
        "other users are not concerned"
    );
    tokio::time::sleep(Duration::from_millis(1_600).saturating_sub(started.elapsed())).await;
    assert_eq!(acquire("a2", "alice").await.status(), Status::Acquired);
    assert_eq!(holders(&s, "lic").await, ["a2", "b1"]);
    worker.stop().await;
}
