//! Egress sessions end to end: a Debian sandbox behind its own gateway, an HTTPS echo upstream
//! in a container under `.test` names, real curl, git and python clients.

use std::time::{Duration, Instant};

use anyhow::Result;
use e2e::egress::{EgressStack, Upstream, gateway_of};
use e2e::{ControlPlane, DEBIAN, Session, docker, inspect};
use reqwest::Method;
use serde_json::{Value, json};

const SECRET: &str = "ghp_e2eSecretValue0123456789";

fn policy(token: &str) -> Value {
    json!({
        "policy": {
            "default": "deny",
            "intercept": "credentialed",
            "rules": [
                {"host": "api.upstream.test", "methods": ["GET", "POST"], "inject": "tok"},
                {"host": "*.upstream.test", "methods": ["*"]},
                {"host": "denied.upstream.test", "methods": ["GET"]}
            ]
        },
        "secrets": {"tok": {"header": "Authorization", "value": token}}
    })
}

fn strict_policy(token: &str) -> Value {
    json!({
        "policy": {
            "default": "deny",
            "intercept": "all",
            "rules": [
                {"host": "api.upstream.test", "methods": ["GET", "POST"], "inject": "tok"}
            ]
        },
        "secrets": {"tok": {"header": "Authorization", "value": token}}
    })
}

/// Runs one command in the session, returns (exit code, output).
async fn sh(cp: &ControlPlane, s: &Session, cmd: &str) -> Result<(i64, String)> {
    cp.sh(s, cmd).await
}

fn last_request(up: &Upstream, path: &str) -> Result<Option<Value>> {
    Ok(up.requests()?.into_iter().rev().find(|r| r["path"] == path))
}

