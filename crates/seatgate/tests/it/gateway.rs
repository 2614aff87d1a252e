//! `seatgate gateway` against real processes: redis-server, `seatgate run`
//! and one or two `seatgate gateway` processes over HTTPS with a test CA,
//! tokens issued with `seatgate token issue`, and JWTs from a test OpenID
//! Connect issuer with its own Ed25519 keys (docs/gateway.md).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use futures_util::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::acl::{AclRedis, ADMIN, ROOT, WORKER};
use crate::support::{
    free_port, license_keys, output, seatgate_cmd, stream_entries, RedisServer, RedisServerExt, Spawned,
    WorkerProcess, BIN,
};

const GATEWAY: &str = "seatgate-gateway";

/// A CA, and a certificate it signed for 127.0.0.1 and localhost, on disk.
struct TestCa {
    dir: tempfile::TempDir,
    ca_pem: String,
}

impl TestCa {
    fn new() -> TestCa {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "seatgate test CA");
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let ca = rcgen::CertifiedIssuer::self_signed(params, ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cert.pem"), leaf.pem()).unwrap();
        std::fs::write(dir.path().join("key.pem"), key.serialize_pem()).unwrap();
        TestCa {
            ca_pem: ca.pem(),
            dir,
        }
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        let path = |f: &str| self.dir.path().join(f).to_string_lossy().into_owned();
        vec![
            ("SEATGATE__GATEWAY__TLS_CERT_FILE", path("cert.pem")),
            ("SEATGATE__GATEWAY__TLS_KEY_FILE", path("key.pem")),
        ]
    }

    /// An HTTPS client trusting this CA only.
    fn client(&self) -> reqwest::Client {
        #[allow(deprecated)]
        let _ = rustls::crypto::ring::default_provider().install_default();
        reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(self.ca_pem.as_bytes()).unwrap()])
            .timeout(Duration::from_secs(20))
            .build()
            .unwrap()
    }
}

/// A `seatgate gateway` child process over HTTPS, killed on drop.
struct GatewayProcess {
    _child: Spawned,
    base: String,
    /// Its stderr (the log), on disk.
    log: tempfile::NamedTempFile,
}

