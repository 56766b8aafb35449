//! The SSRF guard: the gateway resolves names itself, refuses non-global addresses unless an
//! operator allowed their CIDR, and hands the connector the exact addresses it checked, so there
//! is no window between check and connect for DNS rebinding.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use hickory_resolver::TokioResolver;
use ipnet::IpNet;
use shared_policy::Host;
use tracing::warn;

use crate::error::{DenyCode, ProxyError};

/// A DNS lookup gets this long.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Resolves destinations and checks every address.
pub struct AddressGuard {
    allowed: Vec<IpNet>,
    /// Fixed answers consulted before DNS: how tests and the benchmark map `*.test` names to
    /// loopback without touching a real resolver. Still guarded like any other answer.
    static_hosts: HashMap<String, Vec<IpAddr>>,
    /// `None` when the system resolver config could not be read; only static names resolve then.
    resolver: Option<TokioResolver>,
}

// === impl AddressGuard ===

impl AddressGuard {
    /// A guard with the given allow-list and static names, over the system resolver config.
    pub fn new(allowed: Vec<IpNet>, static_hosts: HashMap<String, Vec<IpAddr>>) -> Self {
        let resolver = match TokioResolver::builder_tokio().and_then(|b| b.build()) {
            Ok(r) => Some(r),
            Err(error) => {
                warn!(error = %error, "no system DNS configuration; only static hosts resolve");
                None
            }
        };
        Self {
            allowed,
            static_hosts,
            resolver,
        }
    }

    /// The addresses to connect to for `host:port`, all of them checked. Refuses when any
    /// answer is not allowed: a name that mixes public and private answers is suspect, and
    /// picking the public one would let the resolver choose which we check.
    pub async fn resolve(&self, host: &Host, port: u16) -> Result<Vec<SocketAddr>, ProxyError> {
        self.resolve_where(host, port, |ip| self.is_allowed(ip))
            .await
    }

    /// As [`AddressGuard::resolve`], for a host of the plain-HTTP opt-in: every address must be
    /// on a private network ([`is_private_network`]), where its credential may travel in clear.
    /// A public answer is refused too (a credential in clear must not cross the internet), and
    /// so are loopback, link-local (the metadata service) and the rest, whatever
    /// `--allowed-cidrs` says: the opt-in reaches a development stack's hosts, nothing else.
    pub async fn resolve_private(
        &self,
        host: &Host,
        port: u16,
    ) -> Result<Vec<SocketAddr>, ProxyError> {
        self.resolve_where(host, port, is_private_network).await
    }

    async fn resolve_where(
        &self,
        host: &Host,
        port: u16,
        allowed: impl Fn(IpAddr) -> bool,
    ) -> Result<Vec<SocketAddr>, ProxyError> {
        let ips: Vec<IpAddr> = if let Some(ip) = host.ip() {
            vec![ip]
        } else if let Some(ips) = self.static_hosts.get(host.as_str()) {
            ips.clone()
        } else {
            self.lookup(host).await?
        };
        if ips.is_empty() {
            return Err(ProxyError::Resolve {
                host: host.to_string(),
                reason: "no addresses".into(),
            });
        }
        if ips.iter().any(|ip| !allowed(*ip)) {
            return Err(ProxyError::Denied(DenyCode::AddressNotAllowed));
        }
        Ok(ips
            .into_iter()
            .map(|ip| SocketAddr::new(ip, port))
            .collect())
    }

    async fn lookup(&self, host: &Host) -> Result<Vec<IpAddr>, ProxyError> {
        let fail = |reason: String| ProxyError::Resolve {
            host: host.to_string(),
            reason,
        };
        let resolver = self
            .resolver
            .as_ref()
            .ok_or_else(|| fail("no DNS configuration".into()))?;
        // A fully qualified name: the search domains of resolv.conf must not rewrite it.
        let fqdn = format!("{}.", host.as_str());
        let answer = tokio::time::timeout(RESOLVE_TIMEOUT, resolver.lookup_ip(fqdn.as_str()))
            .await
            .map_err(|_| fail("timed out".into()))?
            .map_err(|e| fail(e.to_string()))?;
        Ok(answer.iter().collect())
    }

