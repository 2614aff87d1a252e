//! The real `seatgate` binary: the worker as a process, the CLI client and
//! provisioning commands, exit codes, and `/metrics` counting what it served.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::{
    free_port, http_get, metric, output, printed_lease, seatgate_cmd, spawn_app, spawn_app_with,
    spawn_worker, RedisServer, RedisServerExt, Spawned, TestApp, WorkerProcess, BIN,
};

/// `seatgate <args>` against `redis`, to its end.
async fn seatgate(redis: &RedisServer, args: &[&str]) -> Output {
    output(seatgate_cmd(&redis.url(), args)).await
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A lease may start with `-` (its charset has it; a client's random one
/// does now and then): `--lease -I…` is the lease, not an unknown option.
#[tokio::test]
async fn a_lease_starting_with_a_dash_is_a_lease() {
    let redis = RedisServer::start_with(&[]).await;
    let put = seatgate(&redis, &["license", "put", "cad", "--seats", "1"]).await;
    assert!(put.status.success(), "{put:?}");
    let _worker = WorkerProcess::start(&redis.url(), &[]).await;
    let lease = "-Ia8fZ0q_x-Lm2Tb7";
    for op in ["acquire", "heartbeat", "release"] {
        let o = seatgate(
            &redis,
            &[op, "--license", "cad", "--session", "s0", "--lease", lease],
        )
        .await;
        assert_eq!(o.status.code(), Some(0), "{op}: {o:?}");
    }
}

/// The lease need not be on a command line (which other users of the
/// machine can read): `SEATGATE_LEASE` or `--lease-file` give it, and
/// without one the seat's heartbeat is refused (`sessions.require_lease`).
#[tokio::test]
async fn the_lease_comes_from_the_environment_or_a_file() {
    let redis = RedisServer::start_with(&[]).await;
    let put = seatgate(&redis, &["license", "put", "cad", "--seats", "1"]).await;
    assert!(put.status.success(), "{put:?}");
    let _worker = WorkerProcess::start(&redis.url(), &[]).await;
    let lease = "f00dfeedf00dfeedf00dfeedf00dfeed";
    let run = |args: &[&str], env: Option<&str>| {
        let mut cmd = seatgate_cmd(&redis.url(), args);
        if let Some(lease) = env {
            cmd.env("SEATGATE_LEASE", lease);
        }
        output(cmd)
    };
    let s0 = ["--license", "cad", "--session", "s0"];
    let acquired = run(&[&["acquire"][..], &s0].concat(), Some(lease)).await;
    assert!(stdout(&acquired).starts_with("ACQUIRED"), "{acquired:?}");
    assert!(
        stdout(&acquired).contains(&format!("lease={lease}")),
        "bound to the variable's lease: {acquired:?}"
    );
    let without = run(&[&["heartbeat"][..], &s0].concat(), None).await;
    assert!(
        stdout(&without).starts_with("INVALID_REQUEST") && stdout(&without).contains("`lease`"),
        "{without:?}"
    );
    let from_env = run(&[&["heartbeat"][..], &s0].concat(), Some(lease)).await;
    assert!(stdout(&from_env).starts_with("HEARTBEAT_UPDATED"), "{from_env:?}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lease");
    std::fs::write(&file, format!("{lease}\n")).unwrap();
    let path = file.display().to_string();
    let released = run(&[&["release"][..], &s0, &["--lease-file", &path]].concat(), None).await;
    assert!(stdout(&released).starts_with("RELEASED"), "{released:?}");
    // The variable's value never shows in the help.
    let help = run(&["heartbeat", "--help"], Some(lease)).await;
    assert!(stdout(&help).contains("SEATGATE_LEASE"), "{help:?}");
    assert!(!stdout(&help).contains(lease), "{help:?}");
}

#[tokio::test]
async fn cli_client_against_a_running_worker_and_metrics_count_what_was_served() {
    let redis = RedisServer::start_with(&[]).await;
    let put = seatgate(&redis, &["license", "put", "cad", "--seats", "3"]).await;
    assert!(put.status.success(), "{put:?}");
    let mut worker = WorkerProcess::start(&redis.url(), &[]).await;

    let mut leases = Vec::new();
    for i in 0..5 {
        let session = format!("s{i}");
        let o = seatgate(
            &redis,
            &[
                "acquire",
                "--license",
                "cad",
                "--session",
                &session,
                "--meta",
                r#"{"user_email":"u@x.io"}"#,
            ],
        )
        .await;
        if i < 3 {
            assert_eq!(o.status.code(), Some(0), "{o:?}");
            assert!(stdout(&o).starts_with("ACQUIRED"), "{}", stdout(&o));
            // How often to heartbeat, without reading the service's settings.
            assert!(
                stdout(&o).contains(" heartbeat_timeout_ms=90000 "),
                "{}",
                stdout(&o)
            );
            leases.push(printed_lease(&stdout(&o)));
        } else {
            assert_eq!(o.status.code(), Some(1), "refused acquire exits 1: {o:?}");
            assert!(stdout(&o).starts_with("NO_SEATS_AVAILABLE"), "{}", stdout(&o));
        }
    }
    // Each heartbeat says the timeout in force (an operator may change it),
    // as JSON and in the printed line.
    for (n, json) in [(1, true), (2, false)] {
        let mut args = vec![
            "heartbeat",
            "--license",
            "cad",
            "--session",
            "s0",
            "--lease",
            &leases[0],
        ];
        if json {
            args.push("--json");
        }
        let o = seatgate(&redis, &args).await;
        if json {
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("--json prints JSON");
            assert_eq!(v["status"], "HEARTBEAT_UPDATED");
            assert_eq!(v["heartbeat_timeout_ms"], "90000");
        } else {
            assert_eq!(
                stdout(&o),
                format!(
                    "HEARTBEAT_UPDATED  license=cad session=s0 seats=3/3 heartbeats={n} heartbeat_timeout_ms=90000\n"
                )
            );
        }
    }
    let o = seatgate(
        &redis,
        &[
            "release",
            "--license",
            "cad",
            "--session",
            "s1",
            "--lease",
            &leases[1],
        ],
    )
    .await;
    assert_eq!(o.status.code(), Some(0));

    let (code, text) = http_get(&worker.metrics, "/metrics")
        .await
        .expect("metrics endpoint");
    assert_eq!(code, 200);
    let exec = |script: &str, result: &str| {
        metric(
            &text,
            &format!("license_lua_script_executions_total{{script_name=\"{script}\",result=\"{result}\"}}"),
        )
        .unwrap_or(0.0)
    };
    assert_eq!(exec("acquire", "success"), 3.0, "{text}");
    assert_eq!(exec("acquire", "failure"), 2.0);
    assert_eq!(exec("heartbeat", "success"), 2.0);
    assert_eq!(exec("release", "success"), 1.0);
    let latency_count = |script: &str| {
        metric(
            &text,
            &format!("license_lua_script_latency_seconds_count{{script_name=\"{script}\"}}"),
        )
        .unwrap_or(0.0)
    };
    assert_eq!(
        (
            latency_count("acquire"),
            latency_count("heartbeat"),
            latency_count("release")
        ),
        (5.0, 2.0, 1.0)
    );
    assert_eq!(
        metric(
            &text,
            "seatgate_requests_total{op=\"acquire\",status=\"NO_SEATS_AVAILABLE\"}"
        )
        .unwrap_or(0.0),
        2.0
    );
    assert_eq!(worker.status("/live").await, Some(200));

    let status = worker.terminate(Duration::from_secs(10)).await;
    assert!(status.success(), "SIGTERM is a clean exit: {status:?}");
}

#[tokio::test]
async fn license_commands_provision_show_list_and_delete() {
    let redis = RedisServer::start_with(&[]).await;
    let o = seatgate(
        &redis,
        &[
            "license",
            "put",
            "a-1",
            "--seats",
            "4",
            "--expires",
            "2099-01-01T00:00:00Z",
            "--heartbeat-timeout",
            "90s",
        ],
    )
    .await;
    assert!(o.status.success(), "{o:?}");
    let o = seatgate(&redis, &["license", "put", "b-2", "--seats", "1", "--inactive"]).await;
    assert!(o.status.success(), "{o:?}");
    let o = seatgate(&redis, &["license", "show", "a-1", "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["seats_total"].as_u64(), v["active"].as_bool()),
        (Some(4), Some(true))
    );
    assert_eq!(v["heartbeat_timeout_ms"].as_u64(), Some(90_000));
    assert_eq!(v["expires_at_ms"].as_u64(), Some(4_070_908_800_000));
    let list = stdout(&seatgate(&redis, &["license", "list"]).await);
    assert!(
        list.contains("a-1  seats 0/4") && list.contains("b-2  seats 0/1  INACTIVE"),
        "{list}"
    );
    assert!(seatgate(&redis, &["license", "delete", "a-1", "--yes"])
        .await
        .status
        .success());
    assert_eq!(
        seatgate(&redis, &["license", "show", "a-1"]).await.status.code(),
        Some(1)
    );
    assert_eq!(
        seatgate(&redis, &["license", "put", "{bad}", "--seats", "1"])
            .await
            .status
            .code(),
        Some(2)
    );
}

#[tokio::test]
async fn errors_are_one_clear_line() {
    // Nothing listens there: the connection is refused.
    let url = format!("redis://127.0.0.1:{}", free_port());
    let mut cmd = Command::new(BIN);
    cmd.args(["--redis", &url, "acquire", "--license", "x", "--session", "y"]);
    let o = output(cmd).await;
    assert_eq!(o.status.code(), Some(3));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.starts_with("seatgate: error:"), "{err}");

    let mut cmd = Command::new(BIN);
    cmd.args([
        "--redis",
        "redis://127.0.0.1:1",
        "acquire",
        "--license",
        "x",
        "--session",
        "y",
        "--meta",
        "[1]",
    ]);
    let o = output(cmd).await;
    assert_eq!(o.status.code(), Some(2), "bad flags are a usage error");
    assert!(String::from_utf8_lossy(&o.stderr).contains("--meta"));
}

/// `seatgate check-config` loads and validates the settings as `run` would,
/// without Redis: one line and 0 when valid, one line naming the key and 3
/// when not; a missing password file is caught too.
#[tokio::test]
async fn check_config_validates_without_redis() {
    let dir = tempfile::tempdir().unwrap();
    let check = |args: Vec<String>, env: Option<(&'static str, String)>| {
        let mut cmd = Command::new(BIN);
        cmd.args(&args).arg("check-config");
        for var in ["SEATGATE__REDIS__PASSWORD_FILE", "SEATGATE__STREAM__SHARDS"] {
            cmd.env_remove(var);
        }
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        output(cmd)
    };

    let good = dir.path().join("good.toml");
    std::fs::write(&good, "[stream]\nshards = 4\n").unwrap();
    let o = check(vec!["--config".into(), good.display().to_string()], None).await;
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let out = stdout(&o);
    assert_eq!(out.trim().lines().count(), 1, "{out}");
    assert!(out.starts_with("seatgate: settings OK ("), "{out}");
    assert!(out.contains("4 shard(s)"), "the file was read: {out}");

    let o = check(vec![], None).await;
    assert_eq!(o.status.code(), Some(0), "the built-in defaults are valid: {o:?}");
    assert!(stdout(&o).contains("built-in defaults"), "{o:?}");

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[stream]\nbatch_size = 0\n").unwrap();
    let o = check(vec!["--config".into(), bad.display().to_string()], None).await;
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("stream.batch_size"), "{err}");
    assert!(o.stdout.is_empty(), "{o:?}");

    let missing = dir.path().join("nowhere.toml");
    let o = check(vec!["--config".into(), missing.display().to_string()], None).await;
    assert_eq!(o.status.code(), Some(3), "{o:?}");

    let o = check(
        vec![],
        Some((
            "SEATGATE__REDIS__PASSWORD_FILE",
            dir.path().join("no-secret").display().to_string(),
        )),
    )
    .await;
    assert_eq!(o.status.code(), Some(3), "an unreadable password file: {o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("redis.password_file"),
        "{o:?}"
    );
}

/// With sharded streams, the CLI sends each license's requests to its shard,
/// and `seatgate events` follows the events of every shard.
#[tokio::test]
async fn sharded_streams_and_following_every_events_shard() {
    use std::io::BufRead;
    let TestApp(redis, mut settings, _) = spawn_app().await;
    settings.stream.shards = 3;
    let shards = [("SEATGATE__STREAM__SHARDS", "3".to_string())];
    let _worker = WorkerProcess::start(&redis.url(), &shards).await;
    let mut follower = Spawned(
        seatgate_cmd(&redis.url(), &["events", "--from-start", "--json"])
            .env("SEATGATE__STREAM__SHARDS", "3")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let licenses = ["north", "south", "east", "west"];
    for l in licenses {
        let put = seatgate(&redis, &["license", "put", l, "--seats", "1"]).await;
        assert!(put.status.success());
        let mut acquire = seatgate_cmd(&redis.url(), &["acquire", "--license", l, "--session", "s1"]);
        acquire.env("SEATGATE__STREAM__SHARDS", "3");
        let o = output(acquire).await;
        assert_eq!(o.status.code(), Some(0), "{o:?}");
    }
    // Read the follower's lines off the runtime's threads until every
    // license's event came (or its output ends).
    let stdout = follower.0.stdout.take().unwrap();
    let reader = tokio::task::spawn_blocking(move || {
        let mut seen = std::collections::HashSet::new();
        for line in std::io::BufReader::new(stdout).lines() {
            let v: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
            assert_eq!(v["type"], "acquired");
            seen.insert(v["license"].as_str().unwrap().to_owned());
            if seen.len() == licenses.len() {
                break;
            }
        }
        seen
    });
    // A missing event fails the test instead of hanging it. The follower is
    // stopped through its handle either way (which also ends a reader still
    // waiting for a line); nothing outlives the test.
    let seen = tokio::time::timeout(Duration::from_secs(20), reader).await;
    drop(follower);
    let seen = seen
        .expect("the follower printed an event of every license within 20 s")
        .unwrap();
    assert_eq!(seen.len(), licenses.len(), "events of every shard were followed");
    // The licenses' events really are spread over the shards.
    let mut con = crate::support::db(&settings).await;
    let mut used = Vec::new();
    for stream in settings.events_streams() {
        let n: i64 = redis::cmd("XLEN")
            .arg(stream)
            .query_async(&mut con)
            .await
            .unwrap();
        used.push(n);
    }
    assert_eq!(used.len(), 3);
    assert_eq!(used.iter().sum::<i64>(), 4);
    assert!(used.iter().filter(|n| **n > 0).count() >= 2, "{used:?}");
}

#[tokio::test]
async fn json_logs_are_one_object_per_line() {
    use std::io::{BufRead, BufReader};

    let redis = RedisServer::start_with(&[]).await;
    let mut worker = Spawned(
        seatgate_cmd(&redis.url(), &["run"])
            .env("SEATGATE__LOG__FORMAT", "json")
            .env("SEATGATE__METRICS__LISTEN", "")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start seatgate run"),
    );
    let stderr = worker.0.stderr.take().expect("piped stderr");
    // Read until the worker says it started (or its stderr closes), off the
    // runtime's threads; then stop it.
    let reader = tokio::task::spawn_blocking(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stderr).lines() {
            let line = line.expect("read stderr");
            let started = line.contains("worker started");
            lines.push(line);
            if started {
                break;
            }
        }
        lines
    });
    // A worker that never says so fails the test instead of hanging it;
    // stopping it (through its handle) also ends a reader still waiting.
    let lines = tokio::time::timeout(Duration::from_secs(20), reader).await;
    drop(worker);
    let lines = lines.expect("the worker logged its start within 20 s").unwrap();
    assert!(
        lines.iter().any(|l| l.contains("worker started")),
        "no start line in {lines:?}"
    );
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert_eq!(v["level"], "INFO", "{line}");
        assert!(v["message"].is_string(), "{line}");
    }

    // An unknown format is refused at startup, naming the key.
    let mut cmd = Command::new(BIN);
    cmd.args(["license", "list"]).env("SEATGATE__LOG__FORMAT", "xml");
    let o = output(cmd).await;
    assert_eq!(o.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&o.stderr).contains("format"));
}

