//! DNS is not a side channel (issue 14 #7). A sandbox behind its gateway looks up made-up names
//! (random labels under `.test`, and a bare random label) with every client it has (glibc's
//! `getent`, Python's `getaddrinfo`, and hand-made UDP queries to each nameserver its
//! `/etc/resolv.conf` lists), under runc and gVisor, while a passive capture on the host sees
//! every packet on every interface of the host's network namespace (an `AF_PACKET` socket in a
//! host-network container of the local Debian image: Docker bridges, the sandbox's and the
//! gateway's veths, the host's uplink and loopback).
//!
//! The test proves that no lookup gets an answer and that no DNS packet (UDP or TCP, ports 53,
//! 853, 5353, 5355) carrying any of the names appears anywhere: not on the sandbox's internal
//! network, not on the gateway's egress side, not on the host's uplink. A control datagram the
//! sandbox sends to its gateway's port 53 must be seen, so a capture that sees nothing fails the
//! test. The sandbox also asks the gateway for a made-up host the policy does not list: the
//! gateway refuses it without resolving it (no packet with that name either).
//!
//! No resolver is ever configured or pointed anywhere: the sandbox keeps the resolver Docker
//! gives it, and the only traffic the test itself sends goes to containers it created.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use e2e::egress::EgressStack;
use e2e::{DEBIAN, docker, inspect};
use serde_json::{Value, json};

/// Passive capture: one `AF_PACKET`/`ETH_P_ALL` socket (every interface of the namespace, also
/// those created after it opened). Prints `ready`, then one JSON line per DNS-port packet (UDP
/// or TCP, either direction, IPv4 or IPv6) with the interface, addresses, ports and which of the
/// labels given as arguments its bytes contain, and every 64th packet a `{"seen": N}` line.
const CAPTURE: &str = r#"
import json, socket, struct, sys
labels = [l.encode() for l in sys.argv[1:]]
PORTS = {53, 853, 5353, 5355}
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
print("ready", flush=True)
seen = 0
while True:
    data, addr = s.recvfrom(65535)
    seen += 1
    if seen % 64 == 0:
        print(json.dumps({"seen": seen}), flush=True)
    ifname, hatype = addr[0], addr[3]
    off, etype = 0, None
    if hatype in (1, 772):            # Ethernet, loopback: an Ethernet header
        if len(data) < 14:
            continue
        etype = struct.unpack("!H", data[12:14])[0]; off = 14
        while etype in (0x8100, 0x88a8) and len(data) >= off + 4:
            etype = struct.unpack("!H", data[off + 2:off + 4])[0]; off += 4
    else:                             # raw IP (tun, none)
        v = data[0] >> 4 if data else 0
        etype = 0x0800 if v == 4 else 0x86dd if v == 6 else None
    if etype == 0x0800 and len(data) >= off + 20:
        ihl = (data[off] & 15) * 4; proto = data[off + 9]
        src = socket.inet_ntop(socket.AF_INET, data[off + 12:off + 16])
        dst = socket.inet_ntop(socket.AF_INET, data[off + 16:off + 20])
        l4 = off + ihl
    elif etype == 0x86dd and len(data) >= off + 40:
        proto = data[off + 6]
        src = socket.inet_ntop(socket.AF_INET6, data[off + 8:off + 24])
        dst = socket.inet_ntop(socket.AF_INET6, data[off + 24:off + 40])
        l4 = off + 40
    else:
        continue
    if proto not in (6, 17) or len(data) < l4 + 4:
        continue
    sport, dport = struct.unpack("!HH", data[l4:l4 + 4])
    if sport not in PORTS and dport not in PORTS:
        continue
    payload = data[l4:]
    print(json.dumps({"if": ifname, "proto": "udp" if proto == 17 else "tcp", "src": src,
                      "dst": dst, "sport": sport, "dport": dport,
                      "labels": [l.decode() for l in labels if l in payload]}), flush=True)
"#;

/// What the sandbox runs: every lookup client it has, against every name; then the control
/// datagram to its gateway's port 53. Prints one JSON line per attempt.
const LOOKUPS: &str = r#"
import json, os, random, socket, struct, subprocess, sys
gateway, control, names = sys.argv[1], sys.argv[2], sys.argv[3:]
def query(name):
    q = struct.pack("!HHHHHH", random.randrange(65536), 0x0100, 1, 0, 0, 0)
    for label in name.rstrip(".").split("."):
        q += bytes([len(label)]) + label.encode()
    return q + b"\0" + struct.pack("!HH", 1, 1)
