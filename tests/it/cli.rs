//! The real `seatgate` binary: the worker as a process, the CLI client and
//! provisioning commands, exit codes, and `/metrics` counting what it served.

use std::process::{Command, Output};

use crate::support::{http_get, RedisServer, RedisServerExt, WorkerProcess, BIN};

fn seatgate(redis: &RedisServer, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("--redis")
        .arg(redis.url())
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run seatgate")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The value of one exact series line in a Prometheus exposition.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or(0.0)
}

#[test]
fn cli_client_against_a_running_worker_and_metrics_count_what_was_served() {
    let redis = RedisServer::start_with(&[]);
    let put = seatgate(&redis, &["license", "put", "cad", "--seats", "3"]);
    assert!(put.status.success(), "{put:?}");
    let mut worker = WorkerProcess::start(&redis.url(), &[]);

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
        );
        if i < 3 {
            assert_eq!(o.status.code(), Some(0), "{o:?}");
            assert!(stdout(&o).starts_with("ACQUIRED"), "{}", stdout(&o));
        } else {
            assert_eq!(o.status.code(), Some(1), "refused acquire exits 1: {o:?}");
            assert!(stdout(&o).starts_with("NO_SEATS_AVAILABLE"), "{}", stdout(&o));
        }
    }
    for _ in 0..2 {
        let o = seatgate(
            &redis,
            &["heartbeat", "--license", "cad", "--session", "s0", "--json"],
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("--json prints JSON");
        assert_eq!(v["status"], "HEARTBEAT_UPDATED");
    }
    let o = seatgate(&redis, &["release", "--license", "cad", "--session", "s1"]);
    assert_eq!(o.status.code(), Some(0));

    let (code, text) = http_get(&worker.metrics, "/metrics").expect("metrics endpoint");
    assert_eq!(code, 200);
    let exec = |script: &str, result: &str| {
        metric(
            &text,
            &format!("license_lua_script_executions_total{{script_name=\"{script}\",result=\"{result}\"}}"),
        )
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
        ),
        2.0
    );
    assert_eq!(http_get(&worker.metrics, "/live").map(|(c, _)| c), Some(200));

    let status = worker.terminate(std::time::Duration::from_secs(10));
    assert!(status.success(), "SIGTERM is a clean exit: {status:?}");
}

#[test]
fn license_commands_provision_show_list_and_delete() {
    let redis = RedisServer::start_with(&[]);
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
    );
    assert!(o.status.success(), "{o:?}");
    seatgate(&redis, &["license", "put", "b-2", "--seats", "1", "--inactive"]);
    let o = seatgate(&redis, &["license", "show", "a-1", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["seats_total"].as_u64(), v["active"].as_bool()),
        (Some(4), Some(true))
    );
    assert_eq!(v["heartbeat_timeout_ms"].as_u64(), Some(90_000));
    assert_eq!(v["expires_at_ms"].as_u64(), Some(4_070_908_800_000));
    let list = stdout(&seatgate(&redis, &["license", "list"]));
    assert!(
        list.contains("a-1  seats 0/4") && list.contains("b-2  seats 0/1  INACTIVE"),
        "{list}"
    );
    assert!(seatgate(&redis, &["license", "delete", "a-1"]).status.success());
    assert_eq!(
        seatgate(&redis, &["license", "show", "a-1"]).status.code(),
        Some(1)
    );
    assert_eq!(
        seatgate(&redis, &["license", "put", "{bad}", "--seats", "1"])
            .status
            .code(),
        Some(2)
    );
}

