//! TLS (rediss://) against real TLS-only redis-servers with a throwaway CA
//! made by the harness: the worker, the CLI client, provisioning and `status`
//! as processes; a server that requires client certificates; an ACL user
//! logging in over TLS; a cluster; and the one-line errors of settings that
//! do not match the server.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use seatgate::config::Settings;
use seatgate_client::Call;
use seatgate_core::db::Db;
use seatgate_core::status::Status;
use seatgate_testkit::{ClientAuth, LocalCluster};
use secrecy::SecretString;

use crate::support::{
    client, db, holders, output, spawn_worker, RedisServer, RedisServerExt, WorkerProcess, BIN, T,
};

/// Runs the `seatgate` binary with `env` (and no `--redis`, so the URL comes
/// from `SEATGATE__REDIS__URL` like in a deployment); also how long it took.
async fn seatgate(env: &[(&str, String)], args: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("RUST_LOG", "warn");
    let out = output(cmd).await;
    (out, started.elapsed())
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The one line a failed command printed, checked to be one line and exit 3.
fn one_error_line(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).trim().to_owned();
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("seatgate: error: "), "{err}");
    err
}

/// `SEATGATE__REDIS__URL` plus the CA of `redis`, without a client certificate.
fn ca_only(redis: &RedisServer) -> Vec<(&'static str, String)> {
    let tls = redis.tls().expect("a TLS server");
    vec![
        ("SEATGATE__REDIS__URL", redis.url()),
        (
            "SEATGATE__REDIS__TLS_CA_FILE",
            tls.ca_cert().display().to_string(),
        ),
    ]
}

/// `SEATGATE__REDIS__URL` plus the CA and the client certificate of `redis`.
fn with_client_cert(redis: &RedisServer) -> Vec<(&'static str, String)> {
    let mut env = vec![("SEATGATE__REDIS__URL", redis.url())];
    env.extend(redis.tls().expect("a TLS server").env());
    env
}

async fn acquire_release(env: &[(&str, String)], license: &str, session: &str) {
    let args = ["--license", license, "--session", session];
    let (o, _) = seatgate(env, &[&["acquire"][..], &args].concat()).await;
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(stdout(&o).starts_with("ACQUIRED"), "{}", stdout(&o));
    // The seat is bound to the lease the acquire printed.
    let lease = crate::support::printed_lease(&stdout(&o));
    let (o, _) = seatgate(env, &[&["release"][..], &args, &["--lease", &lease]].concat()).await;
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(stdout(&o).starts_with("RELEASED"), "{}", stdout(&o));
}

/// The deployment case: a private CA, server certificates only. Every
/// process (provisioning, `seatgate run` with its reaper, the client,
/// `status`) talks to a TLS-only server with nothing but the URL and the CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_cli_and_status_over_tls_with_a_private_ca() {
    let redis = RedisServer::start_tls(ClientAuth::No, &[])
        .await
        .expect("start a TLS redis-server");
    let env = ca_only(&redis);
    let (put, _) = seatgate(&env, &["license", "put", "cad", "--seats", "1"]).await;
    assert!(put.status.success(), "{put:?}");

    let mut worker = WorkerProcess::start(&redis.url(), &env).await;
    acquire_release(&env, "cad", "s1").await;
    let args = ["acquire", "--license", "cad", "--session", "s2"];
    let (o, _) = seatgate(&env, &args).await;
    assert!(stdout(&o).starts_with("ACQUIRED"), "{o:?}");
    let (o, _) = seatgate(&env, &["acquire", "--license", "cad", "--session", "s3"]).await;
    assert_eq!(o.status.code(), Some(1), "the one seat is held: {o:?}");

    let (o, _) = seatgate(&env, &["status", "--json"]).await;
    assert!(o.status.success(), "{o:?}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("status --json prints JSON");
    assert!(v.to_string().contains("s2"), "{v}");
    let (o, _) = seatgate(&env, &["license", "show", "cad"]).await;
    assert!(stdout(&o).contains("seats 1/1"), "{o:?}");

    let status = worker.terminate(Duration::from_secs(10)).await;
    assert!(status.success(), "SIGTERM is a clean exit: {status:?}");
}

/// `--tls-auth-clients yes`: without a client certificate the handshake is
/// refused and the error says which settings to fill in; with one, an
/// in-process worker and the CLI work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_requires_client_certificates() {
    let redis = RedisServer::start_tls(ClientAuth::Required, &[])
        .await
        .expect("start a TLS redis-server");

    let env = ca_only(&redis);
    let (o, took) = seatgate(&env, &["license", "put", "cad", "--seats", "2"]).await;
    let err = one_error_line(&o);
    assert!(err.contains("redis.tls_cert_file"), "{err}");
    assert!(took < Duration::from_secs(10), "failed only after {took:?}");

    let env = with_client_cert(&redis);
    let (put, _) = seatgate(&env, &["license", "put", "cad", "--seats", "2"]).await;
    assert!(put.status.success(), "{put:?}");
    let worker = spawn_worker(redis.settings(), "tls-w1").await;
    acquire_release(&env, "cad", "s1").await;
    worker.stop().await;
}

