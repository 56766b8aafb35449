//! Command line and environment. Every serve flag has a `DAIV_EGRESS_*` variable, so a container
//! is configured by environment alone; the operator subcommands take flags.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use ipnet::IpNet;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use crate::GatewayConfig;
use crate::audit::AuditSink;
use crate::error::ConfigError;

use shared_policy::sidecar::{self, env};

/// Default locations inside the gateway image (the sidecar contract).
pub const DEFAULT_POLICY_FILE: &str = sidecar::DEFAULT_POLICY_PATH;
/// CA certificate default path.
pub const DEFAULT_CA_CERT_FILE: &str = sidecar::DEFAULT_CA_CERT_PATH;
/// CA key default path.
pub const DEFAULT_CA_KEY_FILE: &str = sidecar::DEFAULT_CA_KEY_PATH;

/// `daiv-egress-gateway`: with no subcommand, runs the proxy.
#[derive(Debug, Parser)]
#[command(
    name = "daiv-egress-gateway",
    version,
    about = "Policy-driven egress proxy for daiv-sandbox sessions"
)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// Operator tools; without one, the proxy runs.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Proxy settings.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// Proxy settings.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on (the proxy).
    #[arg(long, env = env::LISTEN, default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// Address of the health endpoint (`GET /-/health/`, with the enforced policy's version).
    /// Loopback by default: reachable from inside the gateway's network namespace only (the
    /// `health` subcommand run in the gateway), never by the clients of the proxy.
    #[arg(long, env = env::HEALTH_LISTEN, default_value = sidecar::DEFAULT_HEALTH_LISTEN)]
    pub health_listen: SocketAddr,
    /// Policy file (`{"policy": ..., "secrets": ...}`), hot-reloaded; missing or invalid = deny all.
    #[arg(long, env = env::POLICY_FILE, default_value = DEFAULT_POLICY_FILE)]
    pub policy_file: PathBuf,
    /// CA certificate (PEM) used to sign minted leaves.
    #[arg(long, env = env::CA_CERT_FILE, default_value = DEFAULT_CA_CERT_FILE)]
    pub ca_cert_file: PathBuf,
    /// CA private key (PEM, PKCS#8: ECDSA P-256/P-384, Ed25519 or RSA).
    #[arg(long, env = env::CA_KEY_FILE, default_value = DEFAULT_CA_KEY_FILE)]
    pub ca_key_file: PathBuf,
    /// Extra CA bundle (PEM) trusted for upstream servers, on top of the built-in web PKI roots.
    #[arg(long, env = env::UPSTREAM_CA_FILE)]
    pub upstream_ca_file: Option<PathBuf>,
    /// Comma-separated CIDRs of non-global addresses that may still be reached.
    #[arg(long, env = env::ALLOWED_CIDRS, value_delimiter = ',')]
    pub allowed_cidrs: Vec<IpNet>,
    /// Session id recorded in every audit line.
    #[arg(long, env = env::SESSION_ID, default_value = "")]
    pub session_id: String,
    /// `NAME=IP` pairs answered without DNS (comma-separated in the variable). Answers are still
    /// subject to the address guard. For tests and benchmarks.
    #[arg(long = "static-host", env = env::STATIC_HOSTS, value_delimiter = ',', value_parser = parse_static_host)]
    pub static_hosts: Vec<(String, IpAddr)>,
    /// Client connections served at once (tunnels and MITM sessions included); more are closed
    /// at accept. Bounds the memory a sandbox can make the gateway use.
    #[arg(long, env = env::MAX_CONNECTIONS, default_value_t = crate::proxy::DEFAULT_MAX_CONNECTIONS, value_parser = parse_max_connections)]
    pub max_connections: usize,
    /// Report-only: every policy decision is evaluated and audited, but policy denials are let
    /// through (audit `"enforced": false`, no credential). A missing or invalid policy and the
    /// hardening checks are still enforced.
    #[arg(long, env = env::SHADOW)]
    pub shadow: bool,
    /// Serve Prometheus metrics (`GET /metrics`) on this address, a listener of its own (never
    /// the proxy port). Off when unset. Bind it where only the operator's scraper reaches.
    #[arg(long, env = env::METRICS_LISTEN)]
    pub metrics_listen: Option<SocketAddr>,
    /// Send all upstream connections through this HTTP proxy
    /// (`http://[user:password@]host:port`): CONNECT to the address the gateway resolved and
    /// checked (the SSRF guard still applies to the destination).
    #[arg(long, env = env::UPSTREAM_PROXY, value_parser = parse_upstream_proxy)]
    pub upstream_proxy: Option<crate::proxy::upstream::UpstreamProxy>,
    /// Comma-separated `host` or `host:port` (exact names) that may be reached in plain HTTP
    /// (absolute-form requests) on private networks (RFC 1918, IPv6 ULA) and get their rule's
    /// credential there, in clear. For development stacks (a GitLab at `http://gitlab:8929` on
    /// a compose network); off by default. The policy still decides; a listed host is never
    /// dialled on a loopback, link-local or public address.
    #[arg(long, env = env::PLAIN_HTTP_HOSTS, value_delimiter = ',', value_parser = parse_plain_http_host)]
    pub plain_http_hosts: Vec<sidecar::PlainHttpHost>,
}

