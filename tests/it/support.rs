//! Test support: a real `redis-server` per test on a free loopback port with
//! its own temp dir, and in-process workers with their own shutdown tokens.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use seatgate::config::Settings;
use seatgate::engine::keys::Keys;
use seatgate::engine::license::{self, LicenseSpec};
use seatgate::runtime::health::Readiness;
use seatgate::runtime::worker::Worker;
use tokio_util::sync::CancellationToken;

pub use seatgate::tools::local_redis::LocalRedis as RedisServer;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

/// Conveniences for tests on top of the library's private Redis.
pub trait RedisServerExt {
    /// Starts a server with extra `--name value` arguments.
    fn start_with(extra: &[&str]) -> RedisServer;
    /// A fresh async connection.
    async fn con(&self) -> MultiplexedConnection;
    /// Settings pointing at this server: no metrics endpoint, short blocks.
    fn settings(&self) -> Settings;
}

impl RedisServerExt for RedisServer {
    fn start_with(extra: &[&str]) -> RedisServer {
        RedisServer::start(extra).expect("start redis-server")
    }

    async fn con(&self) -> MultiplexedConnection {
        self.client()
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to test redis")
    }

    fn settings(&self) -> Settings {
        let mut s = Settings::load(None).expect("default settings");
        s.redis.url = self.url();
        if let Some(tls) = self.tls() {
            tls.apply(&mut s.redis);
        }
        s.metrics.listen = String::new();
        s.stream.block_ms = 100;
        s
    }
}

/// An in-process worker; stopped (and awaited) by [`WorkerHandle::stop`].
pub struct WorkerHandle {
    token: CancellationToken,
    task: tokio::task::JoinHandle<seatgate::Result<()>>,
    /// Its readiness flag, as `/ready` would report it.
    pub ready: Readiness,
}

impl WorkerHandle {
    /// Cancels the worker and waits for it to finish its batch.
    pub async fn stop(self) {
        self.token.cancel();
        self.task
            .await
            .expect("worker task panicked")
            .expect("worker failed");
    }
}

/// Starts a worker named `consumer` with `settings`.
pub async fn spawn_worker(mut settings: Settings, consumer: &str) -> WorkerHandle {
    settings.stream.consumer = consumer.to_owned();
    let ready = Readiness::default();
    let worker = Worker::connect(settings, ready.clone())
        .await
        .expect("worker connects");
    let token = CancellationToken::new();
    let task = tokio::spawn(worker.run(token.clone()));
    WorkerHandle { token, task, ready }
}

/// Provisions `license` with `seats` seats, active, never expiring.
pub async fn put_license(server: &RedisServer, license: &str, seats: u64) {
    let mut con = server.con().await;
    let spec = LicenseSpec {
        seats_total: seats,
        expires_at_ms: 0,
        active: true,
        heartbeat_timeout_ms: None,
    };
    license::put(&mut con, &Keys::new("seat"), license, &spec)
        .await
        .expect("put license");
}

/// Sessions holding a seat of `license`, sorted.
pub async fn holders(server: &RedisServer, license: &str) -> Vec<String> {
    let mut con = server.con().await;
    let key = Keys::new("seat").license(license).holders;
    let mut v: Vec<String> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(&mut con)
        .await
        .unwrap();
    v.sort();
    v
}

/// Every key and its DUMP, to show that something changed nothing.
pub async fn snapshot(server: &RedisServer) -> Vec<(String, Vec<u8>)> {
    let mut con = server.con().await;
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("seat:{*")
        .query_async(&mut con)
        .await
        .unwrap();
    keys.sort();
    let mut out = Vec::new();
    for k in keys {
        let dump: Vec<u8> = redis::cmd("DUMP").arg(&k).query_async(&mut con).await.unwrap();
        out.push((k, dump));
    }
    out
}

/// Entries of the requests stream still pending in the group.
pub async fn pending(server: &RedisServer) -> i64 {
    let mut con = server.con().await;
    let v: redis::Value = redis::cmd("XPENDING")
        .arg("seat:requests")
        .arg("seatgate")
        .query_async(&mut con)
        .await
        .unwrap();
    match v {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::Int(n)) => *n,
            _ => 0,
        },
        _ => 0,
    }
}

/// The `seatgate` binary built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_seatgate");

/// A `seatgate run` child process with its own metrics port, killed on drop.
pub struct WorkerProcess {
    child: Child,
    /// host:port of its /metrics, /live and /ready.
    pub metrics: String,
}

impl WorkerProcess {
    /// Starts `seatgate run` against `url` with extra `SEATGATE__*` variables
    /// and waits until /ready answers 200.
    pub fn start(url: &str, env: &[(&str, String)]) -> WorkerProcess {
        let port = free_port();
        let mut cmd = Command::new(BIN);
        cmd.arg("--redis")
            .arg(url)
            .arg("run")
            .env("SEATGATE__METRICS__LISTEN", format!("127.0.0.1:{port}"))
            .env("SEATGATE__STREAM__BLOCK_MS", "100")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start seatgate run");
        let worker = WorkerProcess {
            child,
            metrics: format!("127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while http_get(&worker.metrics, "/ready").map(|(code, _)| code) != Some(200) {
            assert!(Instant::now() < deadline, "worker did not become ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        worker
    }

    /// SIGKILL: no chance to finish anything.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits (at most `within`) for the exit status.
    pub fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for worker") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "worker did not stop on SIGTERM within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A minimal HTTP/1.0 GET, enough for /metrics and /ready on loopback.
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    let code = body.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body))
}

/// Every entry of `stream`, oldest first, as field maps.
pub async fn stream_entries(con: &mut MultiplexedConnection, stream: &str) -> Vec<HashMap<String, String>> {
    let read: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query_async(con)
        .await
        .unwrap();
    read.ids
        .into_iter()
        .map(|e| {
            e.map
                .into_iter()
                .map(|(k, v)| (k, redis::from_redis_value::<String>(v).unwrap()))
                .collect()
        })
        .collect()
}

/// Creates the requests stream and its consumer group, as a worker would.
pub async fn create_group(con: &mut MultiplexedConnection) {
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg("seat:requests")
        .arg("seatgate")
        .arg("0")
        .arg("MKSTREAM")
        .query_async(con)
        .await
        .unwrap();
}