/// TLS and an ACL login together: the user and password (from the
/// environment, as in a deployment, or from the settings) travel inside the
/// TLS connection, for the worker process, the CLI, and in-process
/// connections of both kinds; a wrong password is told as a failed login, not
/// taken for a TLS mistake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_logs_in_over_tls() {
    let (user, password) = ("tls-app", "pw-over-tls");
    let acl_user = format!(">{password}");
    let redis = RedisServer::start_tls(
        ClientAuth::Required,
        &[
            "--user", "default", "off", "--user", user, "on", &acl_user, "~*", "&*", "+@all",
        ],
    )
    .await
    .expect("start a TLS redis-server with an ACL user");
    let mut env = with_client_cert(&redis);
    env.push(("SEATGATE__REDIS__USERNAME", user.to_owned()));
    env.push(("SEATGATE__REDIS__PASSWORD", password.to_owned()));
    let (put, _) = seatgate(&env, &["license", "put", "cad", "--seats", "2"]).await;
    assert!(put.status.success(), "{put:?}");
    let mut worker = WorkerProcess::start(&redis.url(), &env).await;
    acquire_release(&env, "cad", "s1").await;

    let mut s = redis.settings();
    s.redis.username = user.to_owned();
    s.redis.password = SecretString::from(password);
    let whoami: String = redis::cmd("ACL")
        .arg("WHOAMI")
        .query_async(&mut db(&s).await)
        .await
        .unwrap();
    assert_eq!(whoami, user);
    let client = client(&s).await;
    let r = client.call(&Call::acquire("cad", "s2"), T).await.unwrap();
    assert_eq!(r.status(), Status::Acquired, "{r:?}");
    assert_eq!(holders(&s, "cad").await, ["s2"]);

    let mut wrong = env.clone();
    wrong.retain(|(k, _)| *k != "SEATGATE__REDIS__PASSWORD");
    wrong.push(("SEATGATE__REDIS__PASSWORD", "not-the-password".to_owned()));
    let (o, _) = seatgate(&wrong, &["status"]).await;
    let err = one_error_line(&o);
    assert!(err.contains("Password authentication failed"), "{err}");
    assert!(
        !err.contains("rediss") && !err.contains("tls_"),
        "no TLS hint: {err}"
    );

    let status = worker.terminate(Duration::from_secs(10)).await;
    assert!(status.success(), "SIGTERM is a clean exit: {status:?}");
}

/// Runs a client command (the dedicated connection of `acquire`) and an
/// admin one (the managed connection of `status`) with `env`: each must fail
/// within 5 s, on one line containing `expected`.
async fn both_fail_fast_saying(env: &[(&str, String)], expected: &str) {
    for args in [&["acquire", "--license", "x", "--session", "y"][..], &["status"]] {
        let (o, took) = seatgate(env, args).await;
        let err = one_error_line(&o);
        assert!(err.contains(expected), "{args:?}: {err}");
        assert!(
            took < Duration::from_secs(5),
            "{args:?} failed only after {took:?}: {err}"
        );
    }
}

/// Settings that do not match the server fail within seconds, on one line
/// that says what to change, instead of hanging or timing out vaguely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mismatched_tls_settings_fail_fast_with_a_hint() {
    // Also on 127.0.0.2, an address its certificate does not name.
    let tls_server = RedisServer::start_tls(ClientAuth::No, &["--bind", "127.0.0.1", "127.0.0.2"])
        .await
        .expect("start a TLS redis-server");
    let plain_server = RedisServer::start_with(&[]).await;
    let acquire = ["acquire", "--license", "x", "--session", "y"];

    // A plain URL against the TLS port.
    let plain = format!("redis://127.0.0.1:{}", tls_server.port());
    both_fail_fast_saying(&[("SEATGATE__REDIS__URL", plain)], "use a rediss:// URL").await;

    // rediss:// without the private CA: the system's roots do not know it.
    both_fail_fast_saying(&[("SEATGATE__REDIS__URL", tls_server.url())], "redis.tls_ca_file").await;

    // A host the server's certificate does not name.
    let mut env = ca_only(&tls_server);
    env[0].1 = tls_server.url().replace("127.0.0.1", "127.0.0.2");
    both_fail_fast_saying(&env, "does not name the host in the URL").await;

    // rediss:// against a plain server, which waits for the end of a line
    // that never comes: the connect timeout ends it.
    let mut env = ca_only(&tls_server);
    env[0].1 = plain_server.url().replace("redis://", "rediss://");
    env.push(("SEATGATE__REDIS__CONNECT_TIMEOUT_MS", "1000".into()));
    both_fail_fast_saying(&env, "needs a redis:// URL").await;

    // TLS files with a plain URL: refused rather than silently unused.
    let mut env = ca_only(&tls_server);
    env[0].1 = plain_server.url();
    let (o, _) = seatgate(&env, &acquire).await;
    let err = one_error_line(&o);
    assert!(err.contains("rediss://"), "{err}");

    // A missing CA file or half a client certificate is named at startup.
    let url = ("SEATGATE__REDIS__URL", tls_server.url());
    let missing = ("SEATGATE__REDIS__TLS_CA_FILE", "/nonexistent/ca.pem".to_owned());
    let (o, _) = seatgate(&[url.clone(), missing], &["status"]).await;
    let err = one_error_line(&o);
    assert!(
        err.contains("redis.tls_ca_file") && err.contains("/nonexistent/ca.pem"),
        "{err}"
    );
    let cert = tls_server.tls().unwrap().client_cert().display().to_string();
    let (o, _) = seatgate(&[url, ("SEATGATE__REDIS__TLS_CERT_FILE", cert)], &["status"]).await;
    let err = one_error_line(&o);
    assert!(err.contains("redis.tls_key_file"), "{err}");

    // A client certificate with some other key.
    let tls = tls_server.tls().unwrap();
    let url = ("SEATGATE__REDIS__URL", tls_server.url());
    let cert = (
        "SEATGATE__REDIS__TLS_CERT_FILE",
        tls.client_cert().display().to_string(),
    );
    let wrong_key = (
        "SEATGATE__REDIS__TLS_KEY_FILE",
        tls.server_key().display().to_string(),
    );
    let (o, _) = seatgate(&[url, cert, wrong_key], &["status"]).await;
    let err = one_error_line(&o);
    assert!(err.contains("not a usable pair"), "{err}");
}

