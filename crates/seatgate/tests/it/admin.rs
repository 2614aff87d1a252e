//! The admin trail (issue 38): every `license put`, `license delete` and
//! group-map change is an event on the license's events, with who did it and
//! the fields before and after, written by the script that makes the change;
//! token changes go on the tokens' trail in the same transaction. `seatgate
//! audit` is clean over them, the usage report charges capacity from a
//! license's creation and from each seat change, `license delete` asks (or
//! takes `--yes`) and has `--dry-run`, and a holder of a deleted license is
//! told so. Real redis-server, real `seatgate` processes.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Output, Stdio};
use std::time::Duration;

use seatgate_client::Call;
use seatgate_core::status::Status;

use crate::support::{
    acquire, client, events, license_keys, output, queue_up, seatgate_cmd, spawn_app, Entry, TestApp,
    WorkerProcess, BIN, T,
};

/// `seatgate <args>` as `actor` (SEATGATE_ACTOR), stdin closed.
async fn as_actor(url: &str, actor: &str, args: &[&str]) -> Output {
    let mut cmd = seatgate_cmd(url, args);
    cmd.env("SEATGATE_ACTOR", actor).stdin(Stdio::null());
    output(cmd).await
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// An admin event's `before` or `after`: field -> value.
type Fields = BTreeMap<String, String>;

/// An admin event's `before` or `after`, decoded.
fn side(e: &Entry, name: &str) -> BTreeMap<String, String> {
    serde_json::from_str(&e[name]).unwrap_or_else(|err| panic!("{name} of {e:?}: {err}"))
}

fn admin_events(all: &[Entry]) -> Vec<&Entry> {
    all.iter()
        .filter(|e| {
            matches!(
                e["type"].as_str(),
                "license_put" | "license_deleted" | "groups_changed"
            )
        })
        .collect()
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[tokio::test]
async fn every_license_and_group_change_is_an_event_naming_its_actor_and_what_changed() {
    let TestApp(redis, s, mut con) = spawn_app().await;
    let url = redis.url();
    let ok = |o: &Output| assert!(o.status.success(), "{}", text(o));
    ok(&as_actor(&url, "ada", &["license", "put", "cad", "--seats", "2"]).await);
    // --actor wins over SEATGATE_ACTOR.
    ok(&as_actor(
        &url,
        "ada",
        &["license", "put", "cad", "--seats", "5", "--actor", "bob"],
    )
    .await);
    // A put that changes nothing writes nothing, and no event.
    ok(&as_actor(&url, "ada", &["license", "put", "cad", "--seats", "5"]).await);
    ok(&as_actor(&url, "ada", &["license", "put", "cad", "--max-per-user", "2"]).await);
    ok(&as_actor(&url, "ada", &["license", "put", "cad", "--unset", "max_per_user"]).await);
    ok(&as_actor(&url, "carol", &["license", "groups", "cad", "set", "eve", "eng"]).await);
    ok(&as_actor(&url, "carol", &["license", "groups", "cad", "set", "eve", "ops"]).await);
    ok(&as_actor(&url, "carol", &["license", "groups", "cad", "unset", "eve"]).await);

    let _worker = WorkerProcess::start(&url, &[]).await;
    let c = client(&s).await;
    let held = c.call(&acquire("cad", "holder", 0), T).await.unwrap();
    assert_eq!(held.status(), Status::Acquired, "{held:?}");
    ok(&as_actor(&url, "dave", &["license", "delete", "cad", "--yes"]).await);

    let all = events(&s, "cad").await;
    let admin = admin_events(&all);
    let seen: Vec<(&str, &str, Fields, Fields)> = admin
        .iter()
        .map(|e| {
            (
                e["type"].as_str(),
                e["actor"].as_str(),
                side(e, "before"),
                side(e, "after"),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (
                "license_put",
                "ada",
                map(&[]),
                map(&[("active", "1"), ("expires_at_ms", "0"), ("seats_total", "2")])
            ),
            (
                "license_put",
                "bob",
                map(&[("seats_total", "2")]),
                map(&[("seats_total", "5")])
            ),
            (
                "license_put",
                "ada",
                map(&[]),
                map(&[("max_per_user", "2"), ("policy", "1")])
            ),
            (
                "license_put",
                "ada",
                map(&[("max_per_user", "2"), ("policy", "1")]),
                map(&[])
            ),
            ("groups_changed", "carol", map(&[]), map(&[("eve", "eng")])),
            (
                "groups_changed",
                "carol",
                map(&[("eve", "eng")]),
                map(&[("eve", "ops")])
            ),
            ("groups_changed", "carol", map(&[("eve", "ops")]), map(&[])),
            (
                "license_deleted",
                "dave",
                map(&[("active", "1"), ("expires_at_ms", "0"), ("seats_total", "5")]),
                map(&[])
            ),
        ],
        "{all:?}"
    );
    // The seat counts of each: after the change (the put that raised the
    // seats says 5; the deletion, like its evictions, 0 of 0).
    assert_eq!(
        (admin[1]["seats_used"].as_str(), admin[1]["seats_total"].as_str()),
        ("0", "5")
    );
    assert_eq!(admin[7]["seats_total"], "0");
    // One numbering with the seat events, no gap: the deletion's event first,
    // then the holder's eviction in the same step.
    let seqs: Vec<u64> = all.iter().map(|e| e["seq"].parse().unwrap()).collect();
    assert_eq!(seqs, (1..=all.len() as u64).collect::<Vec<_>>(), "{all:?}");
    let last = all.last().unwrap();
    assert_eq!(
        (last["type"].as_str(), last["reason"].as_str()),
        ("evicted", "license_deleted")
    );
    assert_eq!(last["at_ms"], admin[7]["at_ms"]);

    // The audit replays them with the seat events: clean.
    let audit = output(seatgate_cmd(&url, &["audit", "--json"])).await;
    assert!(audit.status.success(), "{}", text(&audit));
    let report: serde_json::Value = serde_json::from_slice(&audit.stdout).unwrap();
    assert_eq!(report["violations"], serde_json::json!([]), "{report}");
    // `seatgate events` shows who did it.
    drop(c);
    let _ = &mut con;
}

#[tokio::test]
async fn license_delete_asks_on_a_terminal_takes_yes_and_dry_runs() {
    let TestApp(redis, s, _con) = spawn_app().await;
    let url = redis.url();
    let put = as_actor(&url, "ada", &["license", "put", "cad", "--seats", "1"]).await;
    assert!(put.status.success(), "{}", text(&put));
    let _worker = WorkerProcess::start(&url, &[]).await;
    let c = client(&s).await;
    let held = c.call(&acquire("cad", "holder", 0), T).await.unwrap();
    assert_eq!(held.status(), Status::Acquired, "{held:?}");
    let (queued, _, _waiter) = queue_up(&s, "cad", "waiter", 60_000).await;
    assert_eq!(queued.status(), Status::Queued, "{queued:?}");
    let exists = || async {
        let n: i64 = redis::cmd("EXISTS")
            .arg(license_keys(&s, "cad").license)
            .query_async(&mut crate::support::db(&s).await)
            .await
            .unwrap();
        n == 1
    };

    // Not on a terminal and without --yes: refused, nothing deleted.
    let refused = as_actor(&url, "ada", &["license", "delete", "cad"]).await;
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(text(&refused).contains("--yes"), "{}", text(&refused));
    assert!(exists().await);

    // The dry run names the holders and waiters, and changes nothing.
    let dry = as_actor(&url, "ada", &["license", "delete", "cad", "--dry-run"]).await;
    assert!(dry.status.success(), "{}", text(&dry));
    let said = text(&dry);
    assert!(
        said.contains("would delete license cad")
            && said.contains("1 holders whose seats would end: holder")
            && said.contains("1 waiters who would get LICENSE_NOT_FOUND: waiter"),
        "{said}"
    );
    assert!(exists().await);
    assert!(admin_events(&events(&s, "cad").await)
        .iter()
        .all(|e| e["type"] != "license_deleted"));

    // On a terminal (script(1) gives it one) it asks: "n" keeps it, "y" deletes.
    for (answer, deleted) in [("n", false), ("y", true)] {
        let line = format!("{BIN} --redis {url} license delete cad");
        let mut child = std::process::Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .env("SEATGATE_ACTOR", "ada")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run script(1)");
        let mut stdin = child.stdin.take().unwrap();
        // The answer after the question is asked.
        tokio::time::sleep(Duration::from_millis(700)).await;
        stdin.write_all(format!("{answer}\n").as_bytes()).unwrap();
        let done = tokio::task::spawn_blocking(move || {
            let out = child.wait_with_output();
            drop(stdin);
            out
        })
        .await
        .unwrap()
        .unwrap();
        let said = text(&done);
        assert!(
            said.contains("delete license cad: end 1 seats and 1 waits? [y/N]"),
            "{said}"
        );
        assert_eq!(exists().await, !deleted, "answer {answer}: {said}");
    }

    // The holder's next heartbeat and release are told why it holds no seat.
    let beat = c.call(&Call::heartbeat("cad", "holder"), T).await.unwrap();
    assert_eq!(beat.status(), Status::SessionNotActive, "{beat:?}");
    assert!(beat.get("error").starts_with("license_deleted:"), "{beat:?}");
    let gone = c.call(&Call::release("cad", "holder"), T).await.unwrap();
    assert_eq!(gone.status(), Status::SessionNotFound, "{gone:?}");
    assert!(gone.get("error").starts_with("license_deleted:"), "{gone:?}");
    // A license that never existed (a typo) was not deleted: the plain answer.
    let lease = held.lease().cloned().expect("a lease");
    plain_answer(
        &c,
        Call::release("cda", "holder").with_lease(lease),
        Status::SessionNotFound,
    )
    .await;
    // A session whose seat ended on a license that exists hears the plain
    // answer.
    let put = as_actor(&url, "ada", &["license", "put", "lab", "--seats", "1"]).await;
    assert!(put.status.success(), "{}", text(&put));
    let took = c.call(&acquire("lab", "other", 0), T).await.unwrap();
    let lease = took.lease().cloned().expect("a lease");
    let freed = c.call(&Call::release("lab", "other"), T).await.unwrap();
    assert_eq!(freed.status(), Status::Released, "{freed:?}");
    plain_answer(
        &c,
        Call::heartbeat("lab", "other").with_lease(lease),
        Status::SessionNotActive,
    )
    .await;
}

/// `call` is answered `status` without naming a deletion.
async fn plain_answer(c: &seatgate_client::Client, call: Call, status: Status) {
    let reply = c.call(&call, T).await.unwrap();
    assert_eq!(reply.status(), status, "{reply:?}");
    assert!(!reply.get("error").contains("license_deleted"), "{reply:?}");
}

#[tokio::test]
async fn the_report_charges_capacity_from_a_license_s_creation_and_each_seat_change() {
    let TestApp(redis, s, mut con) = spawn_app().await;
    let url = redis.url();
    // The period starts an hour before the license exists.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let created = as_actor(&url, "ada", &["license", "put", "cad", "--seats", "2"]).await;
    assert!(created.status.success(), "{}", text(&created));
    tokio::time::sleep(Duration::from_millis(800)).await;
    let raised = as_actor(&url, "ada", &["license", "put", "cad", "--seats", "4"]).await;
    assert!(raised.status.success(), "{}", text(&raised));
    tokio::time::sleep(Duration::from_millis(500)).await;

    let all = events(&s, "cad").await;
    let puts = admin_events(&all);
    assert_eq!(puts.len(), 2, "{all:?}");
    let at = |e: &Entry| e["at_ms"].parse::<i64>().unwrap();
    let report = crate::support::usage_last_hour(&mut con, &s, "cad").await;
    let cad = &report.licenses[0];
    let expected = 2 * (at(puts[1]) - at(puts[0])) + 4 * (report.until_ms - at(puts[1]));
    assert_eq!(cad.capacity_ms, expected, "{cad:#?}");
    assert!(
        cad.capacity_ms < 4 * 3_000,
        "capacity from the creation on, not from the period's start: {cad:#?}"
    );
    assert_eq!(cad.seats_total, 4);
}

#[tokio::test]
async fn token_issues_and_revokes_are_on_the_tokens_trail_with_their_actor() {
    let TestApp(redis, _s, _con) = spawn_app().await;
    let url = redis.url();
    let issued = as_actor(
        &url,
        "ada",
        &[
            "token", "issue", "--app", "cad", "--user", "eve", "--note", "laptop",
        ],
    )
    .await;
    assert!(issued.status.success(), "{}", text(&issued));
    let list = output(seatgate_cmd(&url, &["token", "list", "--json"])).await;
    let record: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    let id = record["id"].as_str().unwrap().to_owned();
    let revoked = as_actor(&url, "ada", &["token", "revoke", &id, "--actor", "sec"]).await;
    assert!(revoked.status.success(), "{}", text(&revoked));
    // A second revoke finds nothing and writes nothing.
    let again = as_actor(&url, "ada", &["token", "revoke", &id]).await;
    assert_eq!(again.status.code(), Some(1), "{}", text(&again));

    let trail = output(seatgate_cmd(&url, &["token", "trail", "--json"])).await;
    assert!(trail.status.success(), "{}", text(&trail));
    let entries: Vec<serde_json::Value> = String::from_utf8_lossy(&trail.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seen: Vec<(&str, &str, &str)> = entries
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap(),
                e["token"].as_str().unwrap(),
                e["actor"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("token_issued", id.as_str(), "ada"),
            ("token_revoked", id.as_str(), "sec")
        ]
    );
    let names: serde_json::Value = serde_json::from_str(entries[0]["after"].as_str().unwrap()).unwrap();
    assert_eq!(
        (
            names["app"].as_str(),
            names["user"].as_str(),
            names["note"].as_str()
        ),
        (Some("cad"), Some("eve"), Some("laptop"))
    );
    assert_eq!(entries[0]["before"], "{}");
    assert_eq!(entries[1]["before"], entries[0]["after"]);
    assert_eq!(entries[1]["after"], "{}");
    // Never the token itself.
    let token = String::from_utf8_lossy(&issued.stdout).trim().to_owned();
    assert!(!String::from_utf8_lossy(&trail.stdout).contains(&token));
}
