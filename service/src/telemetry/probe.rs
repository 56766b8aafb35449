//! `daiv-sandbox healthcheck`: the container image's HEALTHCHECK. The image is `scratch` (no
//! curl, no shell), so the binary probes itself: GET `/-/health/` on the port it serves, exit 0
//! on 200, 1 otherwise. Plain std I/O: no runtime, no settings beyond host and port, no API key.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(5);

/// The probe's exit code.
pub fn healthcheck() -> i32 {
    let env = |k: &str| std::env::var(format!("{}{k}", crate::config::PREFIX)).ok();
    let port = env("PORT").and_then(|p| p.parse().ok()).unwrap_or(8000u16);
    // Listening on every address (the default) means loopback answers too.
    let host = env("HOST")
        .and_then(|h| h.parse::<IpAddr>().ok())
        .filter(|h| !h.is_unspecified())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    match probe(SocketAddr::new(host, port)) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("healthcheck: {e}");
            1
        }
    }
}

fn probe(addr: SocketAddr) -> std::io::Result<bool> {
    let mut conn = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    conn.set_read_timeout(Some(TIMEOUT))?;
    conn.set_write_timeout(Some(TIMEOUT))?;
    conn.write_all(b"GET /-/health/ HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut head = [0u8; 32];
    let n = conn.read(&mut head)?;
    let line = String::from_utf8_lossy(&head[..n]);
    Ok(line.starts_with("HTTP/1.1 200") || line.starts_with("HTTP/1.0 200"))
}