fn parse_plain_http_host(s: &str) -> Result<sidecar::PlainHttpHost, String> {
    sidecar::PlainHttpHost::parse(s)
}

fn parse_upstream_proxy(s: &str) -> Result<crate::proxy::upstream::UpstreamProxy, String> {
    crate::proxy::upstream::UpstreamProxy::parse(s)
}

/// Operator subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check or explain a policy file.
    Policy {
        /// What to do.
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Ask a running gateway's health endpoint which policy version it enforces (exit 0 when it
    /// answers, and enforces `--expect-version` if given, within `--timeout-ms`; 1 otherwise).
    Health {
        /// The gateway's health listener (`0.0.0.0` / `::` mean this host).
        #[arg(long, env = env::HEALTH_LISTEN, default_value = sidecar::DEFAULT_HEALTH_LISTEN)]
        health_listen: SocketAddr,
        /// Wait until the gateway enforces this policy version.
        #[arg(long)]
        expect_version: Option<String>,
        /// How long to keep asking.
        #[arg(long, default_value_t = 5000)]
        timeout_ms: u64,
    },
    /// Write a new CA certificate and key (key file mode 0600).
    GenCa {
        /// Where to write the certificate (PEM).
        #[arg(long)]
        cert_out: PathBuf,
        /// Where to write the private key (PEM, PKCS#8).
        #[arg(long)]
        key_out: PathBuf,
        /// Subject common name.
        #[arg(long, default_value = "daiv-sandbox-egress")]
        common_name: String,
        /// Overwrite existing files.
        #[arg(long)]
        force: bool,
    },
}

/// `policy ...`
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Validate a policy file: exit 0 when the gateway would enforce it, 1 otherwise.
    Check {
        /// The policy file.
        file: PathBuf,
        /// Also apply the API's rule (a deny-default policy needs at least one rule).
        #[arg(long)]
        api: bool,
    },
    /// Show what the policy decides for a host and method, and why.
    Explain {
        /// The policy file.
        file: PathBuf,
        /// Destination host (a port is ignored).
        #[arg(long)]
        host: String,
        /// HTTP method.
        #[arg(long, default_value = "GET")]
        method: String,
        /// Request path (no query string); without it, rules restricted to paths do not apply.
        #[arg(long)]
        path: Option<String>,
        /// Explain as a gateway started with `--shadow` would decide.
        #[arg(long)]
        shadow: bool,
    },
}

fn parse_static_host(s: &str) -> Result<(String, IpAddr), String> {
    let (name, ip) = s.split_once('=').ok_or("expected NAME=IP")?;
    let host = shared_policy::Host::parse(name).map_err(|e| format!("{name:?}: {e}"))?;
    let ip = ip
        .parse()
        .map_err(|_| format!("{ip:?} is not an IP address"))?;
    Ok((host.as_str().to_owned(), ip))
}