impl GatewayProcess {
    /// Starts a gateway against `url` with `SEATGATE__*` variables `env`
    /// over `ca`'s certificate, and waits until `/live` answers.
    async fn start(url: &str, env: &[(&str, String)], ca: &TestCa) -> GatewayProcess {
        let port = free_port();
        let mut cmd = Command::new(BIN);
        cmd.arg("--redis")
            .arg(url)
            .arg("gateway")
            .env("SEATGATE__GATEWAY__LISTEN", format!("127.0.0.1:{port}"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null());
        for (k, v) in ca.env().iter().chain(env) {
            cmd.env(k, v);
        }
        let log = tempfile::NamedTempFile::new().unwrap();
        cmd.stderr(Stdio::from(log.reopen().unwrap()));
        let gateway = GatewayProcess {
            _child: Spawned(cmd.spawn().expect("start seatgate gateway")),
            base: format!("https://127.0.0.1:{port}"),
            log,
        };
        let http = ca.client();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(r) = http.get(format!("{}/live", gateway.base)).send().await {
                if r.status() == StatusCode::OK {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "the gateway did not come up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        gateway
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// What it logged so far.
    fn logged(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap()
    }
}

/// `seatgate token issue` with `args` (`--app`, `--user`, …): the token.
async fn issue(url: &str, env: &[(&str, String)], args: &[&str]) -> String {
    let mut all = vec!["token", "issue", "--actor", "test"];
    all.extend_from_slice(args);
    let mut cmd = seatgate_cmd(url, &all);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = output(cmd).await;
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

async fn seatgate(url: &str, env: &[(&str, String)], args: &[&str]) -> std::process::Output {
    let mut cmd = seatgate_cmd(url, args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    output(cmd).await
}

/// Asserts that the gateway's `/metrics` holds each of `lines`.
async fn has_series(http: &reqwest::Client, gw: &GatewayProcess, lines: &[&str]) {
    let metrics = http
        .get(gw.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in lines {
        assert!(metrics.contains(line), "no {line} in\n{metrics}");
    }
}

/// Status and JSON body of a response.
async fn answer(r: reqwest::Response) -> (StatusCode, Value) {
    let status = r.status();
    let body = r.text().await.unwrap();
    (status, serde_json::from_str(&body).unwrap_or(Value::String(body)))
}

/// What the next event of an SSE stream says: (id, event, data).
async fn next_event<S, B, E>(stream: &mut S, buf: &mut String) -> (String, String, Value)
where
    S: futures_util::Stream<Item = Result<B, E>> + Unpin,
    B: AsRef<[u8]>,
    E: std::fmt::Debug,
{
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let mut id = String::new();
            let mut event = String::new();
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = v.to_owned();
                } else if let Some(v) = line.strip_prefix("event: ") {
                    event = v.to_owned();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            if event.is_empty() {
                continue; // a keep-alive comment
            }
            return (id, event, serde_json::from_str(&data).unwrap());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let chunk = tokio::time::timeout(left, stream.next())
            .await
            .expect("an event within 15 s")
            .expect("the stream is open")
            .unwrap();
        buf.push_str(&String::from_utf8_lossy(chunk.as_ref()));
    }
}

/// A Redis, a worker and a test CA, for an application `cad` with a
/// requests stream of its own.
struct Deployment {
    redis: RedisServer,
    _worker: WorkerProcess,
    ca: TestCa,
    env: Vec<(&'static str, String)>,
}

impl Deployment {
    async fn start() -> Deployment {
        let redis = RedisServer::start_with(&[]).await;
        let env = vec![("SEATGATE__STREAM__APPLICATIONS", "cad".to_owned())];
        let worker = WorkerProcess::start(&redis.url(), &env).await;
        Deployment {
            redis,
            _worker: worker,
            ca: TestCa::new(),
            env,
        }
    }

    async fn license(&self, args: &[&str]) {
        let mut all = vec!["license", "put"];
        all.extend_from_slice(args);
        let out = seatgate(&self.redis.url(), &self.env, &all).await;
        assert!(out.status.success(), "{out:?}");
    }

    async fn token(&self, args: &[&str]) -> String {
        issue(&self.redis.url(), &self.env, args).await
    }

    async fn gateway(&self, more: &[(&'static str, String)]) -> GatewayProcess {
        let env: Vec<(&str, String)> = self.env.iter().chain(more).cloned().collect();
        GatewayProcess::start(&self.redis.url(), &env, &self.ca).await
    }

    async fn events(&self, license: &str) -> Vec<crate::support::Entry> {
        let settings = self.redis.settings();
        let mut con = crate::support::db(&settings).await;
        stream_entries(&mut con, &settings.events_stream_for(license)).await
    }
}

async fn acquire(
    http: &reqwest::Client,
    gw: &GatewayProcess,
    token: &str,
    license: &str,
    body: Value,
) -> (StatusCode, Value) {
    answer(
        http.post(gw.url(&format!("/v1/licenses/{license}/seats")))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .unwrap(),
    )
    .await
}

/// A heartbeat (POST) or release (DELETE) at `path` with `lease`.
async fn with_lease(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    token: &str,
    lease: &str,
) -> (StatusCode, Value) {
    let request = http
        .request(method, url)
        .bearer_auth(token)
        .header("Seatgate-Lease", lease);
    answer(request.send().await.unwrap()).await
}

async fn heartbeat(
    http: &reqwest::Client,
    gw: &GatewayProcess,
    token: &str,
    license: &str,
    session: &str,
    lease: &str,
) -> (StatusCode, Value) {
    let url = gw.url(&format!("/v1/licenses/{license}/seats/{session}/heartbeat"));
    with_lease(http, reqwest::Method::POST, url, token, lease).await
}

async fn release(
    http: &reqwest::Client,
    gw: &GatewayProcess,
    token: &str,
    license: &str,
    session: &str,
    lease: &str,
) -> (StatusCode, Value) {
    let url = gw.url(&format!("/v1/licenses/{license}/seats/{session}"));
    with_lease(http, reqwest::Method::DELETE, url, token, lease).await
}

async fn seats_used(http: &reqwest::Client, gw: &GatewayProcess, token: &str, license: &str) -> u64 {
    let (status, body) = answer(
        http.get(gw.url(&format!("/v1/licenses/{license}")))
            .bearer_auth(token)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["seats_used"].as_u64().unwrap()
}

/// The whole life of a seat over HTTPS, every process as its own user of
/// the shipped ACL file: the admin provisions and issues a token, the
/// worker serves, the gateway (seatgate-gateway) carries the desktop's
/// acquire, heartbeats and release. The seat is the token's application's
/// and user's, whatever the desktop could have said.
#[tokio::test(flavor = "multi_thread")]
async fn a_seat_over_https_from_acquire_to_release_each_process_as_its_own_acl_user() {
    let redis = AclRedis::start().await;
    let ca = TestCa::new();
    let _worker = WorkerProcess::start(&redis.url(), &redis.login(WORKER)).await;
    let put = redis
        .seatgate(ADMIN, &["license", "put", "gw", "--seats", "1"])
        .await;
    assert!(put.status.success(), "{put:?}");
    let token = issue(
        &redis.url(),
        &redis.login(ADMIN),
        &["--app", "demo", "--user", "ada"],
    )
    .await;
    assert!(token.starts_with("sgt_") && token.len() > 40, "{token}");
    // An application outside stream.applications gets no token.
    let refused = seatgate(
        &redis.url(),
        &redis.login(ADMIN),
        &["token", "issue", "--actor", "t", "--app", "nosuch"],
    )
    .await;
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("stream.applications"),
        "{refused:?}"
    );
    let gw = GatewayProcess::start(&redis.url(), &redis.login(GATEWAY), &ca).await;
    let http = ca.client();

    let (status, seat) = acquire(
        &http,
        &gw,
        &token,
        "gw",
        json!({"session": "ws-1", "meta": {"host": "ws-1.example"}}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{seat}");
    assert_eq!(seat["status"], "ACQUIRED");
    assert_eq!(seat["heartbeat_timeout_ms"], 90000);
    let lease = seat["lease"].as_str().unwrap().to_owned();
    let (status, beat) = heartbeat(&http, &gw, &token, "gw", "ws-1", &lease).await;
    assert_eq!(
        (status, beat["status"].as_str()),
        (StatusCode::OK, Some("HEARTBEAT_UPDATED")),
        "{beat}"
    );
    let (status, wrong) = heartbeat(
        &http,
        &gw,
        &token,
        "gw",
        "ws-1",
        "0123456789abcdef0123456789abcdef",
    )
    .await;
    assert_eq!(
        (status, wrong["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("LEASE_MISMATCH")),
        "{wrong}"
    );
    let none = http
        .post(gw.url("/v1/licenses/gw/seats/ws-1/heartbeat"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(none.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        none.headers()["content-type"].to_str().unwrap(),
        "application/problem+json"
    );
    assert_eq!(seats_used(&http, &gw, &token, "gw").await, 1);

    // Who holds it is the token's: demo's session, demo's ada.
    let settings = redis.settings();
    let mut root = redis.con_as(ROOT).await;
    let holders: Vec<String> = redis::cmd("ZRANGE")
        .arg(license_keys(&settings, "gw").holders)
        .arg(0)
        .arg(-1)
        .query_async(&mut root)
        .await
        .unwrap();
    assert_eq!(holders, ["demo/ws-1"]);
    let events = stream_entries(&mut root, &settings.events_stream_for("gw")).await;
    let acquired = events
        .iter()
        .find(|e| e.fields.get("type").map(String::as_str) == Some("acquired"))
        .unwrap();
    assert_eq!(acquired.fields["user"], "demo/ada");

    let (status, gone) = release(&http, &gw, &token, "gw", "ws-1", &lease).await;
    assert_eq!(
        (status, gone["status"].as_str()),
        (StatusCode::OK, Some("RELEASED")),
        "{gone}"
    );
    let (status, late) = heartbeat(&http, &gw, &token, "gw", "ws-1", &lease).await;
    assert_eq!(
        (status, late["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("SESSION_NOT_ACTIVE")),
        "{late}"
    );

    for bad in [None, Some("sgt_nosuchtoken"), Some("not-a-token")] {
        let mut req = http
            .post(gw.url("/v1/licenses/gw/seats"))
            .json(&json!({"session": "x"}));
        if let Some(b) = bad {
            req = req.bearer_auth(b);
        }
        let (status, p) = answer(req.send().await.unwrap()).await;
        assert_eq!(
            (status, p["code"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("UNAUTHENTICATED")),
            "{bad:?}: {p}"
        );
    }
    assert_eq!(seats_used(&http, &gw, &token, "gw").await, 0);
}

/// A wait through the gateway: QUEUED, then the `queued` event over SSE on
/// one gateway; the client goes away, the seat is freed and granted while
/// it is gone, and its reconnect to a second gateway with `Last-Event-ID`
/// hears the `granted` it missed. Another user of the same application
/// following that session hears nothing of it.
#[tokio::test(flavor = "multi_thread")]
async fn a_wait_granted_while_away_is_heard_on_a_second_gateway_with_last_event_id() {
    let d = Deployment::start().await;
    d.license(&["cad-pro", "--seats", "1"]).await;
    let ada = d.token(&["--app", "cad", "--user", "ada"]).await;
    let bob = d.token(&["--app", "cad", "--user", "bob"]).await;
    let gw1 = d.gateway(&[]).await;
    let gw2 = d.gateway(&[]).await;
    let http = d.ca.client();

    let (status, held) = acquire(&http, &gw1, &ada, "cad-pro", json!({"session": "a-1"})).await;
    assert_eq!(status, StatusCode::CREATED, "{held}");
    let (status, queued) = acquire(
        &http,
        &gw1,
        &bob,
        "cad-pro",
        json!({"session": "b-1", "wait_ms": 60000}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{queued}");
    assert_eq!(
        (queued["status"].as_str(), queued["position"].as_u64()),
        (Some("QUEUED"), Some(1))
    );
    let link = queued["events"].as_str().unwrap().to_owned();
    let bob_lease = queued["lease"].as_str().unwrap().to_owned();

    let first = http.get(gw1.url(&link)).bearer_auth(&bob).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert!(first.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let mut stream = first.bytes_stream();
    let mut buf = String::new();
    let (queued_id, kind, data) = next_event(&mut stream, &mut buf).await;
    assert_eq!(
        (kind.as_str(), data["session"].as_str(), data["user"].as_str()),
        ("queued", Some("b-1"), Some("cad/bob")),
        "{data}"
    );
    drop(stream);

    // Granted while bob is away.
    let (status, freed) = release(
        &http,
        &gw2,
        &ada,
        "cad-pro",
        "a-1",
        held["lease"].as_str().unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{freed}");

    let again = http
        .get(gw2.url("/v1/licenses/cad-pro/seats/b-1/events"))
        .bearer_auth(&bob)
        .header("Last-Event-ID", &queued_id)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    let mut stream = again.bytes_stream();
    let mut buf = String::new();
    let (granted_id, kind, data) = next_event(&mut stream, &mut buf).await;
    assert_eq!(
        (kind.as_str(), data["session"].as_str()),
        ("granted", Some("b-1")),
        "{data}"
    );
    assert!(granted_id > queued_id, "{granted_id} after {queued_id}");
    let (status, beat) = heartbeat(&http, &gw2, &bob, "cad-pro", "b-1", &bob_lease).await;
    assert_eq!(status, StatusCode::OK, "{beat}");
    println!(
        "queued as {queued_id} on gateway 1, granted as {granted_id} heard on gateway 2 after a reconnect"
    );

    // ada follows bob's session from the start: nothing of bob's reaches her.
    let peek = http
        .get(gw1.url("/v1/licenses/cad-pro/seats/b-1/events?after=0-0"))
        .bearer_auth(&ada)
        .send()
        .await
        .unwrap();
    let mut stream = peek.bytes_stream();
    let got = tokio::time::timeout(Duration::from_secs(1), stream.next()).await;
    assert!(got.is_err(), "ada heard of bob's session: {got:?}");
}

/// `seatgate token revoke`: both gateways refuse the token within a second
/// (gateway.token_cache_ms is 500).
#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_token_is_refused_within_a_second_on_both_gateways() {
    let d = Deployment::start().await;
    d.license(&["cad-pro", "--seats", "2"]).await;
    let token = d
        .token(&["--app", "cad", "--user", "ada", "--note", "laptop"])
        .await;
    let gw1 = d.gateway(&[]).await;
    let gw2 = d.gateway(&[]).await;
    let http = d.ca.client();
    for gw in [&gw1, &gw2] {
        assert_eq!(seats_used(&http, gw, &token, "cad-pro").await, 0);
    }
    let list = seatgate(&d.redis.url(), &d.env, &["token", "list", "--json"]).await;
    let line = String::from_utf8(list.stdout).unwrap();
    let record: Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(
        (
            record["app"].as_str(),
            record["user"].as_str(),
            record["note"].as_str()
        ),
        (Some("cad"), Some("ada"), Some("laptop"))
    );
    assert!(!line.contains(&token), "token list never shows a token");
    let id = record["id"].as_str().unwrap();
    let revoked = Instant::now();
    let out = seatgate(&d.redis.url(), &d.env, &["token", "revoke", id]).await;
    assert!(out.status.success(), "{out:?}");
    let mut refused_after = Vec::new();
    for gw in [&gw1, &gw2] {
        loop {
            let r = http
                .get(gw.url("/v1/licenses/cad-pro"))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap();
            if r.status() == StatusCode::UNAUTHORIZED {
                refused_after.push(revoked.elapsed());
                break;
            }
            assert!(
                revoked.elapsed() < Duration::from_secs(1),
                "still served {:?} after the revoke",
                revoked.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    println!("refused by gateway 1 and 2 after {refused_after:?}");
    let again = seatgate(&d.redis.url(), &d.env, &["token", "revoke", id]).await;
    assert_eq!(again.status.code(), Some(1), "revoking twice: {again:?}");
}

/// A test OpenID Connect issuer: its own Ed25519 key, its JWKS on disk.
struct Issuer {
    _dir: tempfile::TempDir,
    key: jsonwebtoken::EncodingKey,
    kid: String,
    jwks_file: String,
    /// The JWKS document it publishes.
    jwks: Value,
}

impl Issuer {
    fn new() -> Issuer {
        let dir = tempfile::tempdir().unwrap();
        let pem = seatgate_gateway::borrow::generate_key_pem().unwrap();
        let key_file = dir.path().join("issuer.pem");
        std::fs::write(&key_file, &pem).unwrap();
        // The JWKS an issuer publishes: the public key, by its thumbprint.
        let signer =
            seatgate_gateway::borrow::BorrowSigner::load(&seatgate_gateway::config::BorrowSettings {
                signing_key_file: key_file.to_string_lossy().into_owned(),
                previous_key_files: vec![],
                issuer: "unused".into(),
            })
            .unwrap()
            .unwrap();
        let jwks = signer.jwks().clone();
        let kid = jwks["keys"][0]["kid"].as_str().unwrap().to_owned();
        let jwks_file = dir.path().join("jwks.json");
        std::fs::write(&jwks_file, jwks.to_string()).unwrap();
        Issuer {
            key: jsonwebtoken::EncodingKey::from_ed_pem(pem.as_bytes()).unwrap(),
            kid,
            jwks_file: jwks_file.to_string_lossy().into_owned(),
            jwks,
            _dir: dir,
        }
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("SEATGATE__GATEWAY__OIDC__ISSUER", "https://id.test".to_owned()),
            ("SEATGATE__GATEWAY__OIDC__AUDIENCE", "seatgate".to_owned()),
            ("SEATGATE__GATEWAY__OIDC__JWKS_FILE", self.jwks_file.clone()),
            ("SEATGATE__GATEWAY__OIDC__APPLICATION", "cad".to_owned()),
            ("SEATGATE__GATEWAY__OIDC__GROUP_CLAIM", "groups".to_owned()),
        ]
    }

    fn sign(&self, claims: &Value) -> String {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.key).unwrap()
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// JWT access tokens: a valid one takes a seat as its `sub` and `groups`;
/// an expired, wrong-audience, wrong-issuer, not-yet-valid, tampered or
/// foreign-signed one is 401 and changes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn jwts_that_fail_any_check_are_401_and_change_nothing() {
    let d = Deployment::start().await;
    d.license(&["cad-pro", "--seats", "5"]).await;
    let issuer = Issuer::new();
    let gw = d.gateway(&issuer.env()).await;
    let http = d.ca.client();
    let now = unix_now();
    let claims = |f: &dyn Fn(&mut Value)| {
        let mut c = json!({"iss": "https://id.test", "aud": "seatgate", "sub": "carol", "exp": now + 600, "nbf": now - 10, "iat": now - 10, "groups": ["eng", "ops"]});
        f(&mut c);
        c
    };
    let valid = issuer.sign(&claims(&|_| {}));
    let (status, seat) = acquire(&http, &gw, &valid, "cad-pro", json!({"session": "j-1"})).await;
    assert_eq!(status, StatusCode::CREATED, "{seat}");
    let acquired: Vec<_> = d.events("cad-pro").await;
    let event = acquired.last().unwrap();
    assert_eq!(
        (event.fields["user"].as_str(), event.fields["group"].as_str()),
        ("cad/carol", "cad/eng")
    );
    let events_before = acquired.len();

    let mut tampered: Vec<String> = valid.split('.').map(str::to_owned).collect();
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let payload = String::from_utf8(b64.decode(&tampered[1]).unwrap())
        .unwrap()
        .replace("carol", "carom");
    tampered[1] = b64.encode(payload);
    let foreign = Issuer::new();
    let refused = [
        ("expired", issuer.sign(&claims(&|c| c["exp"] = json!(now - 120)))),
        (
            "wrong audience",
            issuer.sign(&claims(&|c| c["aud"] = json!("someone-else"))),
        ),
        (
            "wrong issuer",
            issuer.sign(&claims(&|c| c["iss"] = json!("https://evil.test"))),
        ),
        (
            "not yet valid",
            issuer.sign(&claims(&|c| c["nbf"] = json!(now + 300))),
        ),
        ("tampered", tampered.join(".")),
        ("signed by another key", foreign.sign(&claims(&|_| {}))),
        (
            "no user claim",
            issuer.sign(&claims(&|c| {
                c.as_object_mut().unwrap().remove("sub");
            })),
        ),
    ];
    for (what, jwt) in &refused {
        let (status, p) = acquire(&http, &gw, jwt, "cad-pro", json!({"session": "j-2"})).await;
        println!("{what}: {status} {}", p["detail"]);
        assert_eq!(
            (status, p["code"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("UNAUTHENTICATED")),
            "{what}: {p}"
        );
    }
    assert_eq!(
        seats_used(&http, &gw, &valid, "cad-pro").await,
        1,
        "only the valid JWT took a seat"
    );
    assert_eq!(
        d.events("cad-pro").await.len(),
        events_before,
        "the refused ones made no event"
    );
    has_series(
        &http,
        &gw,
        &[
            "seatgate_gateway_auth_failures_total{reason=\"invalid_jwt\"} 6",
            "seatgate_gateway_auth_failures_total{reason=\"bad_claims\"} 1",
        ],
    )
    .await;
}

/// The user and group are the credential's: a body naming others is 403
/// and nothing changes; naming its own is fine.
#[tokio::test(flavor = "multi_thread")]
async fn a_body_naming_another_user_or_group_is_refused_and_changes_nothing() {
    let d = Deployment::start().await;
    d.license(&["cad-pro", "--seats", "3", "--max-per-user", "1"])
        .await;
    let ada = d
        .token(&["--app", "cad", "--user", "ada", "--group", "eng"])
        .await;
    let gw = d.gateway(&[]).await;
    let http = d.ca.client();
    for body in [
        json!({"session": "x-1", "user": "bob"}),
        json!({"session": "x-2", "group": "ops"}),
        json!({"session": "x-3", "user": "cad/bob"}),
    ] {
        let (status, p) = acquire(&http, &gw, &ada, "cad-pro", body.clone()).await;
        assert_eq!(
            (status, p["code"].as_str()),
            (StatusCode::FORBIDDEN, Some("FORBIDDEN")),
            "{body}: {p}"
        );
    }
    assert_eq!(seats_used(&http, &gw, &ada, "cad-pro").await, 0);
    // The license's only event is its creation's (the admin trail).
    let events = d.events("cad-pro").await;
    assert!(
        events.iter().all(|e| e.fields["type"] == "license_put"),
        "nothing reached a worker: {:?}",
        events.iter().map(|e| &e.fields["type"]).collect::<Vec<_>>()
    );
    let (status, seat) = acquire(
        &http,
        &gw,
        &ada,
        "cad-pro",
        json!({"session": "x-4", "user": "ada", "group": "eng"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{seat}");
    // max_per_user counts ada's seats, whatever session the desktop names.
    let (status, p) = acquire(&http, &gw, &ada, "cad-pro", json!({"session": "x-5"})).await;
    assert_eq!(
        (status, p["code"].as_str()),
        (StatusCode::CONFLICT, Some("LIMIT_REACHED")),
        "{p}"
    );
}

/// Past its rate a credential is answered 429 with Retry-After, and another
/// credential is served meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn past_its_rate_a_credential_gets_429_and_another_does_not() {
    let d = Deployment::start().await;
    d.license(&["cad-pro", "--seats", "3"]).await;
    let ada = d.token(&["--app", "cad", "--user", "ada"]).await;
    let bob = d.token(&["--app", "cad", "--user", "bob"]).await;
    let gw = d
        .gateway(&[
            ("SEATGATE__GATEWAY__RATE_PER_SECOND", "1".to_owned()),
            ("SEATGATE__GATEWAY__RATE_BURST", "3".to_owned()),
        ])
        .await;
    let http = d.ca.client();
    let mut codes = Vec::new();
    let mut retry_after = None;
    for _ in 0..5 {
        let r = http
            .get(gw.url("/v1/licenses/cad-pro"))
            .bearer_auth(&ada)
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            retry_after = r
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned());
        }
        codes.push(r.status().as_u16());
    }
    println!("ada's 5 requests at once: {codes:?}, Retry-After {retry_after:?}");
    assert_eq!(&codes[..3], [200, 200, 200], "the burst");
    assert!(codes[3..].iter().all(|&c| c == 429), "{codes:?}");
    assert!(retry_after.is_some_and(|s| s.parse::<u64>().is_ok_and(|s| s >= 1)));
    assert_eq!(seats_used(&http, &gw, &bob, "cad-pro").await, 0, "bob is served");
    let (status, p) = acquire(&http, &gw, &ada, "cad-pro", json!({"session": "r-1"})).await;
    assert_eq!(
        (status, p["code"].as_str()),
        (StatusCode::TOO_MANY_REQUESTS, Some("RATE_LIMITED"))
    );
    assert_eq!(
        seats_used(&http, &gw, &bob, "cad-pro").await,
        0,
        "the refused acquire took nothing"
    );
}

/// A borrow through the gateway comes with a JWS naming the license, user,
/// hardware id and session, with `exp` the borrow's end; the keys of
/// `/.well-known/jwks.json` verify it, and not once a byte is changed.
#[tokio::test(flavor = "multi_thread")]
async fn a_borrowed_seat_comes_with_a_token_the_published_keys_verify() {
    let d = Deployment::start().await;
    d.license(&["cad-pro", "--seats", "2", "--max-borrow", "7d"])
        .await;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("borrow.pem");
    let out = seatgate(
        &d.redis.url(),
        &d.env,
        &["gateway", "keygen", "--out", key.to_str().unwrap()],
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let ada = d.token(&["--app", "cad", "--user", "ada"]).await;
    let gw = d
        .gateway(&[(
            "SEATGATE__GATEWAY__BORROW__SIGNING_KEY_FILE",
            key.to_string_lossy().into_owned(),
        )])
        .await;
    let http = d.ca.client();
    let (status, seat) = acquire(
        &http,
        &gw,
        &ada,
        "cad-pro",
        json!({"session": "lap-1", "borrow_ms": 3_600_000, "hardware_id": "hw-7f3a"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{seat}");
    let token = seat["borrow_token"].as_str().unwrap();
    let until = seat["borrowed_until_ms"].as_u64().unwrap();
    let jwks: jsonwebtoken::jwk::JwkSet = http
        .get(gw.url("/.well-known/jwks.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let header = jsonwebtoken::decode_header(token).unwrap();
    let jwk = jwks.find(header.kid.as_deref().unwrap()).unwrap();
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::EdDSA);
    validation.set_issuer(&["seatgate"]);
    let key = jsonwebtoken::DecodingKey::from_jwk(jwk).unwrap();
    let claims = jsonwebtoken::decode::<Value>(token, &key, &validation)
        .unwrap()
        .claims;
    assert_eq!(
        (
            claims["license"].as_str(),
            claims["sub"].as_str(),
            claims["hardware_id"].as_str(),
            claims["session"].as_str()
        ),
        (Some("cad-pro"), Some("ada"), Some("hw-7f3a"), Some("lap-1"))
    );
    assert_eq!(claims["exp"].as_u64(), Some(until / 1000));
    let mut bytes = token.as_bytes().to_vec();
    let at = token.find('.').unwrap() + 5;
    bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
    let changed = String::from_utf8(bytes).unwrap();
    assert!(
        jsonwebtoken::decode::<Value>(&changed, &key, &validation).is_err(),
        "a changed token verified"
    );
    // A gateway without a signing key refuses a borrow rather than hand out an unsigned one.
    let plain = d.gateway(&[]).await;
    let (status, p) = acquire(
        &http,
        &plain,
        &ada,
        "cad-pro",
        json!({"session": "lap-2", "borrow_ms": 60000}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{p}");
    assert_eq!(seats_used(&http, &plain, &ada, "cad-pro").await, 1);
}

/// docs/openapi.json is the document the gateway serves and
/// `seatgate gateway openapi` prints: regenerate it with that command.
#[tokio::test(flavor = "multi_thread")]
async fn the_committed_openapi_document_is_what_the_gateway_serves() {
    let d = Deployment::start().await;
    let gw = d.gateway(&[]).await;
    let http = d.ca.client();
    let served = http
        .get(gw.url("/openapi.json"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let printed = seatgate(&d.redis.url(), &d.env, &["gateway", "openapi"]).await;
    assert_eq!(String::from_utf8(printed.stdout).unwrap(), served);
    let committed = std::fs::read_to_string(crate::support::repo_file("docs/openapi.json")).unwrap();
    assert!(
        committed == served,
        "docs/openapi.json is not what the gateway serves: run `seatgate gateway openapi > docs/openapi.json`"
    );
    let doc: Value = serde_json::from_str(&served).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    for path in [
        "/v1/licenses/{license}/seats",
        "/v1/licenses/{license}/seats/{session}/heartbeat",
        "/v1/licenses/{license}/seats/{session}/events",
    ] {
        assert!(doc["paths"][path].is_object(), "{path}");
    }
}

/// The Python the gateway's generated-client test runs: $SEATGATE_TEST_GATEWAY_PYTHON,
/// else the venv ops/ensure-python.sh makes (target/python-gateway), with
/// openapi-python-client and PyJWT from PyPI.
fn gateway_python() -> std::path::PathBuf {
    match std::env::var_os("SEATGATE_TEST_GATEWAY_PYTHON") {
        Some(p) => p.into(),
        None => crate::support::repo_file("target/python-gateway/bin/python"),
    }
}

/// A client generated from the committed docs/openapi.json by a standard
/// generator (openapi-python-client), run here, drives acquire, a wait
/// granted by a release, heartbeats and releases, unchanged; the borrow
/// token it gets verifies with PyJWT and the published keys, and fails
/// verification once one byte is changed (tests/it/python/gateway_generated.py).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Python with openapi-python-client and PyJWT: bash ops/test.sh makes target/python-gateway and runs it"]
async fn a_client_generated_from_the_committed_openapi_document_drives_a_wait_and_checks_a_borrow() {
    let python = gateway_python();
    assert!(
        python.exists(),
        "{} is missing: run `bash ops/test.sh` (ops/ensure-python.sh makes it)",
        python.display()
    );
    let d = Deployment::start().await;
    d.license(&["py-one", "--seats", "1"]).await;
    d.license(&["py-borrow", "--seats", "2", "--max-borrow", "1d"])
        .await;
    let ada = d.token(&["--app", "cad", "--user", "ada"]).await;
    let bob = d.token(&["--app", "cad", "--user", "bob"]).await;
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("borrow.pem");
    let out = seatgate(
        &d.redis.url(),
        &d.env,
        &["gateway", "keygen", "--out", key.to_str().unwrap()],
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let gw = d
        .gateway(&[(
            "SEATGATE__GATEWAY__BORROW__SIGNING_KEY_FILE",
            key.to_string_lossy().into_owned(),
        )])
        .await;
    let work = tempfile::tempdir().unwrap();
    let generator = python.with_file_name("openapi-python-client");
    let generated = output({
        let mut cmd = Command::new(&generator);
        cmd.arg("generate")
            .arg("--path")
            .arg(crate::support::repo_file("docs/openapi.json"))
            .arg("--output-path")
            .arg(work.path().join("client"))
            .current_dir(work.path());
        cmd
    })
    .await;
    assert!(generated.status.success(), "{generated:?}");
    let warnings = String::from_utf8_lossy(&generated.stdout);
    assert!(
        !warnings.contains("will not be generated"),
        "every endpoint is generated:\n{warnings}"
    );
    let ca = d.ca.dir.path().join("ca.pem");
    std::fs::write(&ca, &d.ca.ca_pem).unwrap();
    let run = output({
        let mut cmd = Command::new(&python);
        cmd.arg(crate::support::repo_file(
            "crates/seatgate/tests/it/python/gateway_generated.py",
        ))
        .env("SEATGATE_CLIENT_DIR", work.path().join("client"))
        .env("SEATGATE_GATEWAY", &gw.base)
        .env("SEATGATE_CA", &ca)
        .env("SEATGATE_ADA", &ada)
        .env("SEATGATE_BOB", &bob)
        .env("SEATGATE_LICENSE", "py-one")
        .env("SEATGATE_BORROW_LICENSE", "py-borrow");
        cmd
    })
    .await;
    let printed = String::from_utf8_lossy(&run.stdout);
    println!("{printed}");
    assert!(
        run.status.success() && printed.trim_end().ends_with("OK"),
        "{run:?}"
    );
}

/// An acquire sent again with its Idempotency-Key, on another gateway,
/// gets the same session, lease and seat (ALREADY_ACTIVE), not a second
/// one; another key is another seat.
#[tokio::test(flavor = "multi_thread")]
async fn an_acquire_sent_again_with_its_idempotency_key_on_another_gateway_gets_the_same_seat() {
    let d = Deployment::start().await;
    d.license(&["cad-pro", "--seats", "3"]).await;
    let ada = d.token(&["--app", "cad", "--user", "ada"]).await;
    let gw1 = d.gateway(&[]).await;
    let gw2 = d.gateway(&[]).await;
    let http = d.ca.client();
    let send = |gw: &GatewayProcess, key: &str| {
        http.post(gw.url("/v1/licenses/cad-pro/seats"))
            .bearer_auth(&ada)
            .header("Idempotency-Key", key)
            .json(&json!({}))
            .send()
    };
    let (status, first) = answer(send(&gw1, "k-1").await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let (status, again) = answer(send(&gw2, "k-1").await.unwrap()).await;
    assert_eq!(
        (status, again["status"].as_str()),
        (StatusCode::OK, Some("ALREADY_ACTIVE")),
        "{again}"
    );
    assert_eq!(
        (&again["session"], &again["lease"]),
        (&first["session"], &first["lease"])
    );
    assert_eq!(
        seats_used(&http, &gw1, &ada, "cad-pro").await,
        1,
        "one seat for one key"
    );
    let (status, other) = answer(send(&gw2, "k-2").await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED, "{other}");
    assert_ne!(other["session"], first["session"]);
    assert_eq!(seats_used(&http, &gw1, &ada, "cad-pro").await, 2);
    // Another user's same key is another seat: keys are per credential.
    let bob = d.token(&["--app", "cad", "--user", "bob"]).await;
    let (status, theirs) = answer(
        http.post(gw1.url("/v1/licenses/cad-pro/seats"))
            .bearer_auth(&bob)
            .header("Idempotency-Key", "k-1")
            .json(&json!({}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{theirs}");
    assert_ne!(theirs["lease"], first["lease"]);
}

/// The edges: a Host it does not answer is 421, a body past
/// gateway.max_body_bytes 413; /ready turns 503 while Redis is frozen
/// (SIGSTOP) and 200 once it runs again; and no token, JWT or lease is in
/// its log after a seat's whole life.
#[tokio::test(flavor = "multi_thread")]
async fn the_gateway_refuses_foreign_hosts_and_large_bodies_sees_a_frozen_redis_and_logs_no_secret() {
    let d = Deployment::start().await;
    d.license(&["cad-pro", "--seats", "1"]).await;
    let ada = d.token(&["--app", "cad", "--user", "ada"]).await;
    let gw = d.gateway(&[]).await;
    let http = d.ca.client();
    let (status, p) = answer(
        http.get(gw.url("/v1/licenses/cad-pro"))
            .bearer_auth(&ada)
            .header("Host", "evil.example")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, p["code"].as_str()),
        (StatusCode::MISDIRECTED_REQUEST, Some("MISDIRECTED")),
        "{p}"
    );
    let big = json!({"session": "big", "meta": {"pad": "x".repeat(20_000)}});
    let r = http
        .post(gw.url("/v1/licenses/cad-pro/seats"))
        .bearer_auth(&ada)
        .json(&big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);

    let (status, seat) = acquire(&http, &gw, &ada, "cad-pro", json!({"session": "ws-1"})).await;
    assert_eq!(status, StatusCode::CREATED, "{seat}");
    let lease = seat["lease"].as_str().unwrap().to_owned();
    heartbeat(&http, &gw, &ada, "cad-pro", "ws-1", &lease).await;
    release(&http, &gw, &ada, "cad-pro", "ws-1", &lease).await;
    acquire(&http, &gw, "sgt_wrong", "cad-pro", json!({})).await;

    let ready = |gw: &GatewayProcess| http.get(gw.url("/ready")).send();
    assert_eq!(ready(&gw).await.unwrap().status(), StatusCode::OK);
    let pid = d.redis.pid().to_string();
    let kill = |sig: &str| Command::new("kill").arg(sig).arg(&pid).status().unwrap();
    assert!(kill("-STOP").success());
    let frozen = ready(&gw).await.unwrap();
    let (status, why) = (frozen.status(), frozen.text().await.unwrap());
    assert!(kill("-CONT").success());
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{why}");
    assert!(why.contains("Redis"), "{why}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while ready(&gw).await.unwrap().status() != StatusCode::OK {
        assert!(Instant::now() < deadline, "not ready again after Redis went on");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let log = gw.logged();
    assert!(log.contains("gateway listening"), "the log was read: {log}");
    for secret in [ada.as_str(), lease.as_str(), "sgt_wrong"] {
        assert!(!log.contains(secret), "the log holds a secret: {log}");
    }
}

/// An issuer's keys from its JWKS URL (a real HTTP server: axum, in the
/// test): fetched at start, and after the issuer adds a new key
/// (a rotation), a token signed with it is accepted once the gateway has
/// fetched again (`jwks_refresh_s` = 1), without a restart.
#[tokio::test(flavor = "multi_thread")]
async fn an_issuers_jwks_url_is_fetched_and_a_rotated_key_is_followed() {
    let d = Deployment::start().await;
    d.license(&["cad-pro", "--seats", "5"]).await;
    let old = Issuer::new();
    let served = tempfile::tempdir().unwrap();
    let jwks = served.path().join("jwks.json");
    std::fs::write(&jwks, old.jwks.to_string()).unwrap();
    // The issuer's web server: axum on a free loopback port, serving the
    // file as it is at each request.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
    let file = jwks.clone();
    let app = axum::Router::new().route(
        "/jwks.json",
        axum::routing::get(move || {
            let file = file.clone();
            async move { std::fs::read_to_string(file).unwrap() }
        }),
    );
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let mut env: Vec<(&'static str, String)> = old
        .env()
        .into_iter()
        .filter(|(k, _)| *k != "SEATGATE__GATEWAY__OIDC__JWKS_FILE")
        .collect();
    env.push(("SEATGATE__GATEWAY__OIDC__JWKS_URL", url));
    env.push(("SEATGATE__GATEWAY__OIDC__JWKS_REFRESH_S", "1".to_owned()));
    let gw = d.gateway(&env).await;
    let http = d.ca.client();
    let now = unix_now();
    let claims = json!({"iss": "https://id.test", "aud": "seatgate", "sub": "carol", "exp": now + 600});
    let (status, seat) = acquire(
        &http,
        &gw,
        &old.sign(&claims),
        "cad-pro",
        json!({"session": "u-1"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{seat}");
    // The issuer rotates: a new key beside the old in its JWKS.
    let new = Issuer::new();
    let (status, p) = acquire(
        &http,
        &gw,
        &new.sign(&claims),
        "cad-pro",
        json!({"session": "u-2"}),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a key the issuer does not publish yet: {p}"
    );
    let both = json!({"keys": [old.jwks["keys"][0], new.jwks["keys"][0]]});
    std::fs::write(&jwks, both.to_string()).unwrap();
    let rotated = Instant::now();
    let deadline = rotated + Duration::from_secs(15);
    loop {
        let (status, seat) = acquire(
            &http,
            &gw,
            &new.sign(&claims),
            "cad-pro",
            json!({"session": "u-2"}),
        )
        .await;
        if status == StatusCode::CREATED {
            break;
        }
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{seat}");
        assert!(Instant::now() < deadline, "the new key was not taken up");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "a token of the rotated-in key accepted {:?} after the JWKS changed",
        rotated.elapsed()
    );
    let (status, seat) = acquire(
        &http,
        &gw,
        &old.sign(&claims),
        "cad-pro",
        json!({"session": "u-3"}),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the old key still works while published: {seat}"
    );
    server.abort();
}

/// What a client that misbehaves meets: a request head sent slowly is cut
/// off at gateway.header_read_timeout_ms, and so is a kept-alive connection
/// left idle; an address that keeps failing to authenticate is answered 429
/// even with a valid token, and another credential's request from a fresh
/// gateway is not; CORS headers go to allow-listed origins only.
#[tokio::test(flavor = "multi_thread")]
async fn slow_heads_failing_addresses_and_foreign_origins_are_refused() {
    use std::io::{Read, Write};
    let d = Deployment::start().await;
    d.license(&["cad-pro", "--seats", "1"]).await;
    let ada = d.token(&["--app", "cad", "--user", "ada"]).await;
    let gw = d
        .gateway(&[
            ("SEATGATE__GATEWAY__HEADER_READ_TIMEOUT_MS", "1000".to_owned()),
            ("SEATGATE__GATEWAY__AUTH_FAILURES_PER_MINUTE", "5".to_owned()),
            (
                "SEATGATE__GATEWAY__CORS_ALLOWED_ORIGINS",
                "https://app.example".to_owned(),
            ),
        ])
        .await;
    let http = d.ca.client();

    // A head that never ends: closed after about a second (TLS first, as a
    // client would; the handshake is not the head).
    let addr = gw.base.trim_start_matches("https://").to_owned();
    let closes = |partial: &'static [u8]| {
        let addr = addr.clone();
        let ca = d.ca.ca_pem.clone();
        tokio::task::spawn_blocking(move || {
            let mut roots = rustls::RootCertStore::empty();
            use rustls::pki_types::pem::PemObject;
            for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca.as_bytes()) {
                roots.add(cert.unwrap()).unwrap();
            }
            let config = rustls::ClientConfig::builder()
                .with_root_certificates(roots)
                .with_no_client_auth();
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
            let mut conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
            let mut tcp = std::net::TcpStream::connect(&addr).unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut tls = rustls::Stream::new(&mut conn, &mut tcp);
            tls.write_all(partial).unwrap();
            tls.flush().unwrap();
            let started = Instant::now();
            let mut buf = Vec::new();
            let _ = tls.read_to_end(&mut buf);
            (started.elapsed(), String::from_utf8_lossy(&buf).into_owned())
        })
    };
    let (slow, _) = closes(b"GET /live HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    assert!(
        slow < Duration::from_secs(5),
        "a slow head held its connection {slow:?}"
    );
    let (idle, answered) = closes(b"GET /live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    assert!(
        answered.contains("200 OK") && answered.contains("live"),
        "{answered}"
    );
    assert!(
        idle < Duration::from_secs(5),
        "an idle kept-alive connection was held {idle:?}"
    );
    println!("a slow head was cut off after {slow:?}, an idle kept-alive connection after {idle:?}");

    // CORS: the allow-listed origin gets its headers, another none (and its preflight 403).
    let preflight = |origin: &str| {
        http.request(reqwest::Method::OPTIONS, gw.url("/v1/licenses/cad-pro/seats"))
            .header("Origin", origin)
            .header("Access-Control-Request-Method", "POST")
            .send()
    };
    let ok = preflight("https://app.example").await.unwrap();
    assert_eq!(ok.status(), StatusCode::NO_CONTENT);
    assert_eq!(ok.headers()["access-control-allow-origin"], "https://app.example");
    let other = preflight("https://evil.example").await.unwrap();
    assert_eq!(other.status(), StatusCode::FORBIDDEN);
    assert!(other.headers().get("access-control-allow-origin").is_none());
    let plain = http
        .get(gw.url("/v1/licenses/cad-pro"))
        .bearer_auth(&ada)
        .header("Origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), StatusCode::OK);
    assert!(
        plain.headers().get("access-control-allow-origin").is_none(),
        "no CORS header for another origin"
    );

    // Five failures from this address, then 429 for anything, a valid token too.
    for _ in 0..5 {
        let r = http
            .get(gw.url("/v1/licenses/cad-pro"))
            .bearer_auth("sgt_guess")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    }
    let (status, p) = answer(
        http.get(gw.url("/v1/licenses/cad-pro"))
            .bearer_auth(&ada)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, p["code"].as_str()),
        (StatusCode::TOO_MANY_REQUESTS, Some("RATE_LIMITED")),
        "{p}"
    );
    has_series(
        &http,
        &gw,
        &[
            "seatgate_gateway_rate_limited_total{limit=\"auth_failures\"} 1",
            "seatgate_gateway_auth_failures_total{reason=\"unknown_token\"} 5",
        ],
    )
    .await;
}

/// A renewed certificate (here: one of another CA) is served after SIGHUP,
/// to new connections, without a restart.
#[tokio::test(flavor = "multi_thread")]
async fn sighup_reloads_the_certificate() {
    let d = Deployment::start().await;
    let gw = d.gateway(&[]).await;
    let old = d.ca.client();
    assert_eq!(
        old.get(gw.url("/live")).send().await.unwrap().status(),
        StatusCode::OK
    );
    let renewed = TestCa::new();
    for f in ["cert.pem", "key.pem"] {
        std::fs::copy(renewed.dir.path().join(f), d.ca.dir.path().join(f)).unwrap();
    }
    let pid = gw._child.0.id().to_string();
    assert!(Command::new("kill")
        .arg("-HUP")
        .arg(&pid)
        .status()
        .unwrap()
        .success());
    let new = renewed.client();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !new
        .get(gw.url("/live"))
        .send()
        .await
        .is_ok_and(|r| r.status() == StatusCode::OK)
    {
        assert!(
            Instant::now() < deadline,
            "the renewed certificate was not served: {}",
            gw.logged()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A fresh client trusting only the old CA now fails the handshake.
    let fresh_old = d.ca.client();
    assert!(
        fresh_old.get(gw.url("/live")).send().await.is_err(),
        "still the old certificate"
    );
    assert!(gw.logged().contains("certificate reloaded"), "{}", gw.logged());
}