/// A TLS-only cluster (client, replication and bus ports): the seed URLs are
/// rediss://, the nodes discovered from CLUSTER SLOTS get the same CA and
/// client certificate, and seats are decided on every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster() {
    let cluster = LocalCluster::start_tls(3, 0, ClientAuth::Required)
        .await
        .expect("start a TLS cluster");
    let tls = cluster.nodes[0].tls().expect("TLS nodes");
    let mut s = Settings::load(None).unwrap();
    s.redis.cluster_urls = cluster.urls();
    tls.apply(&mut s.redis);
    s.metrics.listen = String::new();
    s.stream.block_ms = 100;
    s.stream.shards = 3;
    assert!(cluster.urls().iter().all(|u| u.starts_with("rediss://")));

    let licenses: Vec<String> = (0..6).map(|i| format!("tls-{i}")).collect();
    let mut env = tls.env();
    env.push(("SEATGATE__REDIS__CLUSTER_URLS", cluster.urls().join(",")));
    env.push(("SEATGATE__STREAM__SHARDS", "3".into()));
    for l in &licenses {
        let (put, _) = seatgate(&env, &["license", "put", l, "--seats", "1"]).await;
        assert!(put.status.success(), "{put:?}");
    }
    let worker = spawn_worker(s.clone(), "tls-cluster-w1").await;
    let client = s.client().connect().await.expect("client over TLS");
    for l in &licenses {
        let reply = client
            .call(&Call::acquire(l, "s1"), Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(reply.status(), Status::Acquired, "{l}: {reply:?}");
    }
    // Plain seed URLs against the TLS-only nodes fail at once, on both kinds
    // of connection.
    let mut plain = s.clone();
    plain.redis.cluster_urls = cluster
        .urls()
        .iter()
        .map(|u| u.replace("rediss://", "redis://"))
        .collect();
    plain.redis.tls_ca_file.clear();
    plain.redis.tls_cert_file.clear();
    plain.redis.tls_key_file.clear();
    let started = Instant::now();
    let err = plain
        .client()
        .connect()
        .await
        .err()
        .expect("plain URLs against TLS nodes fail");
    assert!(err.to_string().contains("use a rediss:// URL"), "{err}");
    let err = Db::connect(&plain.redis)
        .await
        .err()
        .expect("plain URLs against TLS nodes fail");
    assert!(err.to_string().contains("use a rediss:// URL"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "after {:?}",
        started.elapsed()
    );
    // And so does leaving out the client certificate these nodes require.
    let mut no_cert = s.clone();
    no_cert.redis.tls_cert_file.clear();
    no_cert.redis.tls_key_file.clear();
    let err = Db::connect(&no_cert.redis)
        .await
        .err()
        .expect("no client certificate");
    assert!(err.to_string().contains("set redis.tls_cert_file"), "{err}");

    let lease = client
        .lease(&licenses[0], "s1")
        .expect("the client's lease")
        .as_str()
        .to_owned();
    let (o, _) = seatgate(
        &env,
        &[
            "release",
            "--license",
            &licenses[0],
            "--session",
            "s1",
            "--lease",
            &lease,
        ],
    )
    .await;
    assert!(stdout(&o).starts_with("RELEASED"), "{o:?}");
    worker.stop().await;
}