fn parse_max_connections(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) | Err(_) => Err(format!("{s:?} is not a positive number")),
        Ok(n) => Ok(n),
    }
}

// === impl ServeArgs ===

impl ServeArgs {
    /// Reads the files the flags name into a [`GatewayConfig`]; every problem names its file.
    pub fn load(&self, audit: Arc<dyn AuditSink>) -> Result<GatewayConfig, ConfigError> {
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                path: p.to_owned(),
                source,
            })
        };
        let extra_roots = match &self.upstream_ca_file {
            Some(path) => load_bundle(path)?,
            None => Vec::new(),
        };
        let mut static_hosts: HashMap<String, Vec<IpAddr>> = HashMap::new();
        for (name, ip) in &self.static_hosts {
            static_hosts.entry(name.clone()).or_default().push(*ip);
        }
        Ok(GatewayConfig {
            policy_path: self.policy_file.clone(),
            ca_cert_pem: read(&self.ca_cert_file)?,
            ca_key_pem: read(&self.ca_key_file)?,
            extra_roots,
            allowed_cidrs: self.allowed_cidrs.clone(),
            static_hosts,
            session_id: self.session_id.clone(),
            audit,
            limits: crate::Limits {
                max_connections: self.max_connections,
                ..crate::Limits::default()
            },
            shadow: self.shadow,
            upstream_proxy: self.upstream_proxy.clone(),
            plain_http_hosts: self.plain_http_hosts.clone(),
        })
    }
}

