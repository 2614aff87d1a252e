//! The status page in a real headless Chromium, driven over the Chrome
//! DevTools Protocol: it follows a seat changing hands live (holder, waiter,
//! eviction, grant) without reloading, shows hostile metadata as text, says so
//! when Redis cannot be reached, and serves `/status.json` exactly as
//! `seatgate status --json` prints it.
//!
//! Chromium comes from Debian's `chromium` package, which `ops/test.sh`
//! installs (ops/ensure-chromium.sh). It runs with a throwaway profile, in its
//! own process group so that the guard can kill every process it forked.
//!
//! The DevTools connection is a blocking websocket (tungstenite): every call
//! on it runs off the runtime's threads, and every wait between calls is
//! tokio's, so the test's own tasks (a client heartbeating) keep running.

use std::fs::File;
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use seatgate::client::{Call, Client};
use seatgate::engine::license::LicenseSpec;
use seatgate::engine::ops::Op;
use seatgate::engine::policy::RequestPolicy;
use seatgate::engine::status::Status;
use serde_json::{json, Value};
use tungstenite::{Message, WebSocket};

use crate::support::{
    acquire, client, http_get, output, provision, seatgate_cmd, seats, seats_with_timeout, spawn_app,
    TestApp, WorkerProcess, T,
};

/// How long the page gets to show each new state: a poll every second, plus
/// the reaper's one-second schedule where an eviction is involved.
const SHOWS_WITHIN: Duration = Duration::from_secs(8);

/// A headless Chromium with a temporary profile; kills its process group on drop.
struct Browser {
    /// The browser process, leader of its own process group.
    child: Child,
    /// `--user-data-dir`: profile, `DevToolsActivePort`, and Chromium's log.
    profile: tempfile::TempDir,
    /// The browser-wide DevTools websocket URL.
    ws_url: String,
}

impl Browser {
    /// Starts Chromium and waits until its DevTools endpoint is announced.
    async fn launch() -> Browser {
        let profile = tempfile::tempdir().expect("chromium profile dir");
        let log = File::create(profile.path().join("chromium.log")).expect("chromium log file");
        let child = Command::new("chromium")
            .args([
                "--headless=new",
                // Tests run as root, where Chromium's sandbox cannot start.
                "--no-sandbox",
                // Port 0: Chromium picks a free port and writes it to
                // DevToolsActivePort, so no other process can take it first.
                "--remote-debugging-port=0",
                "--remote-debugging-address=127.0.0.1",
                "--window-size=1280,900",
                "--hide-scrollbars",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-gpu",
                "--disable-extensions",
                // Traffic stays on loopback: no updates, pings or sync, and any
                // other host goes to a proxy that does not exist.
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-domain-reliability",
                "--no-pings",
                "--proxy-server=http://127.0.0.1:9",
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start chromium ({e}); `bash ops/test.sh` installs Debian's chromium \
                     package (ops/ensure-chromium.sh)"
                )
            });
        let mut browser = Browser {
            child,
            profile,
            ws_url: String::new(),
        };
        let port_file = browser.profile.path().join("DevToolsActivePort");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(text) = std::fs::read_to_string(&port_file) {
                let mut lines = text.lines();
                if let (Some(port), Some(path)) = (lines.next(), lines.next()) {
                    browser.ws_url = format!("ws://127.0.0.1:{port}{path}");
                    return browser;
                }
            }
            if let Ok(Some(status)) = browser.child.try_wait() {
                panic!("chromium exited at startup ({status}):\n{}", browser.log());
            }
            assert!(
                Instant::now() < deadline,
                "chromium did not open its DevTools port within 30 s:\n{}",
                browser.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// What Chromium wrote to stderr.
    fn log(&self) -> String {
        std::fs::read_to_string(self.profile.path().join("chromium.log")).unwrap_or_default()
    }

    /// A new tab on `url` with a DevTools session attached to it.
    async fn open(&self, url: &str) -> Page {
        let request = self.ws_url.clone();
        let devtools = tokio::task::spawn_blocking(move || {
            let addr = request
                .trim_start_matches("ws://")
                .split('/')
                .next()
                .expect("host:port in the DevTools URL");
            let stream = TcpStream::connect(addr).expect("connect to chromium's DevTools port");
            stream
                .set_read_timeout(Some(Duration::from_secs(15)))
                .expect("read timeout");
            let (ws, _) =
                tungstenite::client(request.as_str(), stream).expect("DevTools websocket handshake");
            DevTools {
                ws,
                next_id: 0,
                session: None,
            }
        });
        let mut page = Page {
            devtools: Some(off_runtime(devtools).await),
        };
        let target = page
            .call("Target.createTarget", json!({ "url": "about:blank" }))
            .await;
        let target_id = target["targetId"].as_str().expect("targetId").to_owned();
        let attached = page
            .call(
                "Target.attachToTarget",
                json!({ "targetId": target_id, "flatten": true }),
            )
            .await;
        let session = attached["sessionId"].as_str().expect("sessionId").to_owned();
        page.devtools.as_mut().expect("no call in flight").session = Some(session);
        page.call("Page.enable", json!({})).await;
        page.call("Runtime.enable", json!({})).await;
        page.call("Page.navigate", json!({ "url": url })).await;
        page.wait_until(
            "the page has loaded",
            "document.readyState === 'complete' && location.href !== 'about:blank'",
            Duration::from_secs(15),
        )
        .await;
        page
    }

    /// SIGTERM first: Chromium then stops and reaps its renderer, GPU and
    /// crashpad processes itself (killed children would be orphans, left for
    /// an init that may not reap them). Then SIGKILL whatever of its process
    /// group is still there.
    fn stop(&mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Drop cannot await. On a multi-threaded runtime, block_in_place
        // hands this thread's other tasks to another worker while Chromium
        // shuts down; elsewhere (no runtime, or a current-thread one, where
        // block_in_place is not allowed) the wait simply blocks.
        let multi_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if multi_thread {
            tokio::task::block_in_place(|| self.stop());
        } else {
            self.stop();
        }
        if std::thread::panicking() {
            eprintln!("--- chromium log ---\n{}", self.log());
        }
    }
}

/// Waits for blocking work handed to `spawn_blocking`; its panic (a failed
/// assertion about the page) fails the test as it is.
async fn off_runtime<R>(task: tokio::task::JoinHandle<R>) -> R {
    match task.await {
        Ok(r) => r,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => panic!("DevTools task: {e}"),
        },
    }
}

