//! What an engine endpoint is: the fleet's engines file names each engine by one, the settings
//! check it, and the Docker adapter connects through it.

use std::path::PathBuf;

use serde::Deserialize;

/// Mutual TLS for a `tcp://` endpoint: the CA that signed the engine's certificate, and the
/// client certificate and key the engine checks.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Unix,
    Tcp,
}

/// What an endpoint is, when it is one we reach.
pub fn endpoint_kind(endpoint: &str) -> Option<Endpoint> {
    if let Some(path) = endpoint.strip_prefix("unix://") {
        return path.starts_with('/').then_some(Endpoint::Unix);
    }
    let rest = endpoint.strip_prefix("tcp://")?;
    let (host, port) = rest.rsplit_once(':')?;
    let ok = !host.is_empty()
        && !host.contains('/')
        && port.parse::<u16>().is_ok_and(|p| p > 0)
        && !rest.contains('@');
    ok.then_some(Endpoint::Tcp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_unix_paths_or_tcp_host_ports() {
        assert_eq!(
            endpoint_kind("unix:///var/run/docker.sock"),
            Some(Endpoint::Unix)
        );
        assert_eq!(endpoint_kind("tcp://10.0.0.2:2376"), Some(Endpoint::Tcp));
        assert_eq!(endpoint_kind("tcp://[::1]:2376"), Some(Endpoint::Tcp));
        assert_eq!(endpoint_kind("unix://relative"), None);
        assert_eq!(endpoint_kind("tcp://host:0"), None);
        assert_eq!(endpoint_kind("tcp://user@host:1"), None);
        assert_eq!(endpoint_kind("ssh://host"), None);
    }
}