    /// Global addresses pass; others only inside an allowed CIDR.
    pub fn is_allowed(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.allowed.iter().any(|net| net.contains(&ip)) || is_global(ip)
    }
}

/// IPv4-mapped IPv6 is the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// An address of a private network: RFC 1918 (`10/8`, `172.16/12`, `192.168/16`) or IPv6 ULA
/// (`fc00::/7`), IPv4-mapped forms included. Not loopback, link-local, CGNAT (the per-session
/// networks live there), unspecified, multicast, or anything global.
pub fn is_private_network(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => v4.is_private(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xfe00) == 0xfc00,
    }
}

/// Publicly routable unicast. Everything else (loopback, private, link-local incl. the cloud
/// metadata address 169.254.169.254, CGNAT, unspecified, multicast, documentation, benchmarking,
/// reserved, IPv6 ULA and link-local, and IPv6 forms that embed a non-global IPv4) is not.
pub fn is_global(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => is_global_v4(v4),
        IpAddr::V6(v6) => is_global_v6(v6),
    }
}

fn is_global_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || a == 0                                  // 0.0.0.0/8 "this network"
        || ip.is_loopback()                        // 127/8
        || ip.is_private()                         // 10/8, 172.16/12, 192.168/16
        || ip.is_link_local()                      // 169.254/16 (metadata services)
        || (a == 100 && (b & 0xc0) == 64)          // 100.64/10 CGNAT
        || (a == 192 && b == 0 && c == 0)          // 192.0.0/24 IETF protocol assignments
        || (a == 192 && b == 0 && c == 2)          // TEST-NET-1
        || (a == 198 && b == 51 && c == 100)       // TEST-NET-2
        || (a == 203 && b == 0 && c == 113)        // TEST-NET-3
        || (a == 192 && b == 88 && c == 99)        // 6to4 relay anycast
        || (a == 198 && (b & 0xfe) == 18)          // 198.18/15 benchmarking
        || ip.is_multicast()                       // 224/4
        || a >= 240) // 240/4 reserved, broadcast
}

fn is_global_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    let embedded_v4 = |hi: usize| {
        Ipv4Addr::new(
            (s[hi] >> 8) as u8,
            s[hi] as u8,
            (s[hi + 1] >> 8) as u8,
            s[hi + 1] as u8,
        )
    };
    if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() {
        return false;
    }
    match s[0] {
        0x0000 => false, // ::/96 IPv4-compatible and other reserved
        0x0064 if s[1] == 0xff9b => is_global_v4(embedded_v4(6)), // NAT64
        0x0100 if s[1..4] == [0, 0, 0] => false, // discard-only 100::/64
        0x2001 if s[1] < 0x0200 => false, // 2001::/23 IETF (incl. Teredo 2001::/32)
        0x2001 if s[1] == 0x0db8 => false, // documentation
        0x2002 => is_global_v4(embedded_v4(1)), // 6to4
        x if (x & 0xfe00) == 0xfc00 => false, // fc00::/7 ULA
        x if (x & 0xffc0) == 0xfe80 => false, // fe80::/10 link-local
        x if (x & 0xffc0) == 0xfec0 => false, // fec0::/10 site-local (deprecated)
        _ => true,
    }
}