#[tokio::test]
async fn egress_session_enforces_policy_and_confines_the_secret() -> Result<()> {
    let EgressStack { up, cp } = EgressStack::start().await?;
    let t0 = Instant::now();
    let s = cp
        .session(json!({"base_image": DEBIAN, "egress": strict_policy(SECRET)}))
        .await?;
    eprintln!("egress session created in {:?}", t0.elapsed());

    // Allowed, intercepted, credentialed: the upstream sees the injected header.
    let (code, out) = sh(&cp, &s, "curl -sS --fail https://api.upstream.test/curl").await?;
    assert_eq!(code, 0, "{out}");
    let seen = last_request(&up, "/curl")?.expect("upstream saw the request");
    assert_eq!(seen["headers"]["authorization"], SECRET);

    // The sandbox's own Authorization header is replaced, not forwarded.
    let (code, _) = sh(
        &cp,
        &s,
        "curl -sS --fail -H 'Authorization: forged' https://api.upstream.test/forged",
    )
    .await?;
    assert_eq!(code, 0);
    let seen = last_request(&up, "/forged")?.expect("seen");
    assert_eq!(seen["headers"]["authorization"], SECRET);

    // Python and git clients go through the proxy and trust the CA as well.
    let (code, out) = sh(
        &cp,
        &s,
        "python3 -c \"import urllib.request; print(urllib.request.urlopen('https://api.upstream.test/python').status)\"",
    )
    .await?;
    assert_eq!((code, out.trim()), (0, "200"));
    assert_eq!(
        last_request(&up, "/python")?.expect("seen")["headers"]["authorization"],
        SECRET
    );
    let (_, out) = sh(
        &cp,
        &s,
        "git ls-remote https://api.upstream.test/repo.git 2>&1; true",
    )
    .await?;
    let git = up.requests()?.into_iter().find(|r| {
        r["path"]
            .as_str()
            .unwrap_or("")
            .starts_with("/repo.git/info/refs")
    });
    assert!(git.is_some(), "git never reached the upstream: {out}");

    // A host the policy does not list: the gateway's 403 with its reason.
    let (_, out) = sh(
        &cp,
        &s,
        "curl -s -o /dev/null -w '%{http_connect}' https://other.upstream.test/x",
    )
    .await?;
    assert_eq!(out, "403", "CONNECT to an unlisted host");
    let (_, out) = sh(
        &cp,
        &s,
        "curl -s -D - -o /dev/null -X DELETE https://api.upstream.test/del",
    )
    .await?;
    assert!(
        out.contains("HTTP/1.1 403") || out.contains("HTTP/2 403"),
        "{out}"
    );
    assert!(
        out.to_ascii_lowercase()
            .contains("x-egress-denied: method-not-allowed"),
        "{out}"
    );
    assert!(last_request(&up, "/del")?.is_none());

    // Nothing bypasses the proxy: no route, no name resolution.
    let upstream_ip = docker(&[
        "inspect",
        "-f",
        &format!(
            "{{{{(index .NetworkSettings.Networks \"{}\").IPAddress}}}}",
            up.network
        ),
        &up.container,
    ])?;
    let (code, _) = sh(
        &cp,
        &s,
        &format!("curl -sS --noproxy '*' --max-time 5 -k https://{upstream_ip}/direct"),
    )
    .await?;
    assert_ne!(code, 0, "direct connection must fail");
    let (code, _) = sh(&cp, &s, "getent hosts api.upstream.test").await?;
    assert_ne!(
        code, 0,
        "the sandbox must not resolve upstream names itself"
    );
    assert!(last_request(&up, "/direct")?.is_none());

    // The secret is nowhere in the sandbox: environment, processes, files.
    // The pattern is split so the command itself does not carry the secret.
    let (head, tail) = SECRET.split_at(6);
    let (_, out) = sh(
        &cp,
        &s,
        &format!("env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; grep -rIl '{head}''{tail}' /workspace /home /tmp /etc /usr/local /root /var /run 2>/dev/null; echo end"),
    )
    .await?;
    assert!(!out.contains(SECRET), "secret visible in the sandbox");
    let (code, _) = sh(&cp, &s, "ls /etc/daiv-egress").await?;
    assert_ne!(code, 0, "gateway config must not exist in the sandbox");
    // Nor in the service's logs.
    let logs = cp.logs();
    let leak = logs
        .lines()
        .find(|l| l.contains(SECRET))
        .map(|l| l.chars().take(400).collect::<String>());
    assert!(leak.is_none(), "secret in the service's logs: {leak:?}");

    // The sandbox sits on the internal network only.
    let info = inspect(&s.id).expect("sandbox");
    let nets = info["NetworkSettings"]["Networks"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    assert_eq!(nets.len(), 1, "{nets:?}");
    let (net_name, _) = nets.iter().next().expect("one network");
    let internal = docker(&["network", "inspect", "-f", "{{.Internal}}", net_name])?;
    assert_eq!(internal, "true");
    Ok(())
}

#[tokio::test]
async fn credentialed_mode_tunnels_plain_hosts_and_plaintext_gets_no_credential() -> Result<()> {
    let EgressStack { up, cp } = EgressStack::start().await?;
    let s = cp
        .session(json!({"base_image": DEBIAN, "egress": policy(SECRET)}))
        .await?;
    // other.upstream.test is allowed without credential or restriction: tunnelled, so the client
    // sees the upstream's own certificate (issued by the upstream test CA), not a minted one.
    // (-k: the sandbox trusts public roots and the egress CA, not this test's upstream CA.)
    let (code, out) = sh(
        &cp,
        &s,
        "curl -sS -k --fail -v https://other.upstream.test/tunnel 2>&1",
    )
    .await?;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("issuer: CN=daiv e2e upstream CA"),
        "tunnelled: {out}"
    );
    let (_, out) = sh(&cp, &s, "curl -sS -v https://api.upstream.test/mitm 2>&1").await?;
    assert!(
        out.contains("issuer: CN=daiv e2e egress CA"),
        "intercepted: {out}"
    );
    // Plain HTTP to a host whose rule injects: refused (`tls-required`), never credentialed,
    // and nothing reaches the upstream.
    let (_, out) = sh(
        &cp,
        &s,
        "curl -s -D - -o /dev/null http://api.upstream.test/plain",
    )
    .await?;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    assert!(
        out.to_ascii_lowercase()
            .contains("x-egress-denied: tls-required"),
        "{out}"
    );
    assert!(
        last_request(&up, "/plain")?.is_none(),
        "plaintext reached the upstream"
    );
    Ok(())
}