servers = [l.split()[1] for l in open("/etc/resolv.conf") if l.split()[:1] == ["nameserver"]]
out = {"resolv_conf_servers": servers}
print(json.dumps(out), flush=True)
env = dict(os.environ, RES_OPTIONS="timeout:1 attempts:1")
for name in names:
    for cmd in (["getent", "hosts", name], ["getent", "ahosts", name]):
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        print(json.dumps({"client": " ".join(cmd[:2]), "name": name, "exit": p.returncode,
                          "answer": p.stdout.strip()}), flush=True)
    try:
        a = socket.getaddrinfo(name, 443)
        print(json.dumps({"client": "getaddrinfo", "name": name, "answer": str(a)}), flush=True)
    except socket.gaierror as e:
        print(json.dumps({"client": "getaddrinfo", "name": name, "error": str(e)}), flush=True)
    for server in servers:
        u = socket.socket(socket.AF_INET6 if ":" in server else socket.AF_INET, socket.SOCK_DGRAM)
        u.settimeout(1.5)
        rec = {"client": "udp-query", "name": name, "server": server}
        try:
            u.sendto(query(name), (server, 53))
            r = u.recv(4096)
            rec["rcode"] = r[3] & 15
            rec["answers"] = struct.unpack("!H", r[6:8])[0]
        except Exception as e:
            rec["error"] = type(e).__name__
        finally:
            u.close()
        print(json.dumps(rec), flush=True)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.sendto(query(control + ".test"), (gateway, 53))
u.close()
print(json.dumps({"control_sent": gateway}), flush=True)
"#;

