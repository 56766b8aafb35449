//! The MITM certificate authority: leaf certificates minted per host with rcgen, signed by the
//! shared CA that every egress sandbox trusts, and cached (bounded) as ready `ServerConfig`s.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use shared_policy::Host;

/// How many hosts' configs stay cached. One gateway serves one session, which talks to a handful
/// of hosts; the bound only stops a hostile client from growing memory by asking for many names.
pub const LEAF_CACHE_CAPACITY: usize = 256;
/// Leaves are re-minted after this, well before they expire.
const LEAF_CACHE_TTL: Duration = Duration::from_secs(12 * 3600);
/// Leaf validity. Short: a leaked leaf is only good for this long, and only for its one host.
const LEAF_VALIDITY: time::Duration = time::Duration::days(7);
/// `not_before` is backdated so that a client whose clock is a little behind still accepts it.
const LEAF_BACKDATE: time::Duration = time::Duration::minutes(5);

pub use crate::error::CaError;

/// The CA and its leaf cache.
pub struct CertificateAuthority {
    issuer: Issuer<'static, KeyPair>,
    /// One key for every leaf: generating a key per host would cost more than signing, and the
    /// leaves are only ever trusted through our own CA anyway.
    leaf_key: KeyPair,
    leaf_key_der: Vec<u8>,
    provider: Arc<CryptoProvider>,
    cache: Mutex<LeafCache>,
    /// Leaf lookups answered from the cache, and leaves minted (metrics).
    hits: std::sync::atomic::AtomicU64,
    misses: std::sync::atomic::AtomicU64,
}

/// FIFO-evicting map: host -> (config, minted at).
#[derive(Default)]
struct LeafCache {
    map: HashMap<String, (Arc<ServerConfig>, Instant)>,
    order: VecDeque<String>,
}

// === impl CertificateAuthority ===

impl CertificateAuthority {
    /// Loads the CA from PEM text (certificate, and its private key in PKCS#8).
    pub fn from_pem(
        cert_pem: &str,
        key_pem: &str,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, CaError> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| CaError::Key(e.to_string()))?;
        let issuer =
            Issuer::from_ca_cert_pem(cert_pem, key).map_err(|e| CaError::Cert(e.to_string()))?;
        let leaf_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(|e| CaError::Mint(e.to_string()))?;
        let leaf_key_der = leaf_key.serialize_der();
        Ok(Self {
            issuer,
            leaf_key,
            leaf_key_der,
            provider,
            cache: Mutex::new(LeafCache::default()),
            hits: std::sync::atomic::AtomicU64::new(0),
            misses: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Loads the CA from two PEM files.
    pub fn from_files(
        cert: &Path,
        key: &Path,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, crate::ConfigError> {
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|source| crate::ConfigError::Read {
                path: p.to_owned(),
                source,
            })
        };
        Ok(Self::from_pem(&read(cert)?, &read(key)?, provider)?)
    }

    /// A TLS server config presenting a leaf for `host`, minted on first use and then cached.
    /// ALPN offers h2 and http/1.1, so the client side of the MITM speaks what the client prefers.
    pub fn server_config(&self, host: &Host) -> Result<Arc<ServerConfig>, CaError> {
        use std::sync::atomic::Ordering::Relaxed;
        if let Some(cfg) = self.cached(host.as_str()) {
            self.hits.fetch_add(1, Relaxed);
            return Ok(cfg);
        }
        self.misses.fetch_add(1, Relaxed);
        let cfg = Arc::new(self.mint(host)?);
        let mut cache = self
            .cache
            .lock()
            .map_err(|_| CaError::Mint("cache lock poisoned".into()))?;
        let key = host.as_str().to_owned();
        if cache
            .map
            .insert(key.clone(), (cfg.clone(), Instant::now()))
            .is_none()
        {
            cache.order.push_back(key);
        }
        while cache.map.len() > LEAF_CACHE_CAPACITY {
            match cache.order.pop_front() {
                Some(old) => {
                    cache.map.remove(&old);
                }
                None => break,
            }
        }
        Ok(cfg)
    }

    /// (cache hits, leaves minted) since start.
    pub fn cache_stats(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.hits.load(Relaxed), self.misses.load(Relaxed))
    }