/// The browser's DevTools websocket (flat sessions), spoken to blocking.
struct DevTools {
    /// The browser-wide DevTools connection.
    ws: WebSocket<TcpStream>,
    /// Id of the next command; answers carry it back.
    next_id: u64,
    /// The tab's session id, once attached.
    session: Option<String>,
}

/// One tab. Its DevTools connection is lent to a blocking task for each call.
struct Page {
    /// The connection; `None` only while a call is in flight.
    devtools: Option<DevTools>,
}

impl DevTools {
    /// Sends a DevTools command and returns its `result`; events are skipped.
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = &self.session {
            msg["sessionId"] = json!(session);
        }
        self.ws
            .send(Message::text(msg.to_string()))
            .unwrap_or_else(|e| panic!("send {method}: {e}"));
        loop {
            let frame = self
                .ws
                .read()
                .unwrap_or_else(|e| panic!("answer to {method}: {e}"));
            let Message::Text(text) = frame else { continue };
            let answer: Value = serde_json::from_str(text.as_str()).expect("DevTools sends JSON");
            if answer["id"] != json!(id) {
                continue;
            }
            if let Some(error) = answer.get("error") {
                panic!("{method} failed: {error}");
            }
            return answer["result"].clone();
        }
    }
}

impl Page {
    /// Sends a DevTools command (off the runtime's threads) and returns its `result`.
    async fn call(&mut self, method: &str, params: Value) -> Value {
        let mut devtools = self.devtools.take().expect("one DevTools call at a time");
        let method = method.to_owned();
        let task = tokio::task::spawn_blocking(move || {
            let result = devtools.call(&method, params);
            (devtools, result)
        });
        let (devtools, result) = off_runtime(task).await;
        self.devtools = Some(devtools);
        result
    }

    /// Evaluates `expr` in the page and returns its value.
    async fn eval(&mut self, expr: &str) -> Value {
        let out = self
            .call(
                "Runtime.evaluate",
                json!({ "expression": expr, "returnByValue": true }),
            )
            .await;
        if let Some(e) = out.get("exceptionDetails") {
            panic!("`{expr}` threw: {e}");
        }
        out["result"]["value"].clone()
    }

