//! A real Prometheus scraping two real `seatgate run` workers under a short
//! mixed load: every PromQL expression of the Grafana dashboard
//! (ops/grafana/seatgate.json) and of the alert rules
//! (ops/prometheus/alerts.yml) must be valid and return data, and the
//! panels for what the load does on purpose (revocations, lingering and
//! borrowed seats, expiry, future entry ids, refused `reply_to`) above 0.
//! And a real Alertmanager running the example configuration
//! (ops/prometheus/alertmanager.yml): one cause pages once.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use seatgate::config::Settings;
use seatgate_client::{Call, Revoke};
use seatgate_core::license::LicenseSpec;
use seatgate_core::policy::{LicensePolicy, RequestPolicy};
use seatgate_core::status::Status;
use serde_json::Value;

use crate::support::{
    acquire, add_request, client, db, free_port, holders, http_get, license_keys, provision, put_policy,
    redis_ms, seats, seats_with_timeout, RedisServer, RedisServerExt, WorkerProcess, T,
};
/// What `$__rate_interval` stands for: the whole test fits in it.
const RATE_INTERVAL: &str = "1m";
/// The license with seats, denials and a queue.
const LICENSE: &str = "full";
/// The licenses the dashboard's `$license` is set to, as Grafana writes a
/// multi-value pick for a `=~` matcher: `full`, and `spare`, which expires
/// and has lingering and borrowed seats.
const PICKED: &str = "(full|spare)";
/// The panels whose every target must be above 0 after the load, not only
/// return data: what the load does on purpose for them (a revocation, a
/// lingering and a borrowed seat and a borrow that ended, an expiry ahead, an
/// entry id ahead of the clock, a refused `reply_to`).
const ABOVE_ZERO: [&str; 5] = [
    "Revocations",
    "Lingering and borrowed seats",
    "License expiry",
    "Entry ids ahead of the clock",
    "Refused reply_to",
];

/// A `prometheus` on a free loopback port with its own storage, scraping
/// `targets` every second as job "seatgate" and loading the alert rules;
/// killed on drop (its log is printed when the test failed).
struct Prometheus {
    /// The server process; killed and reaped on drop.
    child: Child,
    /// host:port of its HTTP API.
    addr: String,
    /// Its configuration, storage and log.
    dir: tempfile::TempDir,
}

impl Prometheus {
    async fn start(targets: &[&str]) -> Prometheus {
        Prometheus::start_every(targets, "1s").await
    }

