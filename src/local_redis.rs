//! A private redis-server: started on a free loopback port with its own temp
//! dir, stopped on drop. The benchmark uses it, and so do the tests.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::Error;

/// A redis-server child process, killed on drop. Its log is printed when the
/// thread that owns it panics (a failing test).
pub struct LocalRedis {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
    /// Extra arguments, kept for restarts.
    extra: Vec<String>,
}

fn free_port() -> Result<u16, Error> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn spawn(port: u16, dir: &Path, extra: &[String]) -> Result<Child, Error> {
    Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
        .args(["--appendonly", "no", "--protected-mode", "yes"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join("redis.log"))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| {
            Error::Usage(format!(
                "cannot start redis-server ({e}); install it: apt-get install redis-server"
            ))
        })
}

impl LocalRedis {
    /// Starts a server with no persistence, plus `extra` `--name value` arguments.
    pub fn start(extra: &[&str]) -> Result<LocalRedis, Error> {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        for _attempt in 0..5 {
            let dir = tempfile::tempdir()?;
            let port = free_port()?;
            let child = spawn(port, dir.path(), &extra)?;
            let mut server = LocalRedis {
                child,
                port,
                dir,
                extra: extra.clone(),
            };
            if server.wait_ready(Duration::from_secs(5)) {
                return Ok(server);
            }
            // Lost the port to someone else, or failed to start: try another port.
            let _ = server.child.kill();
            let _ = server.child.wait();
        }
        Err(Error::Usage("redis-server did not start; see its log".into()))
    }

    fn wait_ready(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
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

    /// Stops the server the way an operator does (SHUTDOWN: the AOF, if on,
    /// is flushed) and waits for the process to end.
    pub fn shutdown(&mut self) {
        if let Ok(mut con) = redis::Client::open(self.url()).and_then(|c| c.get_connection()) {
            let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN").query(&mut con);
        }
        let _ = self.child.wait();
    }

    /// Starts the server again on the same port with the same data directory.
    pub fn restart(&mut self) -> Result<(), Error> {
        self.child = spawn(self.port, self.dir.path(), &self.extra)?;
        if self.wait_ready(Duration::from_secs(10)) {
            Ok(())
        } else {
            Err(Error::Usage("redis-server did not restart".into()))
        }
    }
}

impl Drop for LocalRedis {
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
