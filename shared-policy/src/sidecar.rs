//! The sidecar contract: how the control plane installs a gateway and how the gateway reads its
//! configuration. One typed description, used by both sides (the control plane's `egress.rs`
//! builds the container from it, the gateway's `config.rs` takes its defaults and environment
//! names from it), so neither repeats the other's strings. Data only: no I/O here.
//!
//! # Policy installation (atomic, acknowledged)
//! The gateway enforces [`POLICY_FILE`] and reloads it only when the file is *replaced* (a new
//! inode: a rename over it), never on an in-place write (which a reader can see half-done). A
//! writer that cannot rename inside the container (the image is `FROM scratch`; `put_archive`
//! extracts in place) writes [`POLICY_STAGING_FILE`] beside it instead: the gateway reads the
//! staged file, and once it is one complete JSON document (a strict prefix of a JSON object never
//! parses), copies it to a temporary file and renames that over [`POLICY_FILE`] itself. The
//! file's `version` is then reported by `GET` [`HEALTH_PATH`] (header [`VERSION_HEADER`]) on the
//! gateway's health listener ([`DEFAULT_HEALTH_LISTEN`], loopback in the gateway's own network
//! namespace: never the proxy port, which the sandbox reaches and can fill), which the control
//! plane polls with [`HEALTH_SUBCOMMAND`] run inside the gateway until it reports the version it
//! wrote.

/// The directory the image reads its configuration from (created empty, owned by [`UID`]).
pub const CONFIG_DIR: &str = "/etc/daiv-egress";
/// `CONFIG_DIR/POLICY_FILE`, the gateway's default policy path.
pub const DEFAULT_POLICY_PATH: &str = "/etc/daiv-egress/config.json";
/// `CONFIG_DIR/CA_CERT_FILE`.
pub const DEFAULT_CA_CERT_PATH: &str = "/etc/daiv-egress/ca.crt";
/// `CONFIG_DIR/CA_KEY_FILE`.
pub const DEFAULT_CA_KEY_PATH: &str = "/etc/daiv-egress/ca.key";
/// The policy file's name in [`CONFIG_DIR`].
pub const POLICY_FILE: &str = "config.json";
/// Where a writer that cannot rename puts a new policy; the gateway promotes it.
pub const POLICY_STAGING_FILE: &str = "config.json.staged";
/// The CA certificate's name in [`CONFIG_DIR`].
pub const CA_CERT_FILE: &str = "ca.crt";
/// The CA key's name in [`CONFIG_DIR`].
pub const CA_KEY_FILE: &str = "ca.key";
/// The optional extra upstream bundle's name in [`CONFIG_DIR`].
pub const UPSTREAM_CA_FILE: &str = "upstream-ca.pem";
/// The image's entrypoint (a static binary; the image has no shell).
pub const BINARY: &str = "/daiv-egress-gateway";
/// The non-root uid (and gid) the gateway runs as; its files are owned by it.
pub const UID: u32 = 65532;
/// The port the gateway listens on by default.
pub const DEFAULT_PORT: u16 = 8080;
/// Logged (stderr, JSON) once the gateway accepts connections.
pub const READY_LINE: &str = "egress gateway listening";
/// Where the gateway answers [`HEALTH_PATH`] by default: loopback, so only processes in the
/// gateway's own network namespace (an exec inside it) reach it, never the sandbox.
pub const DEFAULT_HEALTH_LISTEN: &str = "127.0.0.1:8081";
/// Path answered with `200` on the health listener.
pub const HEALTH_PATH: &str = "/-/health/";
/// Response header of [`HEALTH_PATH`]: the `version` of the policy enforced.
pub const VERSION_HEADER: &str = "x-egress-policy-version";
/// `daiv-egress-gateway health`: asks the running gateway's health endpoint (exit 0 when it
/// enforces `--expect-version`).
pub const HEALTH_SUBCOMMAND: &str = "health";