#[tokio::test]
async fn put_egress_rotates_the_credential_without_restart() -> Result<()> {
    let EgressStack { up, cp } = EgressStack::start().await?;
    let s = cp
        .session(json!({"base_image": DEBIAN, "egress": strict_policy("old-token")}))
        .await?;
    let (code, _) = sh(&cp, &s, "curl -sS --fail https://api.upstream.test/before").await?;
    assert_eq!(code, 0);
    assert_eq!(
        last_request(&up, "/before")?.expect("seen")["headers"]["authorization"],
        "old-token"
    );
    let (_, gateway) = gateway_of(&s.id)?;
    let started = |id: &str| {
        inspect(id).map(|i| (i["State"]["StartedAt"].clone(), i["RestartCount"].clone()))
    };
    let gateway_started = started(&gateway);
    let sandbox_started = started(&s.id);
    assert!(gateway_started.is_some());

    let path = format!("/session/{}/egress/", s.id);
    let t0 = Instant::now();
    let (status, body) = cp
        .call(Method::PUT, &path, Some(strict_policy("new-token")))
        .await?;
    assert_eq!(status, 204, "{body}");
    // The next request carries the new credential (allow the gateway its reload).
    let mut seen_new = false;
    for i in 0..50 {
        let p = format!("/after{i}");
        sh(
            &cp,
            &s,
            &format!("curl -sS --fail https://api.upstream.test{p}"),
        )
        .await?;
        if last_request(&up, &p)?.expect("seen")["headers"]["authorization"] == "new-token" {
            seen_new = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("PUT /egress/ to effect: {:?}", t0.elapsed());
    assert!(seen_new, "the refreshed credential never took effect");
    assert_eq!(
        started(&gateway),
        gateway_started,
        "the gateway must not restart"
    );
    assert_eq!(
        started(&s.id),
        sandbox_started,
        "the sandbox must not restart"
    );

    // Invalid policies are refused and change nothing.
    let bad = json!({"policy": {"default": "deny", "rules": [{"host": "api.upstream.test", "inject": "missing"}]}});
    let (status, _) = cp.call(Method::PUT, &path, Some(bad)).await?;
    assert_eq!(status, 422);
    sh(
        &cp,
        &s,
        "curl -sS --fail https://api.upstream.test/unchanged",
    )
    .await?;
    assert_eq!(
        last_request(&up, "/unchanged")?.expect("seen")["headers"]["authorization"],
        "new-token"
    );

    // 404 and 409.
    let (status, _) = cp
        .call(
            Method::PUT,
            &format!("/session/{}/egress/", "0".repeat(64)),
            Some(strict_policy("x")),
        )
        .await?;
    assert_eq!(status, 404);
    let plain = cp.session_of(DEBIAN).await?;
    let (status, _) = cp
        .call(
            Method::PUT,
            &format!("/session/{}/egress/", plain.id),
            Some(strict_policy("x")),
        )
        .await?;
    assert_eq!(status, 409);
    Ok(())
}

#[tokio::test]
async fn stopped_egress_sessions_resume_and_force_close_leaves_nothing() -> Result<()> {
    let EgressStack { up, cp } = EgressStack::start().await?;
    let s = cp
        .session(json!({"base_image": DEBIAN, "egress": strict_policy(SECRET)}))
        .await?;
    let (token, _) = gateway_of(&s.id)?;
    assert!(!token.is_empty());
    let path = format!("/session/{}/", s.id);
    let (status, _) = cp.call(Method::DELETE, &path, None).await?;
    assert_eq!(status, 204);
    let running = docker(&[
        "ps",
        "-q",
        "--filter",
        &format!("label=daiv.sandbox.egress={token}"),
    ])?;
    assert!(
        running.is_empty(),
        "stop must stop the gateway too: {running}"
    );
    // The first command after the warm restart already reaches the proxy.
    let (code, out) = sh(&cp, &s, "curl -sS --fail https://api.upstream.test/resumed").await?;
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        last_request(&up, "/resumed")?.expect("seen")["headers"]["authorization"],
        SECRET
    );

    let (status, _) = cp
        .call(Method::DELETE, &format!("{path}?force=true"), None)
        .await?;
    assert_eq!(status, 204);
    let left = docker(&[
        "ps",
        "-aq",
        "--filter",
        &format!("label=daiv.sandbox.egress={token}"),
    ])?;
    assert!(left.is_empty(), "containers left: {left}");
    let nets = docker(&[
        "network",
        "ls",
        "-q",
        "--filter",
        &format!("label=daiv.sandbox.egress={token}"),
    ])?;
    assert!(nets.is_empty(), "networks left: {nets}");
    Ok(())
}

/// A gateway killed behind the service's back (crash, OOM, an operator's `docker kill`) is
/// started again by the next request, with the latest policy: the sandbox is not left cut off.
#[tokio::test]
async fn a_gateway_killed_behind_the_services_back_comes_back() -> Result<()> {
    let EgressStack { up, cp } = EgressStack::start().await?;
    let s = cp
        .session(json!({"base_image": DEBIAN, "egress": strict_policy("old-token")}))
        .await?;
    let path = format!("/session/{}/egress/", s.id);
    let (status, body) = cp
        .call(Method::PUT, &path, Some(strict_policy("latest-token")))
        .await?;
    assert_eq!(status, 204, "{body}");
    let (_, gateway) = gateway_of(&s.id)?;
    let started_at = |id: &str| inspect(id).map(|i| i["State"]["StartedAt"].clone());
    let before = started_at(&gateway);
    docker(&["kill", &gateway])?;
    assert_eq!(
        inspect(&gateway).expect("still there")["State"]["Running"],
        false
    );

    let (code, out) = sh(&cp, &s, "curl -sS --fail https://api.upstream.test/healed").await?;
    assert_eq!(
        code, 0,
        "the next command must reach the upstream again: {out}"
    );
    assert_eq!(
        last_request(&up, "/healed")?.expect("seen")["headers"]["authorization"],
        "latest-token",
        "the restarted gateway must enforce the latest policy"
    );
    assert_ne!(
        started_at(&gateway),
        before,
        "the same gateway, started again"
    );
    // A background process start heals it too (it takes no session lock).
    docker(&["kill", &gateway])?;
    let (status, body) = cp
        .call(
            Method::POST,
            &format!("/session/{}/processes/", s.id),
            Some(json!({"command": "curl -sS --fail https://api.upstream.test/healed-again"})),
        )
        .await?;
    assert_eq!(status, 201, "{body}");
    e2e::eventually(
        "the process reached the upstream",
        Duration::from_secs(30),
        || async { Ok(last_request(&up, "/healed-again")?.is_some().then_some(())) },
    )
    .await?;
    // Removed outright, it cannot come back: a clear 503, never a half-alive session.
    docker(&["rm", "-f", &gateway])?;
    let (status, body) = cp
        .call(
            Method::POST,
            &format!("/session/{}/", s.id),
            Some(json!({"commands": ["true"]})),
        )
        .await?;
    assert_eq!(status, 503, "{body}");
    assert!(!body.to_string().contains("No such container"), "{body}");
    cp.force_close(&s).await?;
    Ok(())
}

#[tokio::test]
async fn invalid_or_unconfigured_egress_is_refused() -> Result<()> {
    let EgressStack { up: _up, cp } = EgressStack::start().await?;
    for bad in [
        json!({"policy": {"default": "deny", "rules": []}}),
        json!({"policy": {"default": "sometimes"}}),
        json!({"policy": {"rules": [{"host": "a.test", "methods": []}]}}),
        json!({"policy": {"rules": [{"host": "a.test"}]}, "secrets": {"s": {"header": "Bad Header", "value": "v"}}}),
    ] {
        let (status, body) = cp
            .call(
                Method::POST,
                "/session/",
                Some(json!({"base_image": DEBIAN, "egress": bad})),
            )
            .await?;
        assert_eq!(status, 422, "{body}");
    }
    let plain = ControlPlane::start().await?;
    let (status, body) = plain
        .call(
            Method::POST,
            "/session/",
            Some(json!({"base_image": DEBIAN, "egress": strict_policy("x")})),
        )
        .await?;
    assert_eq!(status, 400, "{body}");
    Ok(())
}

#[tokio::test]
async fn gvisor_sandboxes_reach_their_gateway_on_runc() -> Result<()> {
    let EgressStack { up, cp } = EgressStack::start_with(&[("RUNTIME", "runsc")]).await?;
    let s = cp
        .session(json!({"base_image": DEBIAN, "egress": strict_policy(SECRET)}))
        .await?;
    let sandbox = inspect(&s.id).expect("sandbox");
    assert_eq!(sandbox["HostConfig"]["Runtime"], "runsc");
    let (_, gateway) = gateway_of(&s.id)?;
    assert_eq!(
        inspect(&gateway).expect("gateway")["HostConfig"]["Runtime"],
        "runc"
    );
    let (_, dmesg) = sh(&cp, &s, "dmesg | head -1").await?;
    assert!(dmesg.contains("gVisor"), "{dmesg}");
    let (code, out) = sh(&cp, &s, "curl -sS --fail https://api.upstream.test/gvisor").await?;
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        last_request(&up, "/gvisor")?.expect("seen")["headers"]["authorization"],
        SECRET
    );
    Ok(())
}

