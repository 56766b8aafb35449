//! Egress sessions: the gateway sidecar (image, port, runtime, network, limits), the CA it mints
//! leaves with, what it may reach and how, and the address pool of the per-session networks.

use std::path::{Path, PathBuf};

use super::parse::Parser;
use super::sessions::{RUNTIMES, Runtime};
use super::{PREFIX, Secret};

#[derive(Debug, Clone)]
pub struct EgressCa {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

#[derive(Debug, Clone)]
pub struct EgressConfig {
    pub proxy_image: String,
    pub proxy_port: u16,
    pub proxy_runtime: Runtime,
    pub proxy_network: Option<String>,
    pub proxy_memory_bytes: Option<i64>,
    pub proxy_cpus: Option<f64>,
    /// `None`: egress sessions are refused (both files or neither).
    pub ca: Option<EgressCa>,
    /// Non-global networks gateways may still reach (their SSRF guard refuses the rest).
    pub allowed_cidrs: Vec<ipnet::IpNet>,
    /// Extra CA bundle gateways trust for upstream servers (private or test PKI).
    pub upstream_ca_file: Option<PathBuf>,
    /// HTTP proxy gateways send their own egress through (`http://[user:pass@]host[:port]`);
    /// a secret, since it may carry credentials.
    pub upstream_proxy: Option<Secret>,
    /// Address pool the per-session internal networks are carved from (one /29 each).
    pub subnet_pool: ipnet::Ipv4Net,
    /// Hosts (`host` or `host:port`, exact names) gateways let the sandbox reach in plain HTTP
    /// on private addresses, credential included: development stacks only (a GitLab on the
    /// compose network at `http://gitlab:8929`). Empty = off, the default. An operator setting,
    /// never a policy field: an agent must not be able to send its credentials in clear.
    pub plain_http_hosts: Vec<shared_policy::sidecar::PlainHttpHost>,
}

impl EgressConfig {
    pub(super) fn load(p: &mut Parser<'_>) -> Self {
        let proxy_image = p.string_or("EGRESS_PROXY_IMAGE", "daiv-sandbox-egress:local");
        let proxy_port = p.parse_or::<u16>("EGRESS_PROXY_PORT", 8080);
        if proxy_port == 0 {
            p.fail(
                "EGRESS_PROXY_PORT",
                "0",
                "expected a port between 1 and 65535",
            );
        }
        let proxy_runtime = p.choice("EGRESS_PROXY_RUNTIME", Runtime::Runc, RUNTIMES);
        let proxy_network = p.get("EGRESS_PROXY_NETWORK");
        // A default limit: a sandbox drives its gateway's memory (connections, buffers), so the
        // host must not be the limit. 0 lifts it.
        let proxy_memory_bytes =
            Some(p.parse_or::<i64>("EGRESS_PROXY_MEMORY_BYTES", 128 * 1024 * 1024))
                .filter(|m| *m != 0);
        if let Some(m) = proxy_memory_bytes
            && m < 6 * 1024 * 1024
        {
            p.fail(
                "EGRESS_PROXY_MEMORY_BYTES",
                &m.to_string(),
                "Docker needs at least 6 MiB (6291456)",
            );
        }
        let proxy_cpus = p.positive_f64_opt("EGRESS_PROXY_CPUS");

        let ca = match (p.get("EGRESS_CA_CERT_FILE"), p.get("EGRESS_CA_KEY_FILE")) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                for (name, path) in [("EGRESS_CA_CERT_FILE", &cert), ("EGRESS_CA_KEY_FILE", &key)] {
                    if !Path::new(path).is_file() {
                        p.fail(name, path, "file not found or not a regular file");
                    }
                }
                Some(EgressCa {
                    cert_file: cert.into(),
                    key_file: key.into(),
                })
            }
            _ => {
                p.errors.push(format!(
                    "{PREFIX}EGRESS_CA_CERT_FILE and {PREFIX}EGRESS_CA_KEY_FILE must be set together (or neither)"
                ));
                None
            }
        };

        let mut allowed_cidrs = Vec::new();
        if let Some(raw) = p.get("EGRESS_ALLOWED_CIDRS") {
            for item in raw.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                match item.parse::<ipnet::IpNet>() {
                    Ok(net) => allowed_cidrs.push(net),
                    Err(e) => p.fail("EGRESS_ALLOWED_CIDRS", item, e),
                }
            }
        }
        let upstream_ca_file = p.get("EGRESS_UPSTREAM_CA_FILE").map(PathBuf::from);
        if let Some(path) = &upstream_ca_file
            && !path.is_file()
        {
            let raw = path.display().to_string();
            p.fail(
                "EGRESS_UPSTREAM_CA_FILE",
                &raw,
                "file not found or not a regular file",
            );
        }
        let upstream_proxy = p.get("EGRESS_UPSTREAM_PROXY");
        if let Some(raw) = &upstream_proxy {
            let uri = raw.parse::<http::Uri>();
            let ok = uri.as_ref().is_ok_and(|u| {
                u.scheme_str() == Some("http") && u.host().is_some_and(|h| !h.is_empty())
            });
            if !ok {
                // Never the value: it may carry a password.
                p.fail(
                    "EGRESS_UPSTREAM_PROXY",
                    "(hidden)",
                    "expected http://[user:pass@]host[:port]",
                );
            }
        }
        let upstream_proxy = upstream_proxy.map(Secret::new);
        let default_pool: ipnet::Ipv4Net =
            ipnet::Ipv4Net::new(std::net::Ipv4Addr::new(100, 64, 0, 0), 10).unwrap_or_default();
        let subnet_pool = p.parse_or::<ipnet::Ipv4Net>("EGRESS_SUBNET_POOL", default_pool);
        if subnet_pool.prefix_len() > 24 {
            let raw = subnet_pool.to_string();
            p.fail(
                "EGRESS_SUBNET_POOL",
                &raw,
                "needs room for many /29 networks (at most /24)",
            );
        }

        let plain_http_hosts = match p.get("EGRESS_PLAIN_HTTP_HOSTS") {
            Some(raw) => {
                shared_policy::sidecar::PlainHttpHost::parse_list(&raw).unwrap_or_else(|why| {
                    p.fail("EGRESS_PLAIN_HTTP_HOSTS", &raw, why);
                    Vec::new()
                })
            }
            None => Vec::new(),
        };

        Self {
            proxy_image,
            proxy_port,
            proxy_runtime,
            proxy_network,
            proxy_memory_bytes,
            proxy_cpus,
            ca,
            allowed_cidrs,
            upstream_ca_file,
            upstream_proxy,
            subnet_pool,
            plain_http_hosts,
        }
    }
}