/// The environment variables the gateway reads (each also a `--flag`).
pub mod env {
    /// Listen address (`IP:PORT`).
    pub const LISTEN: &str = "DAIV_EGRESS_LISTEN";
    /// Policy file path.
    pub const POLICY_FILE: &str = "DAIV_EGRESS_POLICY_FILE";
    /// CA certificate path.
    pub const CA_CERT_FILE: &str = "DAIV_EGRESS_CA_CERT_FILE";
    /// CA key path.
    pub const CA_KEY_FILE: &str = "DAIV_EGRESS_CA_KEY_FILE";
    /// Extra upstream CA bundle path.
    pub const UPSTREAM_CA_FILE: &str = "DAIV_EGRESS_UPSTREAM_CA_FILE";
    /// Comma-separated CIDRs that may be reached although not global.
    pub const ALLOWED_CIDRS: &str = "DAIV_EGRESS_ALLOWED_CIDRS";
    /// Session id in audit lines.
    pub const SESSION_ID: &str = "DAIV_EGRESS_SESSION_ID";
    /// `NAME=IP` pairs answered without DNS.
    pub const STATIC_HOSTS: &str = "DAIV_EGRESS_STATIC_HOSTS";
    /// Connection cap.
    pub const MAX_CONNECTIONS: &str = "DAIV_EGRESS_MAX_CONNECTIONS";
    /// Report-only mode for every policy (`true`/`false`).
    pub const SHADOW: &str = "DAIV_EGRESS_SHADOW";
    /// Address of the Prometheus endpoint (off when unset).
    pub const METRICS_LISTEN: &str = "DAIV_EGRESS_METRICS_LISTEN";
    /// HTTP proxy all upstream connections go through (off when unset).
    pub const UPSTREAM_PROXY: &str = "DAIV_EGRESS_UPSTREAM_PROXY";
    /// Address of the health listener (`IP:PORT`), read by the server and by `health`.
    pub const HEALTH_LISTEN: &str = "DAIV_EGRESS_HEALTH_LISTEN";
    /// Comma-separated `host` / `host:port` reachable in plain HTTP on private addresses, with
    /// their credential (development stacks; off when unset).
    pub const PLAIN_HTTP_HOSTS: &str = "DAIV_EGRESS_PLAIN_HTTP_HOSTS";
}

/// One entry of the plain-HTTP opt-in ([`env::PLAIN_HTTP_HOSTS`]): an exact host (no globs: a
/// credential is about to travel in clear, so each name is spelled out), on any port or on one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainHttpHost {
    /// The normalised host.
    pub host: crate::Host,
    /// The only port it applies to, if given.
    pub port: Option<u16>,
}

impl PlainHttpHost {
    /// Parses `host` or `host:port` (IPv6 in brackets when a port follows).
    pub fn parse(entry: &str) -> Result<Self, String> {
        let entry = entry.trim();
        if entry.contains(['*', '?']) {
            return Err(format!("{entry:?}: exact host names only, no globs"));
        }
        let (host, port) =
            crate::Host::parse_authority(entry).map_err(|e| format!("{entry:?}: {e}"))?;
        Ok(Self { host, port })
    }

    /// A comma-separated list; empty items are ignored.
    pub fn parse_list(text: &str) -> Result<Vec<Self>, String> {
        text.split(',')
            .filter(|s| !s.trim().is_empty())
            .map(Self::parse)
            .collect()
    }

    /// Whether a request to `host:port` is covered.
    pub fn matches(&self, host: &crate::Host, port: u16) -> bool {
        self.host == *host && self.port.is_none_or(|p| p == port)
    }
}

impl std::fmt::Display for PlainHttpHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}:{port}", self.host),
            None => write!(f, "{}", self.host),
        }
    }
}

/// `CONFIG_DIR/name`.
pub fn config_path(name: &str) -> String {
    format!("{CONFIG_DIR}/{name}")
}

/// The staging file's path for a policy file path (same directory, [`POLICY_STAGING_FILE`]'s
/// suffix): `/x/config.json` → `/x/config.json.staged`.
pub fn staging_path_for(policy_path: &std::path::Path) -> std::path::PathBuf {
    let mut name = policy_path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(
        POLICY_STAGING_FILE
            .strip_prefix(POLICY_FILE)
            .unwrap_or(".staged"),
    );
    policy_path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_paths_are_in_the_config_dir() {
        assert_eq!(DEFAULT_POLICY_PATH, config_path(POLICY_FILE));
        assert_eq!(DEFAULT_CA_CERT_PATH, config_path(CA_CERT_FILE));
        assert_eq!(DEFAULT_CA_KEY_PATH, config_path(CA_KEY_FILE));
    }

    #[test]
    fn plain_http_hosts_are_exact_names_with_an_optional_port() {
        let list = PlainHttpHost::parse_list(" GitLab.test:8929, registry.test,,[fd00::5]:80")
            .expect("list");
        let shown: Vec<String> = list.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["gitlab.test:8929", "registry.test", "[fd00::5]:80"]);
        let host = |s| crate::Host::parse(s).expect("host");
        assert!(list[0].matches(&host("gitlab.test"), 8929));
        assert!(!list[0].matches(&host("gitlab.test"), 80));
        assert!(list[1].matches(&host("registry.test"), 5000));
        assert!(!list[1].matches(&host("a.registry.test"), 5000));
        for bad in [
            "*.test",
            "gitlab?.test",
            "gitlab.test:0",
            "git lab",
            "a.test:x",
        ] {
            assert!(PlainHttpHost::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn staging_sits_beside_the_policy() {
        assert_eq!(
            staging_path_for(std::path::Path::new(&config_path(POLICY_FILE))),
            std::path::PathBuf::from(config_path(POLICY_STAGING_FILE))
        );
        assert_eq!(
            staging_path_for(std::path::Path::new("/tmp/p.json")),
            std::path::PathBuf::from("/tmp/p.json.staged")
        );
    }
}
