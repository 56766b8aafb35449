//! Egress fixtures: test certificate authorities, and an HTTPS echo upstream running in a
//! container on a network the test creates, reachable under made-up `.test` names only.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{ControlPlane, DEBIAN, docker, require_image};

/// A throwaway CA (shared with the gateway's in-process fixtures).
pub use integration::fixtures::TestCa;

/// HTTPS (443) and HTTP (80) echo server: answers every request with a JSON record of it and
/// appends that record to /tmp/requests.jsonl, which tests read back with `docker exec`. A
/// WebSocket handshake (`Upgrade: websocket`) is answered 101, then every byte is echoed until
/// the client closes. It is also a package index of one package (`/simple/daivpkg/`, PEP 503,
/// whose wheel's module `daivpkg` has `VALUE = 42`), for `pip install` through a gateway.
pub const ECHO_SERVER: &str = r#"
import http.server, io, json, ssl, threading, zipfile
def wheel():
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w") as z:
        z.writestr("daivpkg/__init__.py", "VALUE = 42\n")
        d = "daivpkg-1.0.dist-info/"
        z.writestr(d + "METADATA", "Metadata-Version: 2.1\nName: daivpkg\nVersion: 1.0\n")
        z.writestr(d + "WHEEL", "Wheel-Version: 1.0\nGenerator: e2e\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(d + "RECORD", "daivpkg/__init__.py,,\n" + d + "METADATA,,\n" + d + "WHEEL,,\n" + d + "RECORD,,\n")
    return b.getvalue()
WHEEL_NAME = "daivpkg-1.0-py3-none-any.whl"
WHEEL = wheel()
INDEX = ('<html><body><a href="/packages/%s">%s</a></body></html>' % (WHEEL_NAME, WHEEL_NAME)).encode()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def handle_any(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        rec = {"method": self.command, "path": self.path, "tls": self.server.tls,
               "headers": {k.lower(): v for k, v in self.headers.items()}, "body_len": len(body)}
        with open("/tmp/requests.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        if (self.headers.get("Upgrade") or "").lower() == "websocket":
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.end_headers()
            self.wfile.flush()
            while True:
                try:
                    data = self.connection.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    break
                self.wfile.write(data)
            self.close_connection = True
            return
        out, ctype = json.dumps(rec).encode(), "application/json"
        if self.path.split("?")[0].rstrip("/") == "/simple/daivpkg":
            out, ctype = INDEX, "text/html"
        elif self.path == "/packages/" + WHEEL_NAME:
            out, ctype = WHEEL, "application/octet-stream"
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(out)
    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = handle_any
    def log_message(self, *args):
        pass
def serve(port, tls):
    srv = http.server.ThreadingHTTPServer(("0.0.0.0", port), H)
    srv.tls = tls
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain("/certs/server.crt", "/certs/server.key")
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.serve_forever()
threading.Thread(target=serve, args=(80, False), daemon=True).start()
open("/tmp/ready", "w").close()
serve(443, True)
"#;

/// The egress gateway image the tests run: `DAIV_SANDBOX_EGRESS_PROXY_IMAGE` when set (a build
/// of one's own, e.g. `daiv-sandbox-egress:dev`), else the local image `make images` builds.
pub fn gateway_image() -> String {
    std::env::var("DAIV_SANDBOX_EGRESS_PROXY_IMAGE")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "daiv-sandbox-egress:local".to_string())
}

/// Names the upstream answers to (network aliases on the test network).
pub const UPSTREAM_NAMES: &[&str] = &[
    "api.upstream.test",
    "other.upstream.test",
    "denied.upstream.test",
];

/// A test network with the echo upstream on it; both removed on drop.
pub struct Upstream {
    pub network: String,
    pub subnet: String,
    pub container: String,
    pub upstream_ca: TestCa,
    dir: PathBuf,
}

impl Upstream {
    pub fn start(image: &str) -> Result<Self> {
        let tag = format!("{:x}", rand_u64());
        let network = format!("daiv-e2e-upstream-{tag}");
        // A subnet of our own, in the benchmarking range (198.18.0.0/15): Docker's default pools
        // run out when many tests create networks at once.
        let mut subnet = String::new();
        for attempt in 0..16u64 {
            let n = (rand_u64().wrapping_add(attempt)) % 512;
            let candidate = format!("198.{}.{}.0/24", 18 + n / 256, n % 256);
            match docker(&[
                "network",
                "create",
                "--label",
                "daiv.e2e=1",
                "--subnet",
                &candidate,
                &network,
            ]) {
                Ok(_) => {
                    subnet = candidate;
                    break;
                }
                Err(e) if e.to_string().contains("overlap") => continue,
                Err(e) => return Err(e),
            }
        }
        if subnet.is_empty() {
            bail!("no free test subnet in 198.18.0.0/15");
        }
        let upstream_ca = TestCa::new("daiv e2e upstream CA")?;
        let (cert, key) = upstream_ca.leaf_pem(UPSTREAM_NAMES)?;
        let dir = std::env::temp_dir().join(format!("daiv-e2e-upstream-{tag}"));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("server.crt"), cert)?;
        std::fs::write(dir.join("server.key"), key)?;
        std::fs::write(dir.join("server.py"), ECHO_SERVER)?;
        let mut args = vec![
            "run".to_string(),
            "-d".into(),
            "--pull".into(),
            "never".into(),
            "--label".into(),
            "daiv.e2e=1".into(),
            "--network".into(),
            network.clone(),
            "-v".into(),
            format!("{}:/certs:ro", dir.display()),
        ];
        for name in UPSTREAM_NAMES {
            args.push("--network-alias".into());
            args.push((*name).into());
        }
        args.extend([
            image.to_string(),
            "python3".into(),
            "/certs/server.py".into(),
        ]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let container = docker(&refs)?;
        let up = Self {
            network,
            subnet,
            container,
            upstream_ca,
            dir,
        };
        for _ in 0..100 {
            if docker(&["exec", &up.container, "test", "-f", "/tmp/ready"]).is_ok() {
                return Ok(up);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        bail!(
            "echo upstream did not start: {}",
            docker(&["logs", &up.container]).unwrap_or_default()
        )
    }

    /// Every request the upstream has seen, oldest first.
    pub fn requests(&self) -> Result<Vec<Value>> {
        let out = docker(&[
            "exec",
            &self.container,
            "sh",
            "-c",
            "cat /tmp/requests.jsonl 2>/dev/null || true",
        ])?;
        out.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).context("request record"))
            .collect()
    }

    pub fn ca_file(&self) -> Result<PathBuf> {
        let p = self.dir.join("upstream-ca.pem");
        std::fs::write(&p, &self.upstream_ca.cert_pem)?;
        Ok(p)
    }

    pub fn dir(&self) -> &PathBuf {
        &self.dir
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-fv", &self.container]);
        let _ = docker(&["network", "rm", &self.network]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// The `EGRESS_*` settings that point a control plane's gateways at a test network: a fresh
/// egress CA (written to files in a directory of the fixture's), the gateway image under test,
/// and, for an HTTPS upstream, the CA it trusts and the subnet it may reach. One place for what
/// every egress suite sets; tests add or override settings with [`EgressSettings::set`].
pub struct EgressSettings {
    vars: Vec<(String, String)>,
}

impl EgressSettings {
    /// Gateways on `network`, a fresh egress CA written to `dir` (`egress-ca.crt`, `.key`), the
    /// gateway image under test ([`gateway_image`]).
    pub fn on_network(dir: &Path, network: &str) -> Result<Self> {
        let egress_ca = TestCa::new("daiv e2e egress CA")?;
        let cert = dir.join("egress-ca.crt");
        let key = dir.join("egress-ca.key");
        std::fs::write(&cert, &egress_ca.cert_pem)?;
        std::fs::write(&key, &egress_ca.key_pem)?;
        Ok(Self {
            vars: vec![
                ("EGRESS_CA_CERT_FILE".into(), cert.display().to_string()),
                ("EGRESS_CA_KEY_FILE".into(), key.display().to_string()),
                ("EGRESS_PROXY_NETWORK".into(), network.to_string()),
                ("EGRESS_PROXY_IMAGE".into(), gateway_image()),
            ],
        })
    }

    /// And an HTTPS upstream on `subnet` whose certificates `upstream_ca_pem` signs (written to
    /// `dir/upstream-ca.pem`): `EGRESS_UPSTREAM_CA_FILE`, `EGRESS_ALLOWED_CIDRS`.
    pub fn with_upstream(self, dir: &Path, upstream_ca_pem: &str, subnet: &str) -> Result<Self> {
        let ca = dir.join("upstream-ca.pem");
        std::fs::write(&ca, upstream_ca_pem)?;
        Ok(self
            .set("EGRESS_UPSTREAM_CA_FILE", &ca.display().to_string())
            .set("EGRESS_ALLOWED_CIDRS", subnet))
    }

    /// Everything for the echo [`Upstream`]: its network, its CA, its subnet.
    pub fn for_upstream(up: &Upstream) -> Result<Self> {
        Self::on_network(up.dir(), &up.network)?.with_upstream(
            up.dir(),
            &up.upstream_ca.cert_pem,
            &up.subnet,
        )
    }

    /// Sets `name` (without the `DAIV_SANDBOX_` prefix) to `value`, replacing the fixture's.
    pub fn set(mut self, name: &str, value: &str) -> Self {
        match self.vars.iter_mut().find(|(k, _)| k == name) {
            Some(var) => var.1 = value.to_string(),
            None => self.vars.push((name.to_string(), value.to_string())),
        }
        self
    }

    /// The value of one setting.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The settings as [`ControlPlane::start_with`] takes them, then `extra` (which may override).
    pub fn env<'a>(&'a self, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut env: Vec<(&str, &str)> = self
            .vars
            .iter()
            .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        env.extend_from_slice(extra);
        env
    }
}

/// The egress stack most egress tests run on: the echo [`Upstream`] on a network of its own and a
/// control plane whose gateways reach it ([`EgressSettings::for_upstream`]). Needs the Debian and
/// gateway images. The service stops before the upstream's network goes.
pub struct EgressStack {
    pub cp: ControlPlane,
    pub up: Upstream,
}

impl EgressStack {
    pub async fn start() -> Result<Self> {
        Self::start_with(&[]).await
    }

    /// `extra` settings added to (or overriding) the egress ones.
    pub async fn start_with(extra: &[(&str, &str)]) -> Result<Self> {
        let up = start_upstream()?;
        let settings = EgressSettings::for_upstream(&up)?;
        let cp = ControlPlane::start_with(&settings.env(extra)).await?;
        Ok(Self { cp, up })
    }
}

/// Checks the Debian and gateway images, then starts the echo [`Upstream`] (Debian's python3).
pub fn start_upstream() -> Result<Upstream> {
    require_image(DEBIAN);
    require_image(&gateway_image());
    Upstream::start(DEBIAN)
}

/// A fresh egress CA written beside `up`'s files, and `up`'s CA bundle: the paths of the egress CA
/// certificate, its key and the upstream CA, as `EGRESS_CA_CERT_FILE`, `EGRESS_CA_KEY_FILE` and
/// `EGRESS_UPSTREAM_CA_FILE` take them. (The same files as [`EgressSettings::for_upstream`].)
pub fn egress_ca_files(up: &Upstream) -> Result<(String, String, String)> {
    let settings = EgressSettings::for_upstream(up)?;
    let get = |name| settings.get(name).unwrap_or_default().to_string();
    Ok((
        get("EGRESS_CA_CERT_FILE"),
        get("EGRESS_CA_KEY_FILE"),
        get("EGRESS_UPSTREAM_CA_FILE"),
    ))
}

/// An egress session's token and its gateway container's id, from Docker's labels.
pub fn gateway_of(session_id: &str) -> Result<(String, String)> {
    let token = crate::inspect(session_id).context("no such sandbox")?["Config"]["Labels"]
        ["daiv.sandbox.egress"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let gateway = docker(&[
        "ps",
        "-q",
        "--no-trunc",
        "--filter",
        &format!("label=daiv.sandbox.egress={token}"),
        "--filter",
        "label=daiv.sandbox.role=egress-gateway",
    ])?;
    Ok((token, gateway))
}

/// A plain-HTTP echo server (the [`ECHO_SERVER`] records, no TLS) on one port, alone on a
/// network the test creates with a private (RFC 1918) subnet, reachable under `names`: a
/// development stack's service, such as DAIV's GitLab at `http://gitlab:8929`. Both removed
/// on drop.
pub struct PrivateUpstream {
    pub network: String,
    pub subnet: String,
    pub container: String,
    dir: PathBuf,
}

const PLAIN_ECHO_SERVER: &str = r#"
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def handle_any(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        rec = {"method": self.command, "path": self.path,
               "headers": {k.lower(): v for k, v in self.headers.items()}, "body_len": len(body)}
        with open("/tmp/requests.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        out = json.dumps(rec).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(out)
    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = handle_any
    def log_message(self, *args):
        pass
srv = http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), H)
open("/tmp/ready", "w").close()
srv.serve_forever()
"#;

impl PrivateUpstream {
    pub fn start(image: &str, names: &[&str], port: u16) -> Result<Self> {
        let tag = format!("{:x}", rand_u64());
        let network = format!("daiv-e2e-private-{tag}");
        // A /24 of 10.0.0.0/8 of our own (the feature under test is about RFC 1918 addresses;
        // Docker's default pools run out when many tests create networks at once).
        let mut subnet = String::new();
        for attempt in 0..16u64 {
            let n = (rand_u64().wrapping_add(attempt)) % 4096;
            let candidate = format!("10.{}.{}.0/24", 200 + n / 256, n % 256);
            match docker(&[
                "network",
                "create",
                "--label",
                "daiv.e2e=1",
                "--subnet",
                &candidate,
                &network,
            ]) {
                Ok(_) => {
                    subnet = candidate;
                    break;
                }
                Err(e) if e.to_string().contains("overlap") => continue,
                Err(e) => return Err(e),
            }
        }
        if subnet.is_empty() {
            bail!("no free test subnet in 10.200.0.0/12");
        }
        let dir = std::env::temp_dir().join(format!("daiv-e2e-private-{tag}"));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("server.py"), PLAIN_ECHO_SERVER)?;
        let mut args = vec![
            "run".to_string(),
            "-d".into(),
            "--pull".into(),
            "never".into(),
            "--label".into(),
            "daiv.e2e=1".into(),
            "--network".into(),
            network.clone(),
            "-v".into(),
            format!("{}:/srv:ro", dir.display()),
        ];
        for name in names {
            args.push("--network-alias".into());
            args.push((*name).into());
        }
        args.extend([
            image.to_string(),
            "python3".into(),
            "/srv/server.py".into(),
            port.to_string(),
        ]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let container = match docker(&refs) {
            Ok(c) => c,
            Err(e) => {
                let _ = docker(&["network", "rm", &network]);
                return Err(e);
            }
        };
        let up = Self {
            network,
            subnet,
            container,
            dir,
        };
        for _ in 0..100 {
            if docker(&["exec", &up.container, "test", "-f", "/tmp/ready"]).is_ok() {
                return Ok(up);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        bail!(
            "private upstream did not start: {}",
            docker(&["logs", &up.container]).unwrap_or_default()
        )
    }

    /// Every request the upstream has seen, oldest first.
    pub fn requests(&self) -> Result<Vec<Value>> {
        let out = docker(&[
            "exec",
            &self.container,
            "sh",
            "-c",
            "cat /tmp/requests.jsonl 2>/dev/null || true",
        ])?;
        out.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).context("request record"))
            .collect()
    }

    pub fn dir(&self) -> &PathBuf {
        &self.dir
    }
}

impl Drop for PrivateUpstream {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-fv", &self.container]);
        let _ = docker(&["network", "rm", &self.network]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
