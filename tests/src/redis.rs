//! A private `redis-server` per test, on a free loopback port, killed on drop.
//!
//! Nothing is persisted (`--save '' --appendonly no`), so a stop and start on the same port gives
//! an empty Redis, as a restarted or failed-over one would be. A tiny RESP client lets tests look
//! at keys without another dependency.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

pub struct Redis {
    port: u16,
    child: Option<Child>,
}

impl Redis {
    /// Starts a server; fails with the fix when `redis-server` is not installed.
    pub fn start() -> Result<Self> {
        let mut redis = Self {
            port: TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .context("no free loopback port")?,
            child: None,
        };
        redis.resume()?;
        Ok(redis)
    }

    /// `redis://127.0.0.1:<port>`, for `DAIV_SANDBOX_REDIS_URL`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL: an outage, not a clean shutdown).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A frozen server ignores nothing but SIGKILL, which is what follows.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes (`true`, SIGSTOP) or thaws (`false`, SIGCONT) the server: connections stay open and
    /// nothing answers, the outage that only timeouts detect.
    pub fn freeze(&self, frozen: bool) -> Result<()> {
        let pid = self
            .child
            .as_ref()
            .context("redis-server not running")?
            .id();
        let signal = if frozen { "-STOP" } else { "-CONT" };
        let ok = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()?
            .success();
        if !ok {
            bail!("kill {signal} {pid} failed");
        }
        Ok(())
    }

    /// Starts the server again on the same port, empty.
    pub fn resume(&mut self) -> Result<()> {
        self.stop();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                bail!(
                    "redis-server is not installed: run scripts/ensure-redis.sh (or `make redis`)"
                )
            }
            Err(e) => return Err(e).context("spawn redis-server"),
        };
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if matches!(self.command(&["PING"]).as_deref(), Ok("PONG")) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "redis-server on port {} did not answer PING in 10 s",
                    self.port
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends one command and returns its reply as text: a simple string, an integer, a bulk
    /// string, or `(nil)`. Arrays are not needed by the tests and are refused.
    pub fn command(&self, args: &[&str]) -> Result<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        stream.write_all(req.as_bytes())?;
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end();
        let (kind, rest) = line.split_at(line.len().min(1));
        match kind {
            "+" | ":" => Ok(rest.to_string()),
            "-" => bail!("redis error: {rest}"),
            "$" if rest == "-1" => Ok("(nil)".to_string()),
            "$" => {
                let mut value = String::new();
                reader.read_line(&mut value)?;
                Ok(value.trim_end().to_string())
            }
            _ => bail!("unexpected reply {line:?}"),
        }
    }

    /// Whether `key` exists.
    pub fn exists(&self, key: &str) -> Result<bool> {
        Ok(self.command(&["EXISTS", key])? == "1")
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}
