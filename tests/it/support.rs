//! Test support: a real `redis-server` per test on a free loopback port with
//! its own temp dir, and in-process workers with their own shutdown tokens.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use seatgate::config::Settings;
use seatgate::http::Readiness;
use seatgate::keys::Keys;
use seatgate::license::{self, LicenseSpec};
use seatgate::worker::Worker;
use tokio_util::sync::CancellationToken;

/// A redis-server child process, killed on drop. Its log is printed when the
/// test that owns it panics.
pub struct RedisServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

impl RedisServer {
    /// Starts a server with no persistence.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Starts a server with extra `--name value` arguments.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        for _attempt in 0..5 {
            let dir = tempfile::tempdir().expect("temp dir");
            let port = free_port();
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
                .args(["--appendonly", "no", "--protected-mode", "yes"])
                .arg("--dir")
                .arg(dir.path())
                .arg("--logfile")
                .arg(dir.path().join("redis.log"))
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server must be installed (apt-get install redis-server)");
            let mut server = RedisServer { child, port, dir };
            if server.wait_ready(Duration::from_secs(5)) {
                return server;
            }
            // Lost the port to someone else, or failed to start: try another port.
            let _ = server.child.kill();
        }
        panic!("redis-server did not start");
    }

    fn wait_ready(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let client = redis::Client::open(self.url()).expect("url");
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok(mut con) = client.get_connection() {
                if redis::cmd("PING").query::<String>(&mut con).is_ok() {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// The server's redis:// URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's data directory.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_owned()
    }

    /// A fresh async connection.
    pub async fn con(&self) -> MultiplexedConnection {
        redis::Client::open(self.url())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to test redis")
    }

    /// Settings pointing at this server: no metrics endpoint, short blocks.
    pub fn settings(&self) -> Settings {
        let mut s = Settings::load(None).expect("default settings");
        s.redis.url = self.url();
        s.metrics.listen = String::new();
        s.stream.block_ms = 100;
        s
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            if let Ok(log) = std::fs::read_to_string(self.dir.path().join("redis.log")) {
                eprintln!("--- redis-server log (port {}) ---\n{log}", self.port);
            }
        }
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