/// Parses `CIDR[,CIDR...]` (a bare address is a /32 or /128).
pub fn parse_cidrs(text: &str) -> Result<Vec<IpNet>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<IpNet>()
                .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| format!("{s:?} is not a CIDR"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_addresses() {
        let non_global = [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "192.0.2.1",
            "198.18.0.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "fc00::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
            "2002:7f00:1::",
            "2001:db8::1",
            "2001::1",
            "::127.0.0.1",
        ];
        for ip in non_global {
            assert!(!is_global(ip.parse().expect(ip)), "{ip} must not be global");
        }
        for ip in [
            "1.1.1.1",
            "140.82.112.3",
            "2606:4700::1111",
            "64:ff9b::101:101",
            "2002:101:101::",
        ] {
            assert!(is_global(ip.parse().expect(ip)), "{ip} must be global");
        }
    }

    #[test]
    fn private_networks_are_rfc1918_and_ula_only() {
        for ip in [
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.254",
            "192.168.1.1",
            "fd00::1",
            "fc00::1",
            "::ffff:10.1.2.3",
        ] {
            assert!(is_private_network(ip.parse().expect(ip)), "{ip}");
        }
        for ip in [
            "127.0.0.1",
            "::1",
            "169.254.169.254",
            "fe80::1",
            "0.0.0.0",
            "::",
            "224.0.0.1",
            "ff02::1",
            "255.255.255.255",
            "100.64.0.1",
            "172.32.0.1",
            "1.1.1.1",
            "2606:4700::1111",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
        ] {
            assert!(!is_private_network(ip.parse().expect(ip)), "{ip}");
        }
    }

    /// The opt-in's resolution refuses loopback and the metadata address even where the
    /// operator's `--allowed-cidrs` opens them for ordinary requests, and public answers too.
    #[tokio::test]
    async fn plain_http_hosts_reach_private_networks_only() {
        let statics = HashMap::from([
            ("gitlab.test".to_owned(), vec![IpAddr::from([10, 1, 2, 3])]),
            ("local.test".to_owned(), vec![IpAddr::from([127, 0, 0, 1])]),
            (
                "metadata.test".to_owned(),
                vec![IpAddr::from([169, 254, 169, 254])],
            ),
            ("public.test".to_owned(), vec![IpAddr::from([1, 1, 1, 1])]),
            (
                "mixed.test".to_owned(),
                vec![IpAddr::from([10, 1, 2, 3]), IpAddr::from([127, 0, 0, 1])],
            ),
        ]);
        let guard = AddressGuard::new(
            parse_cidrs("127.0.0.0/8,169.254.0.0/16").expect("cidrs"),
            statics,
        );
        let host = |n: &str| Host::parse(n).expect("host");
        assert_eq!(
            guard
                .resolve_private(&host("gitlab.test"), 8929)
                .await
                .expect("private"),
            vec![SocketAddr::from(([10, 1, 2, 3], 8929))]
        );
        for name in ["local.test", "metadata.test", "public.test", "mixed.test"] {
            assert!(
                matches!(
                    guard.resolve_private(&host(name), 80).await,
                    Err(ProxyError::Denied(DenyCode::AddressNotAllowed))
                ),
                "{name}"
            );
        }
        assert!(guard.resolve(&host("local.test"), 80).await.is_ok());
    }

    #[tokio::test]
    async fn allowed_cidrs_open_private_ranges() {
        let host = Host::parse("upstream.test").expect("host");
        let statics = HashMap::from([(
            "upstream.test".to_owned(),
            vec![IpAddr::from([127, 0, 0, 1])],
        )]);
        let closed = AddressGuard::new(vec![], statics.clone());
        assert!(matches!(
            closed.resolve(&host, 80).await,
            Err(ProxyError::Denied(DenyCode::AddressNotAllowed))
        ));
        let open = AddressGuard::new(parse_cidrs("127.0.0.0/8, ::1").expect("cidrs"), statics);
        assert_eq!(
            open.resolve(&host, 80).await.expect("allowed"),
            vec![SocketAddr::from(([127, 0, 0, 1], 80))]
        );
        assert!(open.is_allowed("::ffff:127.0.0.2".parse().expect("ip")));
        assert!(parse_cidrs("nope").is_err());
    }
}