/// `seatgate status` prints what callers stored: control characters in it
/// are shown escaped, so a session's metadata cannot drive the operator's
/// terminal; `--json` keeps the exact value.
#[tokio::test]
async fn status_escapes_control_characters_and_json_keeps_them() {
    let redis = RedisServer::start_with(&[]).await;
    assert!(seatgate(&redis, &["license", "put", "cad", "--seats", "2"])
        .await
        .status
        .success());
    let _worker = WorkerProcess::start(&redis.url(), &[]).await;
    let hostile = "\u{1b}[2J\u{1b}[Hadmin@corp\rOK";
    let meta = serde_json::json!({ "user_email": hostile, "hardware_id": "hw\u{7}" }).to_string();
    let o = seatgate(
        &redis,
        &["acquire", "--license", "cad", "--session", "s1", "--meta", &meta],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{o:?}");

    let text = stdout(&seatgate(&redis, &["status"]).await);
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "raw control characters reach the terminal: {text:?}"
    );
    assert!(text.contains(r"\u{1b}[2J\u{1b}[Hadmin@corp\rOK"), "{text}");
    assert!(text.contains(r"hw\u{7}"), "{text}");

    let json: serde_json::Value =
        serde_json::from_slice(&seatgate(&redis, &["status", "--json"]).await.stdout).unwrap();
    assert_eq!(json["licenses"][0]["holders"][0]["user_email"], hostile);
}