/// The probe a sandbox runs: TCP connects and UDP datagrams to every address of its /29 but its
/// own and its gateway's, and to the host's address on the gateway's egress-side network (a
/// network this test created). Prints one line per target.
const PROBE: &str = r#"
import socket, sys
port_tcp, port_udp = int(sys.argv[1]), int(sys.argv[2])
for ip in sys.argv[3:]:
    s = socket.socket(); s.settimeout(1.5)
    try:
        s.connect((ip, port_tcp)); print(ip, "tcp", "CONNECTED")
    except Exception as e:
        print(ip, "tcp", type(e).__name__)
    finally:
        s.close()
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        u.sendto(b"daiv-probe", (ip, port_udp)); print(ip, "udp", "sent")
    except Exception as e:
        print(ip, "udp", type(e).__name__)
    finally:
        u.close()
"#;

/// Issue 10 #1: the host keeps no address on a session's internal network, so nothing the host
/// listens on (on 0.0.0.0 or on what would be the bridge's address) is reachable from the
/// sandbox, under runc and gVisor, while the gateway still works.
async fn the_host_is_unreachable_from_an_egress_sandbox(runtime: &str) -> Result<()> {
    use std::net::{TcpListener, UdpSocket};
    let EgressStack { up, cp } = EgressStack::start_with(&[("RUNTIME", runtime)]).await?;
    let tcp = TcpListener::bind("0.0.0.0:0")?;
    tcp.set_nonblocking(true)?;
    let udp = UdpSocket::bind("0.0.0.0:0")?;
    udp.set_nonblocking(true)?;
    let (tcp_port, udp_port) = (tcp.local_addr()?.port(), udp.local_addr()?.port());

    let s = cp
        .session(json!({"base_image": DEBIAN, "egress": strict_policy(SECRET)}))
        .await?;
    let sandbox = inspect(&s.id).expect("sandbox");
    let nets = sandbox["NetworkSettings"]["Networks"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    assert_eq!(nets.len(), 1, "the sandbox is on its internal network only");
    let (net_name, endpoint) = nets.iter().next().expect("one network");
    let net = docker(&["network", "inspect", net_name])?;
    let net: Value = serde_json::from_str(&net)?;
    let net = &net[0];
    assert_eq!(
        net["Options"]["com.docker.network.bridge.inhibit_ipv4"],
        "true"
    );
    let net_id = net["Id"].as_str().unwrap_or_default();
    // No host interface holds an address on the bridge of this network.
    let bridge = format!("br-{}", &net_id[..12]);
    let addrs = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "dev", &bridge])
        .output()?;
    assert!(
        String::from_utf8_lossy(&addrs.stdout).trim().is_empty(),
        "the host has an address on {bridge}: {}",
        String::from_utf8_lossy(&addrs.stdout)
    );
    let own: std::net::Ipv4Addr = endpoint["IPAddress"].as_str().unwrap_or_default().parse()?;
    let base = u32::from(own) & !7;
    let gateway_ip = std::net::Ipv4Addr::from(base + 2);
    let mut targets: Vec<String> = [1u32, 4, 5, 6]
        .iter()
        .map(|o| std::net::Ipv4Addr::from(base + o).to_string())
        .collect();
    // The host's own address on the egress-side network the test created.
    let up_host: std::net::Ipv4Addr = up.subnet.split('/').next().unwrap_or_default().parse()?;
    targets.push(std::net::Ipv4Addr::from(u32::from(up_host) + 1).to_string());
    // The gateway's own address on another port: only its proxy port listens there.
    targets.push(gateway_ip.to_string());

    let script = format!(
        "python3 -c '{}' {tcp_port} {udp_port} {}",
        PROBE.replace('\'', "'\\''"),
        targets.join(" ")
    );
    let (code, out) = sh(&cp, &s, &script).await?;
    assert_eq!(code, 0, "{out}");
    assert!(
        !out.contains("CONNECTED"),
        "a host listener was reached:\n{out}"
    );
    assert_eq!(
        out.lines().filter(|l| l.contains(" tcp ")).count(),
        targets.len(),
        "{out}"
    );
    assert!(
        matches!(tcp.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the host's TCP listener accepted a connection"
    );
    let mut buf = [0u8; 64];
    assert!(
        matches!(udp.recv_from(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the host's UDP socket got a datagram from the sandbox"
    );
    // And the one way out still works.
    let (code, out) = sh(&cp, &s, "curl -sS --fail https://api.upstream.test/reach").await?;
    assert_eq!(code, 0, "{out}");
    assert!(last_request(&up, "/reach")?.is_some());
    Ok(())
}

#[tokio::test]
async fn the_host_is_unreachable_from_an_egress_sandbox_on_runc() -> Result<()> {
    the_host_is_unreachable_from_an_egress_sandbox("runc").await
}

#[tokio::test]
async fn the_host_is_unreachable_from_an_egress_sandbox_on_gvisor() -> Result<()> {
    the_host_is_unreachable_from_an_egress_sandbox("runsc").await
}