    /// The page's visible text.
    async fn text(&mut self) -> String {
        self.eval("document.body.innerText")
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The visible text of one license's holders or queue table.
    async fn part(&mut self, license: &str, part: &str) -> String {
        let expr = format!(
            "(document.querySelector('[data-license=\"{license}\"] .{part}') || {{}}).innerText || ''"
        );
        self.eval(&expr).await.as_str().unwrap_or_default().to_owned()
    }

    /// Polls until `expr` is true; fails naming `what` and showing the page.
    async fn wait_until(&mut self, what: &str, expr: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while self.eval(expr).await != json!(true) {
            if Instant::now() >= deadline {
                let text = self.text().await;
                panic!("the page did not show that {what} within {within:?}; it reads:\n{text}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until one license's `part` (`holders` or `queue`) satisfies `ok`.
    async fn wait_part(&mut self, what: &str, license: &str, part: &str, ok: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + SHOWS_WITHIN;
        loop {
            let text = self.part(license, part).await;
            if ok(&text) {
                return;
            }
            if Instant::now() >= deadline {
                panic!("the page did not show that {what} within {SHOWS_WITHIN:?}; {license} {part} reads:\n{text}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A PNG of the whole page, `width` pixels wide.
    async fn screenshot(&mut self, width: u64) -> Vec<u8> {
        use base64::Engine as _;
        let height = self
            .eval("Math.ceil(document.documentElement.scrollHeight)")
            .await
            .as_u64()
            .expect("page height");
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": false }),
        )
        .await;
        let shot = self
            .call("Page.captureScreenshot", json!({ "format": "png" }))
            .await;
        base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("screenshot data"))
            .expect("screenshot is base64")
    }
}

/// Sends an acquire by `user` (the page shows it as the user) with `meta`
/// from `client`; its request id and first answer.
async fn acquire_as(
    client: &mut Client,
    license: &str,
    session: &str,
    user: &str,
    meta: Value,
    wait_ms: u64,
) -> (String, Status) {
    let who = RequestPolicy {
        user: Some(user.to_owned()),
        ..RequestPolicy::NONE
    };
    let call = acquire(license, session, wait_ms)
        .with_meta(meta.to_string())
        .with_policy(who);
    let id = client.send(&call).await.expect("send acquire");
    let reply = client.wait_for(&id, T).await.expect("acquire reply");
    (id, reply.status())
}

/// The body of an HTTP answer and its lower-cased head.
fn split_http(raw: &str) -> (String, &str) {
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((raw, ""));
    (head.to_ascii_lowercase(), body)
}

/// A `status` JSON with the moment of reading taken out: two reads of an
/// unchanged state differ only there.
fn without_time(mut status: Value) -> Value {
    status
        .as_object_mut()
        .expect("status is an object")
        .remove("at_ms");
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_follows_a_seat_changing_hands_without_reloading() {
    let started = Instant::now();
    let TestApp(mut redis, settings, _) = spawn_app().await;
    // Two-second heartbeats and a reaper every second: an abandoned seat
    // changes hands within about three seconds.
    provision(&settings, "cad", &seats(1)).await;
    // The hostile metadata's seat must stay put while the page is read.
    provision(&settings, "xss", &seats_with_timeout(1, 600_000)).await;
    let worker = WorkerProcess::start(
        &redis.url(),
        &[
            ("SEATGATE__SESSIONS__HEARTBEAT_TIMEOUT_MS", "2000".into()),
            ("SEATGATE__REAPER__SCHEDULE", "* * * * * *".into()),
        ],
    )
    .await;

    // The page and its script come with the headers that keep data inert.
    for path in ["/", "/status.js", "/status.css", "/status.json"] {
        let (code, raw) = http_get(&worker.metrics, path).await.expect("GET");
        let (head, _) = split_http(&raw);
        assert_eq!(code, 200, "{path}: {raw}");
        assert!(
            head.contains("content-security-policy: default-src 'self'; script-src 'self';"),
            "{path} has no CSP: {head}"
        );
        assert!(head.contains("x-content-type-options: nosniff"), "{path}: {head}");
    }

    let browser = Browser::launch().await;
    let mut page = browser.open(&format!("http://{}/", worker.metrics)).await;
    page.eval("window.__loaded = 'page-test-marker'").await;
    page.wait_until(
        "both licenses, unused",
        "document.body.innerText.includes('0 / 1 seats') && !!document.querySelector('[data-license=\"xss\"]')",
        SHOWS_WITHIN,
    )
    .await;
    let text = page.text().await;
    assert!(text.contains("Live · last updated"), "{text}");

    // Metadata is whatever a client sent: it must show as text, not markup.
    // (The user is an id the service checks; the hardware id is free text.)
    let mut mallory = client(&settings).await;
    let hostile = "<img src=x onerror=alert(1)>";
    let (_, status) = acquire_as(
        &mut mallory,
        "xss",
        "mallory",
        "mallory",
        json!({ "user_email": hostile, "hardware_id": format!("{hostile}<script>window.__pwned = 1</script>") }),
        0,
    )
    .await;
    assert_eq!(status, Status::Acquired);
    page.wait_part("the hostile holder", "xss", "holders", |t| t.contains(hostile))
        .await;
    assert!(page.text().await.contains("<script>window.__pwned = 1</script>"));
    assert_eq!(
        page.eval("document.querySelectorAll('img').length").await,
        json!(0)
    );
    assert_eq!(
        page.eval("document.querySelectorAll('script').length").await,
        json!(1)
    );
    assert_eq!(page.eval("typeof window.__pwned").await, json!("undefined"));

    // /status.json is `seatgate status --json`, to the byte but for the clock.
    let (code, raw) = http_get(&worker.metrics, "/status.json")
        .await
        .expect("GET /status.json");
    assert_eq!(code, 200);
    let served: Value = serde_json::from_str(split_http(&raw).1).expect("status.json is JSON");
    let cli = output(seatgate_cmd(&redis.url(), &["status", "--json"])).await;
    assert!(cli.status.success(), "{cli:?}");
    let printed: Value = serde_json::from_slice(&cli.stdout).expect("status --json is JSON");
    assert_eq!(without_time(served), without_time(printed));

    // Alice takes cad's only seat and keeps it alive.
    let mut alice = client(&settings).await;
    let (_, status) = acquire_as(
        &mut alice,
        "cad",
        "alice",
        "alice@example.com",
        json!({ "user_email": "alice@example.com", "hardware_id": "LAPTOP-7F3A" }),
        0,
    )
    .await;
    assert_eq!(status, Status::Acquired);
    let stop_heartbeats = tokio_util::sync::CancellationToken::new();
    let heartbeats = tokio::spawn({
        let stop = stop_heartbeats.clone();
        async move {
            while !stop.is_cancelled() {
                let reply = alice
                    .call(&Call::new(Op::Heartbeat, "cad", "alice"), T)
                    .await
                    .expect("heartbeat reply");
                assert_eq!(reply.status(), Status::HeartbeatUpdated);
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = tokio::time::sleep(Duration::from_millis(400)) => {}
                }
            }
        }
    });
    page.wait_part("alice holds cad", "cad", "holders", |t| {
        t.contains("alice@example.com") && t.contains("LAPTOP-7F3A")
    })
    .await;
    assert!(page.text().await.contains("1 / 1 seats"));

    // Bob queues for it.
    let mut bob = client(&settings).await;
    let (bob_id, status) = acquire_as(
        &mut bob,
        "cad",
        "bob",
        "bob@example.com",
        json!({ "user_email": "bob@example.com", "hardware_id": "DESK-19" }),
        60_000,
    )
    .await;
    assert_eq!(status, Status::Queued);
    page.wait_part("bob waits for cad", "cad", "queue", |t| {
        t.to_lowercase().contains("waiting (1)") && t.contains("bob@example.com")
    })
    .await;
    assert!(page.part("cad", "holders").await.contains("alice@example.com"));

    // Alice goes silent: the reaper evicts her and hands the seat to bob.
    stop_heartbeats.cancel();
    heartbeats.await.expect("heartbeat task");
    let granted = bob.wait_for(&bob_id, SHOWS_WITHIN).await.expect("bob is granted");
    assert_eq!(granted.status(), Status::Granted);
    page.wait_part("bob holds cad", "cad", "holders", |t| {
        t.contains("bob@example.com") && !t.contains("alice")
    })
    .await;
    page.wait_part("cad's queue is empty", "cad", "queue", |t| {
        t.to_lowercase().contains("waiting (0)")
    })
    .await;

    // Redis goes away: /status.json says so in one line of JSON, and the page
    // shows the banner; when Redis is back, the banner goes.
    redis.shutdown().await;
    let (code, raw) = http_get(&worker.metrics, "/status.json")
        .await
        .expect("GET /status.json");
    assert_eq!(code, 503, "{raw}");
    let body = split_http(&raw).1.to_owned();
    let error: Value = serde_json::from_str(&body).expect("the 503 is JSON");
    assert!(error["error"].is_string(), "{body}");
    assert_eq!(body.trim_end().lines().count(), 1, "{body}");
    page.wait_until(
        "Redis cannot be reached",
        "!document.getElementById('banner').hidden && \
         document.body.innerText.includes('Cannot reach seatgate/Redis')",
        SHOWS_WITHIN,
    )
    .await;
    redis.restart().await.expect("restart redis");
    page.wait_until(
        "Redis is back",
        "document.getElementById('banner').hidden && document.body.innerText.includes('Live ·')",
        SHOWS_WITHIN,
    )
    .await;

    // All of it happened in the one page load.
    assert_eq!(page.eval("window.__loaded").await, json!("page-test-marker"));
    eprintln!("status page test took {:?}", started.elapsed());
}

/// A few licenses under load, as the README shows them. Writes the PNG to
/// `$SEATGATE_SCREENSHOT` when set (`SEATGATE_SCREENSHOT=$PWD/docs/status-page.png
/// cargo test page::`), else only checks that it is one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_screenshot_of_the_page_under_load() {
    let TestApp(redis, settings, _) = spawn_app().await;
    let expires = 1_801_353_600_000; // 2027-01-31 00:00 UTC
    provision(&settings, "cad-suite", &seats(4)).await;
    let sim_pro = LicenseSpec {
        expires_at_ms: expires,
        ..seats(10)
    };
    provision(&settings, "sim-pro", &sim_pro).await;
    provision(&settings, "render-farm", &seats(16)).await;
    let legacy_cam = LicenseSpec {
        active: false,
        ..seats(2)
    };
    provision(&settings, "legacy-cam", &legacy_cam).await;
    let worker = WorkerProcess::start(&redis.url(), &[]).await;

    let people = [
        ("alice", "alice@example.com", "LAPTOP-7F3A"),
        ("bob", "bob@example.com", "DESK-19"),
        ("carol", "carol.nguyen@example.com", "WS-ENG-042"),
        ("dave", "dave@example.com", "LAPTOP-1C09"),
        ("erin", "erin.kowalski@example.com", "WS-ENG-017"),
        ("frank", "frank@example.com", "DESK-03"),
        ("grace", "grace@example.com", "LAPTOP-88B2"),
        ("heidi", "heidi@example.com", "WS-SIM-005"),
        ("ivan", "ivan@example.com", "WS-SIM-006"),
        ("judy", "judy@example.com", "LAPTOP-4D21"),
    ];
    // cad-suite: 4 seats for 6 people, 2 wait; sim-pro 7 of 10; render-farm 3 of 16.
    let plan: [(&str, &[usize], u64); 3] = [
        ("cad-suite", &[0, 1, 2, 3, 4, 5], 15 * 60_000),
        ("sim-pro", &[6, 7, 8, 9, 1, 2, 4], 0),
        ("render-farm", &[3, 0, 5], 0),
    ];
    let mut client = client(&settings).await;
    for (license, who, wait_ms) in plan {
        for &i in who {
            let (session, email, hardware) = people[i];
            let meta = json!({ "user_email": email, "hardware_id": hardware });
            let (_, status) = acquire_as(&mut client, license, session, email, meta, wait_ms).await;
            assert!(
                matches!(status, Status::Acquired | Status::Queued),
                "{license} {session}: {status:?}"
            );
            // Spread the times a little, as real sessions would be.
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }

    let browser = Browser::launch().await;
    let mut page = browser.open(&format!("http://{}/", worker.metrics)).await;
    page.wait_until(
        "every license",
        "document.querySelectorAll('section.license').length === 4 && \
         document.body.innerText.includes('14 / 32 seats in use')",
        SHOWS_WITHIN,
    )
    .await;
    let png = page.screenshot(1440).await;
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    assert_eq!(width, 1440);
    if let Some(path) = std::env::var_os("SEATGATE_SCREENSHOT") {
        std::fs::write(Path::new(&path), &png).expect("write the screenshot");
        eprintln!("wrote {} ({} bytes)", Path::new(&path).display(), png.len());
    }
}