    /// Scraping `targets`, and evaluating the rules as shipped (their `for:`
    /// untouched), every `interval` (`15s`, `1m`).
    async fn start_every(targets: &[&str], interval: &str) -> Prometheus {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\nrule_files:\n  - '{}'\nscrape_configs:\n  - job_name: seatgate\n    static_configs:\n      - targets: [{}]\n",
            repo_file("ops/prometheus/alerts.yml").display(),
            targets.join(", ")
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write prometheus.yml");
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus (bash ops/ensure-prometheus.sh installs it)");
        let prometheus = Prometheus {
            child,
            addr: format!("127.0.0.1:{port}"),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        while http_get(&prometheus.addr, "/-/ready").await.map(|(code, _)| code) != Some(200) {
            assert!(Instant::now() < deadline, "prometheus did not become ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        prometheus
    }

    /// GET `path` of the HTTP API; the JSON body, or why not.
    async fn api(&self, path: &str) -> Result<Value, String> {
        let (code, response) = http_get(&self.addr, path).await.ok_or("no answer")?;
        let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        let json: Value = serde_json::from_str(body).map_err(|e| format!("HTTP {code}: {e}: {body}"))?;
        if json["status"] != "success" {
            return Err(format!("HTTP {code}: {body}"));
        }
        Ok(json["data"].clone())
    }

    /// An instant query: each result's labels as `name=value` joined by
    /// spaces, sorted; or the error.
    async fn labels(&self, expr: &str) -> Result<Vec<String>, String> {
        let data = self
            .api(&format!("/api/v1/query?query={}", percent_encode(expr)))
            .await?;
        let mut out: Vec<String> = data["result"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                let metric = r["metric"].as_object().cloned().unwrap_or_default();
                let mut pairs: Vec<String> = metric
                    .iter()
                    .filter(|(k, _)| !matches!(k.as_str(), "__name__" | "alertstate" | "severity" | "job"))
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect();
                pairs.sort_by_key(|p| !p.starts_with("alertname="));
                pairs.join(" ")
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// The page alerts that fired at any moment of the last `secs` seconds.
    async fn pages_fired(&self, secs: u64) -> Vec<String> {
        let expr = format!("max_over_time(ALERTS{{severity=\"page\", alertstate=\"firing\"}}[{secs}s])");
        self.labels(&expr).await.expect("ALERTS query")
    }

    /// Waits until every target has been scraped once and is up.
    async fn scraped(&self, targets: usize, within: Duration) {
        let deadline = Instant::now() + within;
        let expr = format!("count(up{{job=\"seatgate\"}} == 1) == {targets}");
        while self.query(&expr).await != Ok(1) {
            assert!(Instant::now() < deadline, "prometheus did not scrape the workers");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// An instant query: the number of results, or the error.
    async fn query(&self, expr: &str) -> Result<usize, String> {
        let data = self
            .api(&format!("/api/v1/query?query={}", percent_encode(expr)))
            .await?;
        Ok(match &data["result"] {
            Value::Array(series) => series.len(),
            Value::Null => 0,
            _ => 1, // a scalar or a string
        })
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default();
            eprintln!("--- prometheus log ---\n{log}");
        }
    }
}

fn repo_file(path: &str) -> PathBuf {
    crate::support::repo_file(path)
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every `expr` of the dashboard's panel targets (rows' panels included),
/// with the title of its panel, and the dashboard variables replaced by
/// values a user could pick.
fn dashboard_exprs() -> Vec<(String, String)> {
    fn walk(v: &Value, panel: &str, out: &mut Vec<(String, String)>) {
        match v {
            Value::Object(map) => {
                if let (Some(Value::String(expr)), Some(_)) = (map.get("expr"), map.get("refId")) {
                    out.push((panel.to_owned(), expr.clone()));
                }
                // A panel's targets belong to it; a row's panels to themselves.
                let panel = match (map.get("title"), map.get("type")) {
                    (Some(Value::String(title)), Some(_)) => title.as_str(),
                    _ => panel,
                };
                map.values().for_each(|v| walk(v, panel, out));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, panel, out)),
            _ => {}
        }
    }
    let text = std::fs::read_to_string(repo_file("ops/grafana/seatgate.json")).expect("dashboard");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    walk(&dashboard["panels"], "", &mut exprs);
    exprs
        .into_iter()
        .map(|(panel, e)| {
            let e = e
                .replace("$__rate_interval", RATE_INTERVAL)
                .replace("$__interval", RATE_INTERVAL)
                .replace("$__range", RATE_INTERVAL)
                .replace("$license", PICKED);
            (panel, e)
        })
        .collect()
}

/// A rule's expression with every comparison turned into a `bool`
/// comparison (`x > 0.9` becomes `x > bool 0.9`): an alert that does not fire
/// returns nothing, while its `bool` form returns a 0 for every series it
/// looks at, so "no data" then means a wrong metric or label name. Label
/// matchers (`{a!="b"}`), ranges and strings are left alone.
fn with_bool(expr: &str) -> String {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = String::new();
    let (mut depth, mut quote) = (0i32, None::<char>);
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        match (quote, c) {
            (Some(q), _) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'' | '`') => quote = Some(c),
            (None, '{' | '[') => depth += 1,
            (None, '}' | ']') => depth -= 1,
            (None, '=' | '!' | '>' | '<') if depth == 0 => {
                let two = matches!(
                    (c, next),
                    ('=', Some('=')) | ('!', Some('=')) | ('>', Some('=')) | ('<', Some('='))
                );
                if c == '>' || c == '<' || two {
                    let op_len = if two { 2 } else { 1 };
                    out.extend(&chars[i..i + op_len]);
                    i += op_len;
                    let rest: String = chars[i..].iter().collect();
                    if !rest.trim_start().starts_with("bool") {
                        out.push_str(" bool");
                    }
                    continue;
                }
            }
            _ => {}
        }
        out.push(c);
        i += 1;
    }
    out
}

#[test]
fn bool_form_of_rule_expressions() {
    assert_eq!(
        with_bool(r#"up{job!="x"} == 0 and on() a{b=~"c"} >= 1"#),
        r#"up{job!="x"} == bool 0 and on() a{b=~"c"} >= bool 1"#
    );
    assert_eq!(with_bool("a / (b > 0) > bool 0.9"), "a / (b > bool 0) > bool 0.9");
}

/// Every rule of the loaded alert rules, as (name, expression), read back
/// from Prometheus's `/api/v1/rules`: the file Prometheus loaded, parsed by
/// Prometheus itself.
async fn rule_exprs(prometheus: &Prometheus) -> Vec<(String, String)> {
    let data = prometheus.api("/api/v1/rules").await.expect("rules API");
    let mut out = Vec::new();
    for group in data["groups"].as_array().into_iter().flatten() {
        for rule in group["rules"].as_array().into_iter().flatten() {
            let name = rule["name"].as_str().unwrap_or_default().to_owned();
            out.push((name, rule["query"].as_str().unwrap_or_default().to_owned()));
        }
    }
    out
}

/// Acquires (granted, refused, queued then granted, queued then timed out),
/// heartbeats, releases, an eviction and a dead letter; a lingering seat, a
/// borrowed one and a borrow that ends, a revocation, a refused `reply_to`,
/// a license written by hand with an invalid expiry (seconds, not ms),
/// and last (every later `XADD *` would be as far ahead) an entry id ahead
/// of the clock.
async fn mixed_load(settings: &Settings) {
    provision(settings, LICENSE, &seats(2)).await;
    provision(settings, "short", &seats_with_timeout(1, 1_000)).await;
    // Expires in 10 days: the expiry rules look at it.
    let in_ten_days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 10 * 86_400_000;
    let spare = LicenseSpec {
        expires_at_ms: in_ten_days,
        ..seats(10)
    };
    provision(settings, "spare", &spare).await;
    let mut con = db(settings).await;
    // A hand-broken key: every script on this license fails with WRONGTYPE.
    let _: () = redis::cmd("SET")
        .arg(license_keys(settings, "poison").holders)
        .arg("oops")
        .query_async(&mut con)
        .await
        .unwrap();
    // Written as a billing system may (the hash alone, outside the license
    // index, so not in the seat totals), with its expiry in seconds: invalid.
    for (field, value) in [("seats_total", "1"), ("expires_at_ms", "1893456000")] {
        crate::support::set_license_field(&mut con, settings, "badexp", field, value).await;
    }

    let c = client(settings).await;
    let status = |r: seatgate_client::Reply| r.status();
    assert_eq!(
        status(c.call(&acquire(LICENSE, "s1", 0), T).await.unwrap()),
        Status::Acquired
    );
    assert_eq!(
        status(c.call(&acquire(LICENSE, "s2", 0), T).await.unwrap()),
        Status::Acquired
    );
    assert_eq!(
        status(c.call(&acquire("spare", "s1", 0), T).await.unwrap()),
        Status::Acquired
    );
    assert_eq!(
        status(c.call(&acquire(LICENSE, "s3", 0), T).await.unwrap()),
        Status::NoSeatsAvailable
    );
    assert_eq!(
        status(c.call(&acquire("nosuch", "s1", 0), T).await.unwrap()),
        Status::LicenseNotFound
    );
    // Evicted: never heartbeats, 1 s timeout.
    assert_eq!(
        status(c.call(&acquire("short", "e1", 0), T).await.unwrap()),
        Status::Acquired
    );
    // A client of its own: `call` on `c` would skip (consume) its late reply.
    let doomed = client(settings).await;
    let poison = doomed.send(&acquire("poison", "x", 0)).await.unwrap();

    let waiter = client(settings).await;
    let granted = waiter.send(&acquire(LICENSE, "w1", 60_000)).await.unwrap();
    assert_eq!(
        waiter.wait_for(&granted, T).await.unwrap().status(),
        Status::Queued
    );
    let impatient = client(settings).await;
    let timed_out = impatient.send(&acquire(LICENSE, "w2", 500)).await.unwrap();
    assert_eq!(
        impatient.wait_for(&timed_out, T).await.unwrap().status(),
        Status::Queued
    );
    // Stays queued to the end: a queue depth above 0.
    assert_eq!(
        status(c.call(&acquire(LICENSE, "w3", 120_000), T).await.unwrap()),
        Status::Queued
    );

    for _ in 0..3 {
        let r = c.call(&Call::heartbeat(LICENSE, "s2"), T).await.unwrap();
        assert_eq!(r.status(), Status::HeartbeatUpdated);
    }
    let r = c.call(&Call::release(LICENSE, "s1"), T).await.unwrap();
    assert_eq!(r.status(), Status::Released);
    assert_eq!(
        waiter.wait_for(&granted, T).await.unwrap().status(),
        Status::Granted
    );
    assert_eq!(
        impatient.wait_for(&timed_out, T).await.unwrap().status(),
        Status::QueueTimeout
    );
    let dead = doomed.wait_for(&poison, Duration::from_secs(15)).await.unwrap();
    assert_eq!(dead.status(), Status::Error);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !holders(settings, "short").await.is_empty() {
        assert!(Instant::now() < deadline, "the stale session was not evicted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // spare: a seat lingering after its release, one borrowed for an hour,
    // one borrowed for a second (the reaper frees it: borrow_ended).
    let policy = LicensePolicy {
        linger_ms: Some(600_000),
        max_borrow_ms: Some(3_600_000),
        ..LicensePolicy::default()
    };
    put_policy(settings, "spare", &policy).await;
    assert_eq!(
        status(c.call(&acquire("spare", "l1", 0), T).await.unwrap()),
        Status::Acquired
    );
    let r = c.call(&Call::release("spare", "l1"), T).await.unwrap();
    assert_eq!((r.status(), r.get("linger_ms")), (Status::Released, "600000"));
    for (session, borrow_ms) in [("b1", 3_600_000), ("b0", 1_000)] {
        let borrow = acquire("spare", session, 0).with_policy(RequestPolicy {
            borrow_ms,
            ..RequestPolicy::NONE
        });
        assert_eq!(status(c.call(&borrow, T).await.unwrap()), Status::Acquired);
    }
    // An administrator revokes a holder.
    assert_eq!(
        status(c.call(&acquire("spare", "r1", 0), T).await.unwrap()),
        Status::Acquired
    );
    let admin = settings.client().connect_admin().await.unwrap();
    let revoke = Revoke {
        license: "spare".into(),
        session: "r1".into(),
        reason: "dashboard test".into(),
        actor: "ops".into(),
        cooldown_ms: 0,
        user_wide: false,
    };
    assert_eq!(admin.revoke(&revoke, T).await.unwrap().status(), Status::Revoked);
    // A reply_to outside replies.prefix: dead-lettered, never decided.
    add_request(
        &mut con,
        settings,
        &[
            ("op", "release"),
            ("id", "elsewhere-1"),
            ("license", "spare"),
            ("session", "ghost"),
            ("reply_to", "orders:jobs"),
        ],
    )
    .await;
    // An entry id an hour ahead of the Redis clock (fire and forget): a
    // valid request (its lease too), so a script decides it and the worker
    // compares the id with the Redis clock.
    let ahead = redis_ms(&mut con).await + 3_600_000;
    let _: String = redis::cmd("XADD")
        .arg(settings.client_requests())
        .arg(format!("{ahead}-0"))
        .arg("op")
        .arg("release")
        .arg("license")
        .arg("spare")
        .arg("session")
        .arg("ghost")
        .arg("lease")
        .arg(crate::support::lease_of("ghost"))
        .query_async(&mut con)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs prometheus: bash ops/test.sh runs it"]
async fn every_dashboard_and_alert_expression_returns_data_from_two_scraped_workers() {
    let started = Instant::now();
    let redis = RedisServer::start_with(&[]).await;
    let env = [
        ("SEATGATE__REAPER__SCHEDULE", "* * * * * *".to_owned()),
        ("SEATGATE__STREAM__MAX_DELIVERIES", "2".to_owned()),
        ("SEATGATE__STREAM__CLAIM_IDLE_MS", "1000".to_owned()),
    ];
    let w1 = WorkerProcess::start(&redis.url(), &env).await;
    let w2 = WorkerProcess::start(&redis.url(), &env).await;
    let prometheus = Prometheus::start(&[&w1.metrics, &w2.metrics]).await;
    // The counters' increase() sees the load only from a scrape before it:
    // Prometheus first scrapes some seconds after it is ready (its target
    // discovery's first update).
    let deadline = Instant::now() + Duration::from_secs(20);
    while prometheus.query("count(up{job=\"seatgate\"} == 1) == 2").await != Ok(1) {
        assert!(
            Instant::now() < deadline,
            "prometheus did not scrape both workers"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    mixed_load(&redis.settings()).await;

    let rules = rule_exprs(&prometheus).await;
    let alerts_in_file = std::fs::read_to_string(repo_file("ops/prometheus/alerts.yml"))
        .unwrap()
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert:"))
        .count();
    assert_eq!(
        rules.len(),
        alerts_in_file,
        "prometheus loaded every rule: {rules:?}"
    );

    let dashboard = dashboard_exprs();
    let mut checks: Vec<(String, String)> = dashboard
        .iter()
        .map(|(panel, e)| (format!("dashboard {panel}"), e.clone()))
        .collect();
    assert!(
        checks.len() >= 30,
        "the dashboard's targets were found: {checks:?}"
    );
    for panel in ABOVE_ZERO {
        let targets: Vec<&String> = dashboard
            .iter()
            .filter(|(p, _)| p == panel)
            .map(|(_, e)| e)
            .collect();
        assert!(!targets.is_empty(), "no panel {panel:?} in the dashboard");
        for expr in targets {
            checks.push((format!("dashboard {panel} (above 0)"), format!("({expr}) > 0")));
        }
    }
    for (name, expr) in &rules {
        // The rule as written must be valid; its bool form must return data.
        prometheus
            .query(expr)
            .await
            .unwrap_or_else(|e| panic!("alert {name}: invalid expression {expr}: {e}"));
        // absent(x) returns nothing while x is there: its count() must have data.
        checks.push((
            format!("alert {name}"),
            with_bool(expr).replace("absent(", "count("),
        ));
    }

    // Rates need two scrapes after the load: retry until every expression has data.
    let deadline = Instant::now() + Duration::from_secs(20);
    let failing = loop {
        let mut failing = Vec::new();
        for (source, expr) in &checks {
            match prometheus.query(expr).await {
                Ok(0) => failing.push(format!("{source}: no data: {expr}")),
                Ok(_) => {}
                Err(e) => failing.push(format!("{source}: invalid: {expr}: {e}")),
            }
        }
        if failing.is_empty() || Instant::now() > deadline {
            break failing;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for (source, expr) in &checks {
        eprintln!("checked ({source}): {expr}");
    }
    assert!(
        failing.is_empty(),
        "expressions without data:\n{}",
        failing.join("\n")
    );

    // Shared-state gauges come from the reaper leader alone, so sums are right.
    assert_eq!(prometheus.query("sum(seatgate_reaper_leader) == 1").await, Ok(1));
    assert_eq!(
        prometheus
            .query("count(seatgate_fleet_seats_capacity) == 1")
            .await,
        Ok(1)
    );
    assert_eq!(
        prometheus.query("sum(seatgate_seats_capacity) == 13").await,
        Ok(1)
    );
    // What the load did, counted once: the workers' counters summed.
    for expr in [
        "sum(seatgate_revocations_total) == 1",
        "sum(seatgate_refused_reply_to_total) == 1",
        "sum(seatgate_future_entry_ids_total) == 1",
        "sum(seatgate_policy_seats_freed_total{reason=\"borrow_ended\"}) == 1",
        "max(seatgate_seats_lingering{license=\"spare\"}) == 1",
        "max(seatgate_seats_borrowed{license=\"spare\"}) == 1",
    ] {
        assert_eq!(prometheus.query(expr).await, Ok(1), "{expr}");
    }
    assert_eq!(
        prometheus
            .query(&format!(
                "sum(seatgate_denials_total{{license=\"{LICENSE}\"}}) == 2"
            ))
            .await,
        Ok(1),
        "one NO_SEATS_AVAILABLE and one QUEUE_TIMEOUT"
    );
    eprintln!("{} expressions checked in {:?}", checks.len(), started.elapsed());
}

/// The Alertmanager example (ops/prometheus/alertmanager.yml) run by a real
/// Alertmanager: of the alerts a Redis outage raises, of every process down,
/// of a Redis nearly full, and of a license expiring within a day, only the
/// causes stay unmuted (the alerts API reports
/// each alert's inhibitors as it lists them).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs prometheus-alertmanager: bash ops/test.sh runs it"]
async fn the_alertmanager_example_pages_once_for_one_cause() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = repo_file("ops/prometheus/alertmanager.yml");
    let addr = format!("127.0.0.1:{}", free_port());
    let log = std::fs::File::create(dir.path().join("alertmanager.log")).unwrap();
    let mut alertmanager = Command::new("prometheus-alertmanager")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.path={}", dir.path().join("data").display()))
        .arg(format!("--web.listen-address={addr}"))
        .arg("--cluster.listen-address=")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start prometheus-alertmanager (bash ops/ensure-alertmanager.sh installs it)");
    /// Kills and reaps it whatever happens.
    struct Reap<'a>(&'a mut Child);
    impl Drop for Reap<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _reap = Reap(&mut alertmanager);
    let deadline = Instant::now() + Duration::from_secs(15);
    while http_get(&addr, "/-/ready").await.map(|(code, _)| code) != Some(200) {
        assert!(Instant::now() < deadline, "alertmanager did not become ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let mut raised = Vec::new();
    for instance in ["w1:9464", "w2:9464", "w3:9464"] {
        raised.push(format!(
            "alertname=SeatgateRedisDown severity=page instance={instance}"
        ));
        raised.push(format!(
            "alertname=SeatgateNotReady severity=page instance={instance}"
        ));
    }
    for alert in [
        "alertname=SeatgateReaperStale severity=page",
        "alertname=SeatgateNoReaperLeader severity=page",
        "alertname=SeatgateRequestLagGrowing severity=page stream=seat:requests",
        "alertname=SeatgateBacklogUnwatched severity=page",
        "alertname=SeatgateLicenseExpiresWithinADay severity=page license=cad",
        "alertname=SeatgateLicenseExpiringSoon severity=ticket license=cad",
        "alertname=SeatgateLicenseExpiringSoon severity=ticket license=sim",
        "alertname=SeatgateAllDown severity=page",
        "alertname=SeatgateDown severity=page instance=w4:9464",
        "alertname=SeatgateRedisMemoryCritical severity=page",
        "alertname=SeatgateRedisMemoryHigh severity=ticket",
    ] {
        raised.push(alert.to_owned());
    }
    for alert in &raised {
        let status = Command::new("amtool")
            .arg(format!("--alertmanager.url=http://{addr}"))
            .args(["alert", "add"])
            .args(alert.split(' '))
            .status()
            .expect("amtool");
        assert!(status.success(), "amtool alert add {alert}");
    }

    // name and the license or instance of each alert left unmuted, sorted.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (unmuted, all) = loop {
        let (_, response) = http_get(&addr, "/api/v2/alerts").await.expect("alerts API");
        let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        let alerts: Value = serde_json::from_str(body).expect("alerts JSON");
        let alerts = alerts.as_array().cloned().unwrap_or_default();
        let mut unmuted: Vec<String> = alerts
            .iter()
            .filter(|a| {
                a["status"]["inhibitedBy"]
                    .as_array()
                    .is_none_or(|by| by.is_empty())
            })
            .map(|a| {
                let labels = &a["labels"];
                let of = labels["instance"]
                    .as_str()
                    .or(labels["license"].as_str())
                    .unwrap_or("");
                format!("{} {of}", labels["alertname"].as_str().unwrap_or(""))
            })
            .collect();
        unmuted.sort();
        if (alerts.len() == raised.len() && unmuted.len() == 7) || Instant::now() > deadline {
            break (unmuted, alerts.len());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(all, raised.len());
    assert_eq!(
        unmuted,
        [
            "SeatgateAllDown ",
            "SeatgateLicenseExpiresWithinADay cad",
            "SeatgateLicenseExpiringSoon sim",
            "SeatgateRedisDown w1:9464",
            "SeatgateRedisDown w2:9464",
            "SeatgateRedisDown w3:9464",
            "SeatgateRedisMemoryCritical ",
        ],
        "one cause, one page"
    );
    // The three instances' RedisDown are one group, so one notification, to the pager.
    let (_, response) = http_get(&addr, "/api/v2/alerts/groups")
        .await
        .expect("groups API");
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let groups: Value = serde_json::from_str(body).expect("groups JSON");
    let redis_down: Vec<(&str, usize)> = groups
        .as_array()
        .into_iter()
        .flatten()
        .filter(|g| g["labels"]["alertname"] == "SeatgateRedisDown")
        .map(|g| {
            let receiver = g["receiver"]["name"].as_str().unwrap_or("");
            (receiver, g["alerts"].as_array().map_or(0, Vec::len))
        })
        .collect();
    assert_eq!(redis_down, [("seatgate-pager", 3)], "{groups}");
}

/// The scrape intervals of the issue 38 checks, each a Prometheus of its own
/// scraping the same workers: 15 s, and 1 m (the rules evaluated as often).
const INTERVALS: [&str; 2] = ["15s", "1m"];

/// Starts one Prometheus per [`INTERVALS`] over `workers` and waits until
/// each has scraped all of them; returns them with the moment that was.
async fn prometheus_per_interval(workers: &[&WorkerProcess]) -> (Vec<Prometheus>, Instant) {
    let targets: Vec<&str> = workers.iter().map(|w| w.metrics.as_str()).collect();
    let mut servers = Vec::new();
    for interval in INTERVALS {
        servers.push(Prometheus::start_every(&targets, interval).await);
    }
    for p in &servers {
        // The first scrape comes up to one interval after the targets'
        // discovery (some seconds).
        p.scraped(targets.len(), Duration::from_secs(90)).await;
    }
    (servers, Instant::now())
}

/// Waits until each Prometheus has every alert of `firing` (as
/// [`Prometheus::labels`] renders them) firing, at most `within`; returns how
/// long each took.
async fn until_firing(servers: &[Prometheus], firing: &[&str], within: Duration) -> Vec<Duration> {
    let started = Instant::now();
    let mut took = vec![None; servers.len()];
    loop {
        for (i, p) in servers.iter().enumerate() {
            if took[i].is_none() {
                let now = p
                    .labels("ALERTS{alertstate=\"firing\"}")
                    .await
                    .unwrap_or_default();
                if firing.iter().all(|f| now.iter().any(|n| n == f)) {
                    took[i] = Some(started.elapsed());
                }
            }
        }
        if took.iter().all(Option::is_some) {
            return took.into_iter().flatten().collect();
        }
        for (i, p) in servers.iter().enumerate() {
            if took[i].is_none() && started.elapsed() > within {
                let now = p.labels("ALERTS").await.unwrap_or_default();
                panic!(
                    "{} scrape: {firing:?} not all firing after {within:?}; ALERTS: {now:?}",
                    INTERVALS[i]
                );
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Unix seconds now.
fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

/// Issue 38: 300 licenses in a real Redis, half provisioned by seatgate (in
/// the license index) and half written as a billing system writes them (the
/// hash alone); 60 of the first half hold seats, so the 50 seat series go to
/// them, and one idle billing-written license expires in 12 hours. Three
/// real workers, scraped by a real Prometheus at 15 s and another at 1 m,
/// each evaluating the shipped rules (`for: 5m` as written): the expiry page
/// fires at both intervals, and no other alert of severity page fires from
/// the first scrape on (the tickets, a license expiring in 10 days, may).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs prometheus: bash ops/test.sh runs it (about 8 minutes)"]
async fn an_idle_license_expiring_in_12_hours_among_300_pages_at_15s_and_1m_and_nothing_else_does() {
    const IDLE: &str = "billing-idle-12h";
    let redis = RedisServer::start_with(&["--maxmemory", "1gb"]).await;
    let settings = redis.settings();
    let now = now_s();
    for i in 0..150 {
        let spec = LicenseSpec {
            expires_at_ms: if i == 7 { (now + 10 * 86_400) * 1000 } else { 0 },
            ..seats_with_timeout(4, 3_600_000)
        };
        provision(&settings, &format!("seat-{i:03}"), &spec).await;
    }
    let mut con = db(&settings).await;
    for i in 0..150 {
        let (license, expires) = match i {
            0 => (IDLE.to_owned(), (now + 12 * 3_600) * 1000),
            1..=20 => (format!("billing-{i:03}"), (now + 90 * 86_400) * 1000),
            _ => (format!("billing-{i:03}"), 0),
        };
        let _: () = redis::cmd("HSET")
            .arg(license_keys(&settings, &license).license)
            .arg("seats_total")
            .arg(5)
            .arg("expires_at_ms")
            .arg(expires)
            .query_async(&mut con)
            .await
            .unwrap();
    }
    let env = [];
    let workers = [
        WorkerProcess::start(&redis.url(), &env).await,
        WorkerProcess::start(&redis.url(), &env).await,
        WorkerProcess::start(&redis.url(), &env).await,
    ];
    let c = client(&settings).await;
    for i in 0..60 {
        let r = c
            .call(&acquire(&format!("seat-{i:03}"), "holder", 0), T)
            .await
            .unwrap();
        assert_eq!(r.status(), Status::Acquired);
    }
    // The leader's census has all 300, the idle license's expiry, and the
    // 50 seat series for busier licenses.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut pages = Vec::new();
        for w in &workers {
            pages.push(w.scrape().await);
        }
        let expiry = format!("seatgate_license_expiry_timestamp_seconds{{license=\"{IDLE}\"}}");
        if pages.iter().any(|p| {
            crate::support::metric(p, "seatgate_licenses") == Some(150.0)
                && crate::support::metric(p, "seatgate_fleet_seats_used") == Some(60.0)
                && crate::support::metric(p, &expiry) == Some((now + 12 * 3_600) as f64)
        }) {
            assert!(
                pages
                    .iter()
                    .all(|p| !p.contains(&format!("seatgate_seats_used{{license=\"{IDLE}\"}}"))),
                "the idle license has no seat series"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the leader did not export the idle license's expiry"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let (servers, scraped) = prometheus_per_interval(&workers.iter().collect::<Vec<_>>()).await;
    let page = format!("alertname=SeatgateLicenseExpiresWithinADay license={IDLE}");
    let took = until_firing(&servers, &[&page], Duration::from_secs(9 * 60)).await;
    for (p, (interval, took)) in servers.iter().zip(INTERVALS.iter().zip(&took)) {
        eprintln!("{interval} scrape: {page} firing {took:?} after the first scrape");
        let window = scraped.elapsed().as_secs() + 1;
        assert_eq!(
            p.pages_fired(window).await,
            std::slice::from_ref(&page),
            "{interval}: nothing else pages"
        );
        assert_eq!(
            p.query(&format!("seatgate_seats_used{{license=\"{IDLE}\"}}"))
                .await,
            Ok(0),
            "{interval}: the idle license is outside the top 50"
        );
        assert_eq!(
            p.query("max(seatgate_licenses_expiring{within=\"1d\"}) == 1")
                .await,
            Ok(1),
            "{interval}"
        );
    }
}

/// Issue 38: Redis held at 96% of its `maxmemory` pages
/// (SeatgateRedisMemoryCritical), and then every worker killed raises
/// SeatgateAllDown, SeatgateDown per worker, SeatgateNoReaperLeader (its
/// `absent()`) and SeatgateBacklogUnwatched (no process exports the backlog);
/// nothing else pages, at a 15 s and a 1 m scrape (rules as shipped).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs prometheus: bash ops/test.sh runs it (about 8 minutes)"]
async fn redis_at_96_percent_pages_and_every_worker_down_raises_the_backlog_alerts_at_15s_and_1m() {
    let redis = RedisServer::start_with(&[]).await;
    let settings = redis.settings();
    provision(&settings, LICENSE, &seats(5)).await;
    // 100 MiB of ballast: 4% of a Redis of 1 MiB is less than one burst of
    // client buffers, and it would refuse the workers' reads (OOM) at 96%.
    let mut con = db(&settings).await;
    let mib = "x".repeat(1 << 20);
    for i in 0..100 {
        let _: () = redis::cmd("SET")
            .arg(format!("ballast:{i}"))
            .arg(&mib)
            .query_async(&mut con)
            .await
            .unwrap();
    }
    let env = [];
    let mut workers = [
        WorkerProcess::start(&redis.url(), &env).await,
        WorkerProcess::start(&redis.url(), &env).await,
        WorkerProcess::start(&redis.url(), &env).await,
    ];
    let (servers, scraped) = prometheus_per_interval(&workers.iter().collect::<Vec<_>>()).await;

    // Redis at 96% of maxmemory, held there as its use moves.
    let memory = "alertname=SeatgateRedisMemoryCritical".to_owned();
    let hold = async {
        loop {
            let info: String = redis::cmd("INFO")
                .arg("memory")
                .query_async(&mut con)
                .await
                .unwrap();
            let used: u64 = info
                .lines()
                .find_map(|l| l.strip_prefix("used_memory:"))
                .and_then(|v| v.trim().parse().ok())
                .expect("used_memory");
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory")
                .arg(used * 100 / 96)
                .query_async(&mut con)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    };
    let wanted = [memory.as_str()];
    let took = tokio::select! {
        took = until_firing(&servers, &wanted, Duration::from_secs(4 * 60)) => took,
        _ = hold => unreachable!(),
    };
    for (p, (interval, took)) in servers.iter().zip(INTERVALS.iter().zip(&took)) {
        eprintln!("{interval} scrape: {memory} firing {took:?} after the memory reached 96%");
        let window = scraped.elapsed().as_secs() + 1;
        assert_eq!(
            p.pages_fired(window).await,
            std::slice::from_ref(&memory),
            "{interval}: nothing else pages"
        );
    }
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(0)
        .query_async(&mut con)
        .await
        .unwrap();

    // Every worker killed: requests would pile up with nobody to read them.
    let killed = Instant::now();
    for w in &mut workers {
        w.kill9();
    }
    let mut down: Vec<String> = workers
        .iter()
        .map(|w| format!("alertname=SeatgateDown instance={}", w.metrics))
        .collect();
    for name in [
        "SeatgateAllDown",
        "SeatgateNoReaperLeader",
        "SeatgateBacklogUnwatched",
    ] {
        down.push(format!("alertname={name}"));
    }
    down.sort();
    let expected: Vec<&str> = down.iter().map(String::as_str).collect();
    let took = until_firing(&servers, &expected, Duration::from_secs(6 * 60)).await;
    for (p, (interval, took)) in servers.iter().zip(INTERVALS.iter().zip(&took)) {
        eprintln!("{interval} scrape: {expected:?} firing {took:?} after every worker was killed");
        let window = killed.elapsed().as_secs() + 1;
        let fired: Vec<String> = p
            .pages_fired(window)
            .await
            .into_iter()
            .filter(|a| *a != memory)
            .collect();
        assert_eq!(fired, down, "{interval}: nothing else pages");
    }
}