/// The user `seatgate status` shows is the acquire's `user`, in text and
/// JSON, for holders and waiters alike; `meta.user_email` is display
/// metadata, shown as EMAIL (`user_email`) beside it and never as the user.
#[tokio::test]
async fn status_shows_the_requests_user_and_the_email_apart() {
    let redis = RedisServer::start_with(&[]).await;
    assert!(seatgate(&redis, &["license", "put", "cad", "--seats", "3"])
        .await
        .status
        .success());
    let _worker = WorkerProcess::start(&redis.url(), &[]).await;
    let email = |e: &str| serde_json::json!({ "user_email": e }).to_string();
    let (ada, bob) = (email("ada@example.com"), email("bob@example.com"));
    let holders: [&[&str]; 3] = [
        // A user, and an email that differs from it.
        &["--session", "s-both", "--user", "ada", "--meta", &ada],
        // Only an email: no user.
        &["--session", "s-email", "--meta", &bob],
        // Neither.
        &["--session", "s-none"],
    ];
    for extra in holders {
        let mut args = vec!["acquire", "--license", "cad"];
        args.extend_from_slice(extra);
        let o = seatgate(&redis, &args).await;
        assert_eq!(o.status.code(), Some(0), "{args:?}: {o:?}");
    }
    // Carol waits for a seat (the command waits for the grant: left running).
    let mut cmd = seatgate_cmd(
        &redis.url(),
        &[
            "acquire",
            "--license",
            "cad",
            "--session",
            "s-waits",
            "--user",
            "carol",
            "--wait",
            "1m",
        ],
    );
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let _carol = Spawned(cmd.spawn().unwrap());
    let status_json = || async {
        let o = seatgate(&redis, &["status", "--json"]).await;
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let json = loop {
        let json = status_json().await;
        if json["licenses"][0]["queue"]
            .as_array()
            .is_some_and(|q| !q.is_empty())
        {
            break json;
        }
        assert!(std::time::Instant::now() < deadline, "carol never queued: {json}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    let l = &json["licenses"][0];
    let holder = |session: &str| {
        let h = l["holders"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["session"] == session)
            .unwrap_or_else(|| panic!("no holder {session}: {json}"));
        (h["user"].clone(), h["user_email"].clone())
    };
    let null = serde_json::Value::Null;
    assert_eq!(holder("s-both"), ("ada".into(), "ada@example.com".into()));
    assert_eq!(holder("s-email"), (null.clone(), "bob@example.com".into()));
    assert_eq!(holder("s-none"), (null.clone(), null.clone()));
    let w = &l["queue"][0];
    assert_eq!(
        (w["session"].clone(), w["user"].clone(), w["user_email"].clone()),
        ("s-waits".into(), "carol".into(), null)
    );

    let text = stdout(&seatgate(&redis, &["status"]).await);
    let words = |prefix: &str| -> Vec<String> {
        text.lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .unwrap_or_else(|| panic!("no line {prefix:?} in\n{text}"))
            .split_whitespace()
            .take(4)
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        words("SESSION "),
        ["SESSION", "USER", "EMAIL", "HARDWARE"],
        "{text}"
    );
    assert_eq!(
        words("s-both ")[..3],
        ["s-both", "ada", "ada@example.com"],
        "{text}"
    );
    assert_eq!(
        words("s-email ")[..3],
        ["s-email", "-", "bob@example.com"],
        "{text}"
    );
    assert_eq!(words("s-none ")[..3], ["s-none", "-", "-"], "{text}");
    assert_eq!(words("POS "), ["POS", "WAITING", "SESSION", "USER"], "{text}");
    assert_eq!(words("1 ")[..4], ["1", "s-waits", "carol", "-"], "{text}");
}

/// What a billing system (or anyone with write access) stored in a license
/// record reaches the operator's terminal escaped: a group name holding an
/// escape sequence, a zero-width space or a line separator is shown as
/// `\u{…}` by `license show`, `license list` and `license groups show`.
#[tokio::test]
async fn license_show_list_and_groups_escape_what_was_stored() {
    let redis = RedisServer::start_with(&[]).await;
    let put = seatgate(&redis, &["license", "put", "cad", "--seats", "2"]).await;
    assert!(put.status.success(), "{put:?}");
    let mut raw = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: i64 = redis::cmd("HSET")
        .arg("seat:{cad}:license")
        .arg("group_max:ev\u{1b}[2Jil\u{200b}")
        .arg("1")
        .query_async(&mut raw)
        .await
        .unwrap();
    let _: i64 = redis::cmd("HSET")
        .arg("seat:{cad}:groups")
        .arg("ada\u{2028}")
        .arg("eng\u{1b}]0;pwned\u{7}")
        .query_async(&mut raw)
        .await
        .unwrap();
    for args in [
        &["license", "show", "cad"][..],
        &["license", "list"],
        &["license", "groups", "cad", "show"],
    ] {
        let o = seatgate(&redis, args).await;
        let out = stdout(&o);
        assert!(
            !out.contains(['\u{1b}', '\u{200b}', '\u{2028}', '\u{7}']),
            "{args:?} printed a raw control or format character: {out:?}"
        );
        assert!(out.contains("\\u{1b}"), "{args:?}: {out:?}");
    }
}

/// `seatgate status --license L` for a license that does not exist is a
/// refusal, like `license show`: one line naming it, exit 1, nothing on
/// stdout (`--json` too, so a script never reads an empty license as one
/// with no seats); a license that exists is shown and exits 0.
#[tokio::test]
async fn status_of_a_missing_license_is_one_line_and_exit_1() {
    let redis = RedisServer::start_with(&[]).await;
    assert!(seatgate(&redis, &["license", "put", "cad", "--seats", "2"])
        .await
        .status
        .success());
    let o = seatgate(&redis, &["status", "--license", "cad"]).await;
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(
        stdout(&o).starts_with("cad: 0 of 2 seats in use"),
        "{}",
        stdout(&o)
    );
    let o = seatgate(&redis, &["status", "--license", "cad", "--json"]).await;
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(json["licenses"][0]["seats_total"], 2);

    assert!(seatgate(&redis, &["license", "delete", "cad", "--yes"])
        .await
        .status
        .success());
    for license in ["nosuch", "cad"] {
        for json in [false, true] {
            let mut args = vec!["status", "--license", license];
            if json {
                args.push("--json");
            }
            let o = seatgate(&redis, &args).await;
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{args:?}: {o:?}");
            assert_eq!(
                err.trim(),
                format!("seatgate: license {license} does not exist"),
                "{args:?}"
            );
            assert_eq!(stdout(&o), "", "{args:?}");
        }
    }
}

/// `license put` changes only the fields it is given: the runbooks'
/// `license put L --seats N` keeps the policies, expiry and heartbeat
/// timeout; `--unset FIELD` removes one field; `--replace` writes the whole
/// record as given (the fields not given are removed).
#[tokio::test]
async fn license_put_changes_only_what_it_is_told() {
    let TestApp(redis, s, mut con) = spawn_app().await;
    let url = redis.url();
    let put = |args: &[&str]| {
        let mut all = vec!["license", "put", "ptest"];
        all.extend_from_slice(args);
        output(seatgate_cmd(&url, &all))
    };
    let show = || async {
        let o = seatgate(&redis, &["license", "show", "ptest", "--json"]).await;
        assert!(o.status.success(), "{o:?}");
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let record = |con: &mut seatgate_core::db::Db| {
        let mut con = con.clone();
        let s = s.clone();
        async move {
            let r = crate::support::license_record(&mut con, &s, "ptest").await;
            r.into_iter().collect::<std::collections::BTreeMap<_, _>>()
        }
    };
    let o = put(&[
        "--seats",
        "2",
        "--max-per-user",
        "1",
        "--group-reserve",
        "sim=1",
        "--linger",
        "10m",
        "--expires",
        "2099-01-01T00:00:00Z",
        "--heartbeat-timeout",
        "45s",
    ])
    .await;
    assert!(o.status.success(), "{o:?}");
    let before = show().await;
    let o = put(&["--seats", "4"]).await;
    assert!(o.status.success(), "{o:?}");
    let after = show().await;
    assert_eq!(after["seats_total"], 4, "{after}");
    for field in ["expires_at_ms", "heartbeat_timeout_ms", "policy", "active"] {
        assert_eq!(after[field], before[field], "{field} kept: {after}");
    }
    assert_eq!(after["expires_at_ms"], 4_070_908_800_000u64);
    assert_eq!(after["heartbeat_timeout_ms"], 45_000);
    assert_eq!(
        after["policy"],
        serde_json::json!({"max_per_user": 1, "group_reserve": {"sim": 1}, "linger_ms": 600_000})
    );

    // One more group, one field changed, nothing else touched.
    assert!(put(&["--group-max", "cad=3", "--inactive"])
        .await
        .status
        .success());
    let r = record(&mut con).await;
    assert_eq!(
        (
            r.get("group_max:cad").map(String::as_str),
            r.get("group_reserve:sim").map(String::as_str),
            r.get("active").map(String::as_str),
            r.get("seats_total").map(String::as_str)
        ),
        (Some("3"), Some("1"), Some("0"), Some("4"))
    );
    assert!(put(&["--active"]).await.status.success());

    // --unset removes single fields, and only those.
    let o = put(&["--unset", "linger_ms", "--unset", "group_max:cad"]).await;
    assert!(o.status.success(), "{o:?}");
    let r = record(&mut con).await;
    assert!(
        !r.contains_key("linger_ms") && !r.contains_key("group_max:cad"),
        "{r:?}"
    );
    assert_eq!(r.get("max_per_user").map(String::as_str), Some("1"));
    assert_eq!(r.get("heartbeat_timeout_ms").map(String::as_str), Some("45000"));
    assert_eq!(r.get("active").map(String::as_str), Some("1"));
    // seats_total cannot be unset, an unknown field is refused, and a
    // change that breaks a rule of the merged record writes nothing.
    for bad in [
        &["--unset", "seats_total"][..],
        &["--unset", "colour"],
        &["--seats", "0"],
    ] {
        let o = put(bad).await;
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {o:?}");
    }
    assert_eq!(record(&mut con).await, r, "refused changes wrote nothing");
    // A new license needs --seats.
    let o = seatgate(&redis, &["license", "put", "fresh", "--max-per-user", "1"]).await;
    assert_eq!(o.status.code(), Some(2), "{o:?}");

    // --replace: the old behaviour, the record exactly as given.
    let o = put(&["--replace", "--seats", "3"]).await;
    assert!(o.status.success(), "{o:?}");
    let r = record(&mut con).await;
    let fields: Vec<&str> = r.keys().map(String::as_str).collect();
    assert_eq!(fields, ["active", "expires_at_ms", "seats_total"]);
    assert_eq!(r["seats_total"], "3");
    assert_eq!(r["expires_at_ms"], "0");
}

/// Identity the server decides, as an operator sets it up: `license put
/// --require-user`, `license groups` (set, show, unset), and `revoke
/// --user-wide`, through a worker process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_map_require_user_and_a_user_wide_revoke_from_the_command_line() {
    let TestApp(redis, _s, _) = spawn_app().await;
    let url = redis.url();
    let run = |args: &[&str]| output(seatgate_cmd(&url, args));
    let line = |o: &Output| stdout(o);
    let o = run(&[
        "license",
        "put",
        "cad",
        "--seats",
        "3",
        "--group-reserve",
        "sim=2",
        "--require-user",
    ])
    .await;
    assert!(o.status.success(), "{o:?}");
    let o = run(&["license", "show", "cad"]).await;
    assert!(line(&o).contains("require_user"), "{o:?}");
    for (user, group) in [("sam", "sim"), ("eve", "eng")] {
        let o = run(&["license", "groups", "cad", "set", user, group]).await;
        assert!(o.status.success(), "{o:?}");
    }
    let o = run(&["license", "groups", "cad", "set", "eve", "a|b"]).await;
    assert_eq!(o.status.code(), Some(2), "a group that is no id: {o:?}");
    let o = run(&["license", "groups", "cad", "show"]).await;
    assert_eq!(line(&o), "eve eng\nsam sim\n");
    let o = run(&["license", "groups", "cad", "show", "--json"]).await;
    assert_eq!(line(&o), "{\"eve\":\"eng\",\"sam\":\"sim\"}\n");

    let worker = WorkerProcess::start(&url, &[]).await;
    let acquire = |session: &str, user: &str, group: &str| {
        let mut args = vec!["acquire", "--license", "cad", "--session", session];
        for (flag, value) in [("--user", user), ("--group", group)] {
            if !value.is_empty() {
                args.extend([flag, value]);
            }
        }
        let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        let url = url.clone();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            output(seatgate_cmd(&url, &args)).await
        }
    };
    let o = acquire("e1", "eve", "").await;
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    for (session, user, group, says) in [
        ("e2", "eve", "sim", "group map"),
        ("anon", "", "", "require_user"),
    ] {
        let o = acquire(session, user, group).await;
        assert_eq!(o.status.code(), Some(1), "{o:?}");
        assert!(
            line(&o).starts_with("LIMIT_REACHED") && line(&o).contains(says),
            "{o:?}"
        );
    }

    let revoke = [
        "revoke",
        "--license",
        "cad",
        "--session",
        "e1",
        "--reason",
        "shared login",
    ];
    let o = run(&[&revoke[..], &["--user-wide"]].concat()).await;
    assert_eq!(o.status.code(), Some(2), "--user-wide needs --cooldown: {o:?}");
    let o = run(&[&revoke[..], &["--cooldown", "1m", "--user-wide"]].concat()).await;
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let o = acquire("e3", "eve", "").await;
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(line(&o).starts_with("SESSION_REVOKED"), "{o:?}");

    let o = run(&["license", "groups", "cad", "unset", "eve"]).await;
    assert!(o.status.success(), "{o:?}");
    let o = run(&["license", "groups", "cad", "unset", "eve"]).await;
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let o = run(&["license", "delete", "cad", "--yes"]).await;
    assert!(o.status.success(), "{o:?}");
    let o = run(&["license", "groups", "cad", "show"]).await;
    assert!(
        line(&o).contains("has no group map"),
        "the map went with the license: {o:?}"
    );
    drop(worker);
}

/// Issue 38, problem 8: `license put --expires` in the past needs `--force`
/// (refused, nothing written, without it); an expiry given as a number
/// before 2001 is taken for seconds and refused with the milliseconds to
/// give; `license list` and `show` tag an expired license EXPIRED; the help
/// names the `--unset require_user` that exists.
#[tokio::test]
async fn license_put_refuses_a_past_or_seconds_expiry_and_list_tags_expired() {
    let TestApp(redis, _s, _con) = spawn_app().await;
    let past = seatgate(
        &redis,
        &[
            "license",
            "put",
            "old",
            "--seats",
            "1",
            "--expires",
            "2020-01-01T00:00:00Z",
        ],
    )
    .await;
    assert_eq!(past.status.code(), Some(2), "{past:?}");
    let err = String::from_utf8_lossy(&past.stderr);
    assert!(err.contains("already past") && err.contains("--force"), "{err}");
    let show = seatgate(&redis, &["license", "show", "old"]).await;
    assert_eq!(show.status.code(), Some(1), "nothing was written: {show:?}");

    let secs = seatgate(
        &redis,
        &["license", "put", "old", "--seats", "1", "--expires", "1893456000"],
    )
    .await;
    assert_eq!(secs.status.code(), Some(2), "{secs:?}");
    let err = String::from_utf8_lossy(&secs.stderr);
    assert!(
        err.contains("before 2001") && err.contains("1893456000000"),
        "{err}"
    );

    let forced = seatgate(
        &redis,
        &[
            "license",
            "put",
            "old",
            "--seats",
            "1",
            "--expires",
            "2020-01-01T00:00:00Z",
            "--force",
        ],
    )
    .await;
    assert!(forced.status.success(), "{forced:?}");
    let fresh = seatgate(
        &redis,
        &[
            "license",
            "put",
            "new",
            "--seats",
            "1",
            "--expires",
            "2099-01-01T00:00:00Z",
        ],
    )
    .await;
    assert!(fresh.status.success(), "{fresh:?}");
    let list = String::from_utf8(seatgate(&redis, &["license", "list"]).await.stdout).unwrap();
    let line = |id: &str| {
        list.lines()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("{id} in {list}"))
            .to_owned()
    };
    assert!(line("old").contains("EXPIRED 2020-01-01T00:00:00Z"), "{list}");
    assert!(
        line("new").contains("expires 2099-01-01T00:00:00Z") && !line("new").contains("EXPIRED"),
        "{list}"
    );
    let shown = String::from_utf8(seatgate(&redis, &["license", "show", "old"]).await.stdout).unwrap();
    assert!(shown.contains("EXPIRED"), "{shown}");

    let help = String::from_utf8(seatgate(&redis, &["license", "put", "--help"]).await.stdout).unwrap();
    assert!(
        help.contains("--unset require_user") && !help.contains("license unset"),
        "{help}"
    );
    // No help text of `license` names a `license unset` (there is none:
    // `license put L --unset FIELD` removes a field, with its event).
    for args in [
        &["license", "--help"][..],
        &["license", "delete", "--help"],
        &["license", "groups", "--help"],
    ] {
        let help = String::from_utf8(seatgate(&redis, args).await.stdout).unwrap();
        assert!(
            !help.is_empty() && !help.contains("license unset"),
            "{args:?}: {help}"
        );
    }
}

/// The next line a follower printed, within 15 s.
async fn next_line(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> Option<String> {
    tokio::time::timeout(Duration::from_secs(15), rx.recv())
        .await
        .ok()
        .flatten()
}

/// Issue 38, problem 7: `seatgate events` survives a Redis restart: it says
/// so once on stderr, connects again and resumes after the last event it
/// printed, so the events made after the restart (and any made while it
/// was reconnecting) are printed too.
#[tokio::test]
async fn events_follows_across_a_redis_restart() {
    use std::io::BufRead;
    let TestApp(mut redis, settings, _) =
        spawn_app_with(&["--appendonly", "yes", "--appendfsync", "always"]).await;
    let put = seatgate(&redis, &["license", "put", "ev", "--seats", "5"]).await;
    assert!(put.status.success(), "{put:?}");
    let worker = spawn_worker(settings.clone(), "w1").await;
    let mut follower = Spawned(
        seatgate_cmd(&redis.url(), &["events", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = follower.0.stdout.take().unwrap();
    let mut stderr = follower.0.stderr.take().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            if tx
                .send(v["session"].as_str().unwrap_or_default().to_owned())
                .is_err()
            {
                return;
            }
        }
    });
    // The follower reads from its start: give it a moment to be reading.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let url = redis.url();
    let acquire = |session: &'static str| {
        output(seatgate_cmd(
            &url,
            &["acquire", "--license", "ev", "--session", session],
        ))
    };
    assert!(acquire("before").await.status.success());
    assert_eq!(next_line(&mut rx).await.as_deref(), Some("before"));

    redis.shutdown().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    redis.restart().await.expect("restart redis");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let o = acquire("after").await;
        if o.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no worker answered after the restart: {o:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        next_line(&mut rx).await.as_deref(),
        Some("after"),
        "the event after the restart was printed"
    );
    drop(follower);
    let mut said = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut said).unwrap();
    assert!(said.contains("reconnecting, and resuming after"), "{said}");
    worker.stop().await;
}