/// All certificates of a PEM bundle; an empty or unparsable bundle is an error, not a no-op.
pub fn load_bundle(path: &Path) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let bytes = std::fs::read(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ConfigError::Bundle {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(ConfigError::Bundle {
            path: path.to_owned(),
            reason: "no certificate found".into(),
        });
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_flags() {
        let cli = Cli::try_parse_from([
            "daiv-egress-gateway",
            "--listen",
            "127.0.0.1:9000",
            "--allowed-cidrs",
            "127.0.0.0/8,10.0.0.0/8",
            "--static-host",
            "Upstream.Test=127.0.0.1",
        ])
        .expect("parse");
        assert!(cli.command.is_none());
        assert_eq!(cli.serve.allowed_cidrs.len(), 2);
        assert_eq!(
            cli.serve.static_hosts,
            vec![("upstream.test".to_owned(), IpAddr::from([127, 0, 0, 1]))]
        );
        let cli = Cli::try_parse_from(["x", "policy", "explain", "f.json", "--host", "a.test"])
            .expect("parse");
        assert!(matches!(
            cli.command,
            Some(Command::Policy {
                command: PolicyCommand::Explain { .. }
            })
        ));
        assert!(Cli::try_parse_from(["x", "--static-host", "nope"]).is_err());
        // The plain-HTTP opt-in: off by default, exact names with an optional port.
        assert!(cli_serve(&[]).is_some_and(|s| s.plain_http_hosts.is_empty()));
        let listed = cli_serve(&["--plain-http-hosts", "GitLab.test:8929,registry.test"])
            .map(|s| s.plain_http_hosts)
            .unwrap_or_default();
        let shown: Vec<String> = listed.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["gitlab.test:8929", "registry.test"]);
        assert!(cli_serve(&["--plain-http-hosts", "*.gitlab.test"]).is_none());
        // The health listener: loopback unless said otherwise.
        assert_eq!(
            cli_serve(&[]).map(|s| s.health_listen),
            Some(SocketAddr::from(([127, 0, 0, 1], 8081)))
        );
        assert_eq!(
            cli_max_connections(&[]),
            Some(crate::proxy::DEFAULT_MAX_CONNECTIONS)
        );
        assert_eq!(cli_max_connections(&["--max-connections", "8"]), Some(8));
        assert_eq!(cli_max_connections(&["--max-connections", "0"]), None);
    }

    fn cli_max_connections(args: &[&str]) -> Option<usize> {
        cli_serve(args).map(|s| s.max_connections)
    }

    fn cli_serve(args: &[&str]) -> Option<ServeArgs> {
        let argv = std::iter::once("x").chain(args.iter().copied());
        Cli::try_parse_from(argv).ok().map(|c| c.serve)
    }

    /// The contract test, gateway side: every environment variable the gateway reads is one of
    /// `shared_policy::sidecar::env` (the names the control plane sets), and the defaults are the
    /// contract's paths. The control plane's side is `control-plane/tests/router.rs`.
    #[test]
    fn reads_the_sidecar_contract() {
        use clap::CommandFactory;
        let cmd = Cli::command();
        let read: std::collections::BTreeSet<String> = cmd
            .get_arguments()
            .filter_map(|a| a.get_env())
            .map(|e| e.to_string_lossy().into_owned())
            .collect();
        let contract: std::collections::BTreeSet<String> = [
            env::LISTEN,
            env::POLICY_FILE,
            env::CA_CERT_FILE,
            env::CA_KEY_FILE,
            env::UPSTREAM_CA_FILE,
            env::ALLOWED_CIDRS,
            env::SESSION_ID,
            env::STATIC_HOSTS,
            env::MAX_CONNECTIONS,
            env::SHADOW,
            env::METRICS_LISTEN,
            env::UPSTREAM_PROXY,
            env::HEALTH_LISTEN,
            env::PLAIN_HTTP_HOSTS,
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        assert_eq!(read, contract);
        let cli = Cli::try_parse_from(["x"]).expect("parse");
        assert_eq!(
            cli.serve.policy_file,
            PathBuf::from(sidecar::DEFAULT_POLICY_PATH)
        );
        assert_eq!(
            cli.serve.ca_cert_file,
            PathBuf::from(sidecar::DEFAULT_CA_CERT_PATH)
        );
        assert_eq!(
            cli.serve.ca_key_file,
            PathBuf::from(sidecar::DEFAULT_CA_KEY_PATH)
        );
        assert_eq!(cli.serve.listen.port(), sidecar::DEFAULT_PORT);
        // The control plane's acknowledgement command parses here.
        let ack = Cli::try_parse_from([
            sidecar::BINARY,
            sidecar::HEALTH_SUBCOMMAND,
            "--timeout-ms",
            "5000",
            "--expect-version",
            "hmac:0123456789abcdef0123456789abcdef",
        ])
        .expect("health parses");
        // It asks the health listener the gateway serves, by the same variable.
        let Some(Command::Health { health_listen, .. }) = ack.command else {
            panic!("not the health subcommand");
        };
        assert_eq!(health_listen, cli.serve.health_listen);
        let health_env = Cli::command()
            .find_subcommand(sidecar::HEALTH_SUBCOMMAND)
            .and_then(|c| {
                c.get_arguments()
                    .find_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
            });
        assert_eq!(health_env.as_deref(), Some(env::HEALTH_LISTEN));
    }

    #[test]
    fn a_ca_cert_without_its_key_is_a_config_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, _key) = crate::ca::generate_ca("t").expect("ca");
        std::fs::write(dir.path().join("ca.crt"), cert).expect("write");
        let cli = Cli::try_parse_from([
            "x".as_ref(),
            "--ca-cert-file".as_ref(),
            dir.path().join("ca.crt").as_os_str(),
            "--ca-key-file".as_ref(),
            dir.path().join("ca.key").as_os_str(),
        ])
        .expect("parse");
        let err = cli
            .serve
            .load(Arc::new(crate::audit::MemorySink::default()))
            .err()
            .expect("missing key");
        assert!(
            matches!(err, ConfigError::Read { ref path, .. } if path.ends_with("ca.key")),
            "{err}"
        );
        // An upstream bundle without certificates is refused, not ignored.
        std::fs::write(dir.path().join("empty.pem"), "").expect("write");
        assert!(matches!(
            load_bundle(&dir.path().join("empty.pem")),
            Err(ConfigError::Bundle { .. })
        ));
    }
}