/// The capture container, its output collected by a reader thread; removed on drop.
struct Capture {
    name: String,
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Capture {
    fn start(labels: &[String]) -> Result<Self> {
        // Unique per test, not per process: libtest runs both runtimes' tests in one process.
        let name = random_label("daiv-e2e-dns-capture-");
        let mut child = Command::new("docker")
            .args([
                "run",
                "--rm",
                "-i",
                "--pull",
                "never",
                "--label",
                "daiv.e2e=1",
                "--name",
                &name,
                "--network",
                "host",
                "--cap-drop",
                "ALL",
                "--cap-add",
                "NET_RAW",
                DEBIAN,
                "python3",
                "-u",
                "-c",
                CAPTURE,
            ])
            .args(labels)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("docker run (capture)")?;
        let stdout = child.stdout.take().context("capture stdout")?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if line == "ready" {
                        let _ = ready_tx.send(());
                    } else if let Ok(mut l) = lines.lock() {
                        l.push(line);
                    }
                }
            });
        }
        let capture = Self { name, child, lines };
        ready_rx
            .recv_timeout(Duration::from_secs(60))
            .context("the capture never became ready")?;
        Ok(capture)
    }

    /// DNS-port packets captured so far, and the total packet count last reported.
    fn packets(&self) -> (Vec<Value>, u64) {
        let lines = self.lines.lock().map(|l| l.clone()).unwrap_or_default();
        let mut total = 0;
        let mut packets = Vec::new();
        for l in lines {
            let Ok(v) = serde_json::from_str::<Value>(&l) else {
                continue;
            };
            if let Some(n) = v["seen"].as_u64() {
                total = total.max(n);
            } else {
                packets.push(v);
            }
        }
        (packets, total)
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", &self.name]);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether a captured packet's bytes contain `label`.
fn has_label(packet: &Value, label: &str) -> bool {
    packet["labels"]
        .as_array()
        .is_some_and(|l| l.iter().any(|x| x == label))
}

/// `prefix` and 16 random hex digits: a DNS label no resolver has ever seen.
fn random_label(prefix: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    format!("{prefix}{:016x}", h.finish())
}

async fn dns_is_not_a_side_channel(runtime: &str) -> Result<()> {
    let EgressStack { up: _up, cp } = EgressStack::start_with(&[("RUNTIME", runtime)]).await?;
    let s = cp
        .session(json!({"base_image": DEBIAN, "egress": {"policy": {
            "default": "deny", "intercept": "all",
            "rules": [{"host": "api.upstream.test", "methods": ["GET"]}]}}}))
        .await?;
    let sandbox = inspect(&s.id).context("sandbox")?;
    assert_eq!(sandbox["HostConfig"]["Runtime"], runtime);
    // Nothing of the sandbox's DNS configuration is ours: Docker's defaults.
    assert!(
        sandbox["HostConfig"]["Dns"]
            .as_array()
            .is_none_or(|d| d.is_empty()),
        "{}",
        sandbox["HostConfig"]["Dns"]
    );
    let nets = sandbox["NetworkSettings"]["Networks"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    assert_eq!(nets.len(), 1, "the sandbox is on its internal network only");
    let endpoint = nets.values().next().context("one network")?;
    let sandbox_ip: std::net::Ipv4Addr =
        endpoint["IPAddress"].as_str().unwrap_or_default().parse()?;
    // The gateway holds the /29's second address (see the-host-is-unreachable test).
    let gateway_ip = std::net::Ipv4Addr::from((u32::from(sandbox_ip) & !7) + 2);

    let names = [
        format!("{}.test", random_label("leak")),
        format!("{}.exfil.test", random_label("x")),
        format!("{}.a.b.c.test", random_label("deep")),
        random_label("bare"),
    ];
    let denied_host = format!("{}.test", random_label("viagateway"));
    let control = random_label("control");
    let mut labels: Vec<String> = names
        .iter()
        .map(|n| n.split('.').next().unwrap_or_default().to_owned())
        .collect();
    labels.push(denied_host.split('.').next().unwrap_or_default().to_owned());
    labels.push(control.clone());
    let capture = Capture::start(&labels)?;

    let script = format!(
        "python3 -c '{}' {gateway_ip} {control} {}",
        LOOKUPS.replace('\'', "'\\''"),
        names.join(" ")
    );
    let (code, out) = cp.sh(&s, &script).await?;
    assert_eq!(code, 0, "{out}");
    // The gateway does not resolve a host its policy does not list.
    let (_, denied) = cp
        .sh(
            &s,
            &format!("curl -s -o /dev/null -w '%{{http_connect}}' https://{denied_host}/"),
        )
        .await?;
    assert_eq!(denied, "403", "CONNECT to an unlisted made-up host");

    // Stragglers (a resolver's retry) get time to show up; then the capture must have seen the
    // control datagram on the sandbox's network.
    e2e::eventually("the control datagram", Duration::from_secs(20), || {
        let seen = capture.packets().0.iter().any(|p| has_label(p, &control));
        async move { Ok(seen.then_some(())) }
    })
    .await
    .with_context(|| format!("capture: {:?}", capture.packets()))?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (packets, total) = capture.packets();
    drop(capture);
    eprintln!("capture ({runtime}): {total} packets, DNS-port packets: {packets:?}");
    eprintln!("lookups ({runtime}):\n{out}");

    // The control datagram left the sandbox towards its gateway: the capture sees the sandbox's
    // own network.
    let control_seen: Vec<&Value> = packets.iter().filter(|p| has_label(p, &control)).collect();
    assert!(
        control_seen
            .iter()
            .any(|p| p["src"] == sandbox_ip.to_string().as_str()
                && p["dst"] == gateway_ip.to_string().as_str()),
        "control datagram not captured: {control_seen:?}"
    );
    // No packet with a looked-up (or gateway-requested) name, anywhere.
    let leaked: Vec<&Value> = packets
        .iter()
        .filter(|p| {
            p["labels"]
                .as_array()
                .is_some_and(|l| l.iter().any(|x| x != control.as_str()))
        })
        .collect();
    assert!(
        leaked.is_empty(),
        "DNS packets with the sandbox's names: {leaked:?}"
    );
    // And no DNS-port packet from or to the sandbox but the control datagram.
    let sandbox_dns: Vec<&Value> = packets
        .iter()
        .filter(|p| {
            let ip = sandbox_ip.to_string();
            (p["src"] == ip.as_str() || p["dst"] == ip.as_str()) && !has_label(p, &control)
        })
        .collect();
    assert!(
        sandbox_dns.is_empty(),
        "DNS packets of the sandbox: {sandbox_dns:?}"
    );

    // Every lookup got no answer.
    let results: Vec<Value> = out
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let attempts: Vec<&Value> = results.iter().filter(|r| r["client"].is_string()).collect();
    let servers = results
        .iter()
        .find_map(|r| r["resolv_conf_servers"].as_array())
        .map_or(0, Vec::len);
    assert_eq!(
        attempts.len(),
        names.len() * (3 + servers),
        "every client ran for every name: {out}"
    );
    for a in &attempts {
        let answered = match a["client"].as_str() {
            Some("getent hosts" | "getent ahosts") => {
                a["exit"] == 0 || !a["answer"].as_str().unwrap_or_default().is_empty()
            }
            Some("getaddrinfo") => a.get("answer").is_some(),
            Some("udp-query") => a["answers"].as_u64().is_some_and(|n| n > 0),
            _ => true,
        };
        assert!(!answered, "a lookup was answered: {a}");
    }
    if results.iter().all(|r| r["control_sent"].is_null()) {
        bail!("the control datagram was not sent: {out}");
    }
    Ok(())
}

#[tokio::test]
async fn dns_is_not_a_side_channel_on_runc() -> Result<()> {
    dns_is_not_a_side_channel("runc").await
}

#[tokio::test]
async fn dns_is_not_a_side_channel_on_gvisor() -> Result<()> {
    dns_is_not_a_side_channel("runsc").await
}