/// Issue 38, problem 8: `seatgate status` for a fleet of licenses ends with
/// a totals line, sorts (`--sort name|used|free|queued|expiry`), filters by
/// id (`--filter`, a glob or a substring) and shows only the full ones
/// (`--full-only`: no seat free, or someone waiting); `--json` carries the
/// totals too.
#[tokio::test]
async fn status_totals_sorts_and_filters_licenses() {
    let redis = RedisServer::start_with(&[]).await;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let (soon, later) = (
        (now_ms + 86_400_000).to_string(),
        (now_ms + 30 * 86_400_000).to_string(),
    );
    let puts: [&[&str]; 4] = [
        &["cad-a", "--seats", "1"],
        &["cad-b", "--seats", "4", "--expires", &later],
        &["eda", "--seats", "5", "--expires", &soon],
        &["sim", "--seats", "2"],
    ];
    for put in puts {
        let o = seatgate(&redis, &[&["license", "put"][..], put].concat()).await;
        assert!(o.status.success(), "{put:?}: {o:?}");
    }
    let _worker = WorkerProcess::start(&redis.url(), &[]).await;
    for (license, sessions) in [("cad-a", 1), ("cad-b", 1), ("eda", 3)] {
        for i in 0..sessions {
            let session = format!("{license}-s{i}");
            let o = seatgate(&redis, &["acquire", "--license", license, "--session", &session]).await;
            assert_eq!(o.status.code(), Some(0), "{license} {session}: {o:?}");
        }
    }
    let shown = |args: &[&str]| {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let redis = &redis;
        async move {
            let mut all = vec!["status"];
            all.extend(args.iter().map(String::as_str));
            let o = seatgate(redis, &all).await;
            assert_eq!(o.status.code(), Some(0), "{args:?}: {o:?}");
            let text = stdout(&o);
            let ids: Vec<String> = text
                .lines()
                .filter(|l| !l.starts_with(' ') && !l.starts_with("total:"))
                .filter_map(|l| l.split(':').next().map(str::to_owned))
                .collect();
            let total = text.lines().last().unwrap_or_default().to_owned();
            (ids, total)
        }
    };
    let (ids, total) = shown(&[]).await;
    assert_eq!(ids, ["cad-a", "cad-b", "eda", "sim"]);
    assert_eq!(
        total,
        "total: 4 licenses, 5 of 12 seats in use, 7 free, 0 waiting; 1 full, 0 expired, 0 inactive, 0 invalid"
    );
    for (order, expected) in [
        ("used", ["eda", "cad-a", "cad-b", "sim"]),
        ("free", ["cad-a", "eda", "sim", "cad-b"]),
        ("expiry", ["eda", "cad-b", "cad-a", "sim"]),
        ("queued", ["cad-a", "cad-b", "eda", "sim"]),
    ] {
        assert_eq!(shown(&["--sort", order]).await.0, expected, "--sort {order}");
    }
    let (ids, total) = shown(&["--filter", "cad"]).await;
    assert_eq!(ids, ["cad-a", "cad-b"]);
    assert!(
        total.starts_with("total: 2 licenses (of 4), 2 of 5 seats in use, 3 free"),
        "{total}"
    );
    assert_eq!(
        shown(&["--filter", "*a", "--sort", "used"]).await.0,
        ["eda", "cad-a"]
    );
    let (ids, total) = shown(&["--full-only"]).await;
    assert_eq!(ids, ["cad-a"]);
    assert!(total.contains("1 full"), "{total}");
    let (ids, total) = shown(&["--filter", "nothing-like-it"]).await;
    assert!(ids.iter().all(|l| l == "no licenses"), "{ids:?}");
    assert!(total.starts_with("total: 0 licenses (of 4)"), "{total}");

    let o = seatgate(
        &redis,
        &["status", "--json", "--sort", "used", "--filter", "cad-*"],
    )
    .await;
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("status --json");
    let ids: Vec<&str> = json["licenses"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["license"].as_str())
        .collect();
    assert_eq!(ids, ["cad-a", "cad-b"], "{json}");
    let t = &json["totals"];
    assert_eq!(
        (
            &t["licenses"],
            &t["licenses_read"],
            &t["seats_used"],
            &t["seats_total"],
            &t["full"]
        ),
        (&2.into(), &4.into(), &2.into(), &5.into(), &1.into()),
        "{json}"
    );
    let help = stdout(&seatgate(&redis, &["status", "--help"]).await);
    for flag in ["--sort", "--filter", "--full-only", "expiry"] {
        assert!(help.contains(flag), "{flag} in the help: {help}");
    }
}