#[test]
fn errors_are_one_clear_line() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let o = Command::new(BIN)
        .args([
            "--redis",
            &format!("redis://127.0.0.1:{port}"),
            "acquire",
            "--license",
            "x",
            "--session",
            "y",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.starts_with("seatgate: error:"), "{err}");

    let o = Command::new(BIN)
        .args([
            "--redis",
            "redis://127.0.0.1:1",
            "acquire",
            "--license",
            "x",
            "--session",
            "y",
            "--meta",
            "[1]",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "bad flags are a usage error");
    assert!(String::from_utf8_lossy(&o.stderr).contains("--meta"));
}

/// With sharded streams, the CLI sends each license's requests to its shard,
/// and `seatgate events` follows the events of every shard.
#[test]
fn sharded_streams_and_following_every_events_shard() {
    use std::io::BufRead;
    let redis = RedisServer::start_with(&[]);
    let shards = [("SEATGATE__STREAM__SHARDS", "3".to_string())];
    let _worker = WorkerProcess::start(&redis.url(), &shards);
    let mut follower = Command::new(BIN)
        .args(["--redis", &redis.url(), "events", "--from-start", "--json"])
        .env("SEATGATE__STREAM__SHARDS", "3")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let licenses = ["north", "south", "east", "west"];
    for l in licenses {
        let put = seatgate(&redis, &["license", "put", l, "--seats", "1"]);
        assert!(put.status.success());
        let o = Command::new(BIN)
            .args([
                "--redis",
                &redis.url(),
                "acquire",
                "--license",
                l,
                "--session",
                "s1",
            ])
            .env("SEATGATE__STREAM__SHARDS", "3")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{o:?}");
    }
    // A watchdog, so that a missing event fails the test instead of hanging it.
    let pid = follower.id().to_string();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(20));
        let _ = Command::new("kill").arg(&pid).status();
    });
    let stdout = follower.stdout.take().unwrap();
    let mut seen = std::collections::HashSet::new();
    for line in std::io::BufReader::new(stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        assert_eq!(v["type"], "acquired");
        seen.insert(v["license"].as_str().unwrap().to_owned());
        if seen.len() == licenses.len() {
            break;
        }
    }
    assert_eq!(seen.len(), licenses.len(), "events of every shard were followed");
    let _ = follower.kill();
    let _ = follower.wait();
    // The licenses' events really are spread over the shards.
    let mut con = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let used: Vec<i64> = (0..3)
        .map(|i| {
            redis::cmd("XLEN")
                .arg(format!("seat:events:{{{i}}}"))
                .query(&mut con)
                .unwrap()
        })
        .collect();
    assert_eq!(used.iter().sum::<i64>(), 4);
    assert!(used.iter().filter(|n| **n > 0).count() >= 2, "{used:?}");
}

#[test]
fn json_logs_are_one_object_per_line() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let redis = RedisServer::start_with(&[]);
    let mut worker = Command::new(BIN)
        .arg("--redis")
        .arg(redis.url())
        .arg("run")
        .env("SEATGATE__LOG__FORMAT", "json")
        .env("SEATGATE__METRICS__LISTEN", "")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start seatgate run");
    let stderr = worker.stderr.take().expect("piped stderr");
    // Read until the worker says it started (or its stderr closes), then stop it.
    let mut lines = Vec::new();
    for line in BufReader::new(stderr).lines() {
        let line = line.expect("read stderr");
        let started = line.contains("worker started");
        lines.push(line);
        if started {
            break;
        }
    }
    let _ = worker.kill();
    let _ = worker.wait();
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
    let o = Command::new(BIN)
        .args(["license", "list"])
        .env("SEATGATE__LOG__FORMAT", "xml")
        .output()
        .expect("run seatgate");
    assert_eq!(o.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&o.stderr).contains("format"));
}

/// `seatgate status` prints what callers stored: control characters in it
/// are shown escaped, so a session's metadata cannot drive the operator's
/// terminal; `--json` keeps the exact value.
#[test]
fn status_escapes_control_characters_and_json_keeps_them() {
    let redis = RedisServer::start_with(&[]);
    assert!(seatgate(&redis, &["license", "put", "cad", "--seats", "2"])
        .status
        .success());
    let _worker = WorkerProcess::start(&redis.url(), &[]);
    let hostile = "\u{1b}[2J\u{1b}[Hadmin@corp\rOK";
    let meta = serde_json::json!({ "user_email": hostile, "hardware_id": "hw\u{7}" }).to_string();
    let o = seatgate(
        &redis,
        &["acquire", "--license", "cad", "--session", "s1", "--meta", &meta],
    );
    assert_eq!(o.status.code(), Some(0), "{o:?}");

    let text = stdout(&seatgate(&redis, &["status"]));
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "raw control characters reach the terminal: {text:?}"
    );
    assert!(text.contains(r"\u{1b}[2J\u{1b}[Hadmin@corp\rOK"), "{text}");
    assert!(text.contains(r"hw\u{7}"), "{text}");

    let json: serde_json::Value =
        serde_json::from_slice(&seatgate(&redis, &["status", "--json"]).stdout).unwrap();
    assert_eq!(json["licenses"][0]["holders"][0]["user"], hostile);
}