    /// Number of cached leaves (for tests and the benchmark).
    pub fn cached_len(&self) -> usize {
        self.cache.lock().map(|c| c.map.len()).unwrap_or(0)
    }

    fn cached(&self, host: &str) -> Option<Arc<ServerConfig>> {
        let cache = self.cache.lock().ok()?;
        let (cfg, at) = cache.map.get(host)?;
        (at.elapsed() < LEAF_CACHE_TTL).then(|| cfg.clone())
    }

    fn mint(&self, host: &Host) -> Result<ServerConfig, CaError> {
        let mint_err = |e: &dyn std::fmt::Display| CaError::Mint(e.to_string());
        let mut params = CertificateParams::default();
        params.subject_alt_names = vec![match host.ip() {
            Some(ip) => SanType::IpAddress(ip),
            None => SanType::DnsName(
                host.as_str()
                    .to_owned()
                    .try_into()
                    .map_err(|e| mint_err(&e))?,
            ),
        }];
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, host.as_str());
        params.distinguished_name = dn;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - LEAF_BACKDATE;
        params.not_after = now + LEAF_VALIDITY;
        params.serial_number = Some(SerialNumber::from_slice(&random_serial()));
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let leaf = params
            .signed_by(&self.leaf_key, &self.issuer)
            .map_err(|e| mint_err(&e))?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key_der.clone()));
        let mut cfg = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| mint_err(&e))?
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone()], key)
            .map_err(|e| mint_err(&e))?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(cfg)
    }
}

/// 16 random bytes with the top bit cleared, so the DER integer stays positive and 128 bits long.
fn random_serial() -> [u8; 16] {
    let mut serial: [u8; 16] = rand::random();
    serial[0] &= 0x7f;
    serial[0] |= 0x01;
    serial
}

/// A new self-signed CA (ECDSA P-256), as `(cert_pem, key_pem)`: what `gen-ca` writes.
pub fn generate_ca(common_name: &str) -> Result<(String, String), CaError> {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| CaError::Mint(e.to_string()))?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(3650);
    params.serial_number = Some(SerialNumber::from_slice(&random_serial()));
    let cert = params
        .self_signed(&key)
        .map_err(|e| CaError::Mint(e.to_string()))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// The CA certificate's DER (the first certificate in a PEM text), e.g. for a test's trust store.
pub fn first_cert_der(pem: &str) -> Option<CertificateDer<'static>> {
    use rustls_pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem.as_bytes()).next()?.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider() -> Arc<CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    #[test]
    fn mints_and_caches_bounded() {
        let (cert, key) = generate_ca("test ca").expect("ca");
        let ca = CertificateAuthority::from_pem(&cert, &key, provider()).expect("load");
        let host = Host::parse("a.test").expect("host");
        let first = ca.server_config(&host).expect("mint");
        let second = ca.server_config(&host).expect("cached");
        assert!(Arc::ptr_eq(&first, &second));
        for i in 0..LEAF_CACHE_CAPACITY + 10 {
            let h = Host::parse(&format!("h{i}.test")).expect("host");
            ca.server_config(&h).expect("mint");
        }
        assert_eq!(ca.cached_len(), LEAF_CACHE_CAPACITY);
        let ip = Host::parse("127.0.0.1").expect("ip");
        ca.server_config(&ip).expect("ip leaf");
    }

    #[test]
    fn refuses_bad_pem() {
        let (cert, key) = generate_ca("test ca").expect("ca");
        assert!(matches!(
            CertificateAuthority::from_pem(&cert, "nope", provider()),
            Err(CaError::Key(_))
        ));
        assert!(matches!(
            CertificateAuthority::from_pem("nope", &key, provider()),
            Err(CaError::Cert(_))
        ));
    }
}
