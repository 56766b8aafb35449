//! Egress sessions: the per-session triad of an internal network, an egress gateway sidecar and
//! the sandbox.
//!
//! ```text
//! [sandbox] --internal network (no route out)--> [gateway] --egress-side network--> upstream
//! ```
//!
//! The internal network gets a /29 of our choosing so the gateway (`.2`) and the sandbox (`.3`)
//! keep fixed addresses across stops and starts: the proxy address baked into the sandbox's
//! environment stays right after a warm restart. The gateway listens on its internal address only,
//! so nothing on the egress-side network can use it as an open proxy. The CA key and the secrets
//! are written into the gateway alone; the sandbox gets the CA certificate, nothing else.
//!
//! Docker round trips: create = 2 image checks + network + gateway (create, put config, connect,
//! start) + sandbox (create, put skeleton, start, inspect) + CA install exec + readiness wait +
//! policy acknowledgement exec (+ its exit code) ≈ 15, with the gateway's start running beside the
//! sandbox's create and start; refresh = inspect sandbox + inspect gateway + put staged config +
//! acknowledgement exec + exit code (5).
//!
//! Policy installs are atomic and acknowledged (the contract is `shared_policy::sidecar`): the
//! file carries a `version` (its content hash); a refresh extracts it as the staging file beside
//! `config.json` (an extraction writes in place, and the image has no shell to rename with), the
//! gateway renames it over `config.json` once it is complete, and the control plane runs the
//! gateway's own `health --expect-version V` inside the gateway until it reports that version.
//! Only then is the update answered 204 (503 after [`POLICY_ACK_TIMEOUT`]); session create waits
//! the same way for the first policy.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use shared_policy::PolicyFile;
use shared_policy::sidecar;

use crate::backoff::Backoff;
use crate::config::Config;
use crate::engine::{
    ContainerEngine, ContainerInfo, ContainerSpec, DEPLOYMENT_LABEL, EGRESS_LABEL, EngineError,
    ExecSpec, MANAGED_LABEL, NetworkAttach, NetworkSpec, ROLE_EGRESS_GATEWAY, ROLE_EGRESS_NETWORK,
    ROLE_LABEL,
};
use crate::error::ApiError;
use crate::layout;

mod policy;

pub use policy::parse_policy;
use policy::{config_tar, config_tar_with, policy_json};

/// The sandbox's labels naming its gateway container and internal network.
pub const GATEWAY_LABEL: &str = "daiv.sandbox.egress.gateway";
pub const NETWORK_LABEL: &str = "daiv.sandbox.egress.network";

/// The non-root user the gateway image runs as; its files are owned by it.
pub const GATEWAY_UID: u32 = sidecar::UID;
/// What the gateway logs once it accepts connections.
const GATEWAY_READY_LINE: &str = sidecar::READY_LINE;
const GATEWAY_READY_TIMEOUT: Duration = Duration::from_secs(20);
/// A policy install (create or `PUT .../egress/`) fails with 503 when the gateway does not
/// report the new version within this.
pub const POLICY_ACK_TIMEOUT: Duration = Duration::from_secs(5);
const GATEWAY_PIDS_LIMIT: i64 = 256;

/// Builds the combined bundle (the image's system roots + the egress CA) at `$2` from the CA at
/// `$1` ([`layout::CA_BUNDLE`] and [`layout::CA_CERT`]) and adds the CA to the system bundle for
/// tools that ignore the environment. Runs as root: no capability is needed to write root-owned
/// files, which matters under gVisor.
const INSTALL_CA: &str = r#"c="$1" b="$2"
: > "$b"
for f in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt /etc/ssl/cert.pem /etc/ssl/ca-bundle.pem; do
  if [ -f "$f" ]; then cat "$f" >> "$b"; printf '\n' >> "$b"; cat "$c" >> "$f" 2>/dev/null; break; fi
done
cat "$c" >> "$b"
if [ -d /usr/local/share/ca-certificates ]; then cp "$c" /usr/local/share/ca-certificates/daiv-egress-ca.crt 2>/dev/null; fi
exit 0"#;

const PROXY_ENV: [&str; 6] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "http_proxy",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
];
const NO_PROXY_ENV: [&str; 2] = ["NO_PROXY", "no_proxy"];
const CA_BUNDLE_ENV: [&str; 6] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",
    "PIP_CERT",
];

/// Whether an egress sandbox's own settings (proxy, CA bundle) set `name`: those win over the
/// caller's environment.
pub fn sets_env(name: &str) -> bool {
    PROXY_ENV
        .iter()
        .chain(&NO_PROXY_ENV)
        .chain(&CA_BUNDLE_ENV)
        .any(|k| *k == name)
}

/// Everything egress needs that does not change per session, read once at start-up.
pub struct Egress {
    engine: Arc<dyn ContainerEngine>,
    config: Arc<Config>,
    ca_cert: Bytes,
    ca_key: Bytes,
    upstream_ca: Option<Bytes>,
}

/// A session's egress parts, as recorded on the sandbox's labels.
#[derive(Debug, Clone)]
pub struct Triad {
    pub token: String,
    pub gateway: String,
    pub network: String,
    /// The version of the policy written at create, to acknowledge (not on the labels: a
    /// refresh changes it).
    pub policy_version: Option<String>,
}

impl Triad {
    pub fn of(info: &ContainerInfo) -> Option<Self> {
        Some(Self {
            token: info.labels.get(EGRESS_LABEL)?.clone(),
            gateway: info.labels.get(GATEWAY_LABEL)?.clone(),
            network: info.labels.get(NETWORK_LABEL)?.clone(),
            policy_version: None,
        })
    }
}

/// What a sandbox of an egress session needs from the triad.
pub struct SandboxPlan {
    pub triad: Triad,
    pub network: NetworkAttach,
    pub env: Vec<(String, String)>,
    pub labels: Vec<(String, String)>,
    /// Root-owned files to add to the sandbox's skeleton: the CA certificate.
    pub files: Vec<(String, Bytes)>,
}

/// Parts created so far, removed again when a later step fails.
#[derive(Default)]
pub struct Created {
    pub network: Option<String>,
    pub gateway: Option<String>,
}

impl Egress {
    /// Reads the CA pair (and the optional upstream bundle) so a bad file fails start-up, not a
    /// session.
    pub fn load(
        engine: Arc<dyn ContainerEngine>,
        config: Arc<Config>,
    ) -> Result<Option<Self>, std::io::Error> {
        let Some(ca) = &config.egress_ca else {
            return Ok(None);
        };
        let ca_cert = Bytes::from(std::fs::read(&ca.cert_file)?);
        let ca_key = Bytes::from(std::fs::read(&ca.key_file)?);
        let upstream_ca = match &config.egress_upstream_ca_file {
            Some(p) => Some(Bytes::from(std::fs::read(p)?)),
            None => None,
        };
        Ok(Some(Self {
            engine,
            config,
            ca_cert,
            ca_key,
            upstream_ca,
        }))
    }

    /// Creates the internal network and the gateway (not started: the caller starts it while it
    /// creates the sandbox, the two slowest steps side by side); returns how to attach the
    /// sandbox. On error, `created` says what to tear down.
    /// `helper`: put the session helper into the gateway too (warm-pool members: their claim
    /// installs the policy through it, see [`Egress::install`]).
    pub async fn prepare(
        &self,
        token: &str,
        policy: &PolicyFile,
        created: &mut Created,
        helper: Option<&Bytes>,
    ) -> Result<SandboxPlan, ApiError> {
        let c = &self.config;
        self.engine
            .ensure_image(&c.egress_proxy_image)
            .await
            .map_err(|e| crate::error::unavailable("egress gateway image is not available", &e))?;
        let token = token.to_string();
        let (network, subnet) = self.create_network(&token).await?;
        created.network = Some(network.clone());
        let base = u32::from(subnet.network());
        let gateway_ip = IpAddr::V4(Ipv4Addr::from(base + 2));
        let sandbox_ip = IpAddr::V4(Ipv4Addr::from(base + 3));

        let policy = policy.clone().with_content_version();
        let spec = self.gateway_spec(&token, gateway_ip, &policy, helper)?;
        let gateway = self.engine.create(&spec).await?;
        created.gateway = Some(gateway.clone());
        self.engine
            .connect_network(&network, &gateway, Some(gateway_ip))
            .await?;

        let proxy = format!("http://{gateway_ip}:{}", c.egress_proxy_port);
        let mut env: Vec<(String, String)> = PROXY_ENV
            .iter()
            .map(|k| (k.to_string(), proxy.clone()))
            .collect();
        for k in NO_PROXY_ENV {
            env.push((k.to_string(), "localhost,127.0.0.1,::1".to_string()));
        }
        for k in CA_BUNDLE_ENV {
            env.push((k.to_string(), layout::CA_BUNDLE.to_string()));
        }
        Ok(SandboxPlan {
            triad: Triad {
                token: token.clone(),
                gateway: gateway.clone(),
                network: network.clone(),
                policy_version: policy.version.clone(),
            },
            network: NetworkAttach::Network {
                name: network.clone(),
                ip: Some(sandbox_ip),
            },
            env,
            labels: vec![
                (EGRESS_LABEL.to_string(), token),
                (GATEWAY_LABEL.to_string(), gateway),
                (NETWORK_LABEL.to_string(), network),
            ],
            files: vec![(
                crate::archive::entry_name(layout::CA_CERT).to_string(),
                self.ca_cert.clone(),
            )],
        })
    }

    /// What a warm-pool egress member depends on besides the sandbox (for its spec hash).
    pub fn fingerprint(&self) -> String {
        let c = &self.config;
        format!(
            "{}|{}|{}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{}|{}|{}|{}",
            c.egress_proxy_image,
            c.egress_proxy_port,
            c.egress_proxy_runtime.as_str(),
            c.egress_proxy_network,
            c.network,
            c.egress_proxy_memory_bytes,
            c.egress_proxy_cpus,
            c.egress_allowed_cidrs,
            c.egress_upstream_proxy
                .as_ref()
                .map(|p| fnv(p.expose().as_bytes())),
            fnv(&self.ca_cert),
            fnv(&self.ca_key),
            self.upstream_ca.as_deref().map_or(0, fnv),
            c.egress_subnet_pool,
        )
    }

    pub async fn start_gateway(&self, triad: &Triad) -> Result<(), ApiError> {
        self.engine.start(&triad.gateway).await.map_err(Into::into)
    }

    /// After the sandbox started: trust the CA inside it, and wait for the gateway to listen and
    /// enforce the session's policy, so the first command already reaches the proxy.
    pub async fn finish(&self, sandbox: &str, triad: &Triad) -> Result<(), ApiError> {
        let install = self.install_ca(sandbox);
        let ready = async {
            self.wait_ready(&triad.gateway).await?;
            match &triad.policy_version {
                Some(version) => self.acknowledge(&triad.gateway, version).await,
                None => Ok(()),
            }
        };
        let (installed, ready) = tokio::join!(install, ready);
        installed?;
        ready
    }

    /// Runs the gateway's `health --expect-version` inside the gateway (the image has only that
    /// binary; the exec shares the gateway's network namespace, so its listen address answers)
    /// until the gateway enforces `version`, for at most [`POLICY_ACK_TIMEOUT`]: 503 otherwise.
    async fn acknowledge(&self, gateway: &str, version: &str) -> Result<(), ApiError> {
        let not_acked = |detail: &str| {
            ApiError::Unavailable(format!(
                "the egress gateway did not enforce the new policy within {} s{detail}",
                POLICY_ACK_TIMEOUT.as_secs()
            ))
        };
        let spec = ExecSpec {
            cmd: vec![
                sidecar::BINARY.into(),
                sidecar::HEALTH_SUBCOMMAND.into(),
                "--timeout-ms".into(),
                POLICY_ACK_TIMEOUT.as_millis().to_string(),
                "--expect-version".into(),
                version.into(),
            ],
            user: format!("{}:{}", sidecar::UID, sidecar::UID),
            workdir: None,
            env: Vec::new(),
        };
        let run = async {
            let mut exec =
                self.engine.exec(gateway, &spec).await.map_err(|e| {
                    crate::error::unavailable("could not ask the egress gateway", &e)
                })?;
            let mut output = Vec::new();
            while let Some(chunk) = exec.output.next().await {
                let chunk = chunk.map_err(|e| {
                    crate::error::unavailable("could not ask the egress gateway", &e)
                })?;
                if output.len() < 4096 {
                    output.extend_from_slice(&chunk);
                }
            }
            // The exit code can lag the end of the output by a moment.
            let mut backoff = Backoff::fixed(Duration::from_millis(20), Duration::from_secs(1));
            loop {
                match self.engine.exec_exit_code(&exec.exec_id).await {
                    Ok(Some(0)) => return Ok(()),
                    Ok(Some(_)) => {
                        let text = String::from_utf8_lossy(&output);
                        let last = text.lines().last().unwrap_or_default().trim().to_owned();
                        tracing::warn!(gateway, version, answer = %last, "egress policy not acknowledged");
                        return Err(not_acked(""));
                    }
                    Ok(None) => {}
                    Err(e) => {
                        return Err(crate::error::unavailable(
                            "could not ask the egress gateway",
                            &e,
                        ));
                    }
                }
                if !backoff.wait().await {
                    break;
                }
            }
            Err(not_acked(" (no exit code)"))
        };
        tokio::time::timeout(POLICY_ACK_TIMEOUT + Duration::from_secs(5), run)
            .await
            .unwrap_or_else(|_| Err(not_acked("")))
    }

    async fn install_ca(&self, sandbox: &str) -> Result<(), ApiError> {
        let spec = ExecSpec {
            cmd: [
                "/bin/sh",
                "-c",
                INSTALL_CA,
                "sh",
                layout::CA_CERT,
                layout::CA_BUNDLE,
            ]
            .map(String::from)
            .to_vec(),
            user: "0:0".into(),
            workdir: None,
            env: Vec::new(),
        };
        let mut exec = self.engine.exec(sandbox, &spec).await?;
        while let Some(chunk) = exec.output.next().await {
            chunk?;
        }
        Ok(())
    }

    async fn wait_ready(&self, gateway: &str) -> Result<(), ApiError> {
        self.engine
            .wait_for_log(gateway, GATEWAY_READY_LINE, GATEWAY_READY_TIMEOUT)
            .await
            .map_err(|e| crate::error::unavailable("egress gateway did not become ready", &e))
    }

    /// Whether the triad's gateway runs (503 when it is gone).
    pub async fn gateway_running(&self, triad: &Triad) -> Result<bool, ApiError> {
        self.engine
            .inspect(&triad.gateway)
            .await
            .map(|info| info.is_running())
            .map_err(|e| crate::error::unavailable("egress gateway unavailable", &e))
    }

    /// Starts a stopped gateway and waits until it listens (warm restart, or one killed behind
    /// the service's back).
    pub async fn ensure_gateway(&self, triad: &Triad) -> Result<(), ApiError> {
        if self.gateway_running(triad).await? {
            return Ok(());
        }
        self.engine
            .start(&triad.gateway)
            .await
            .map_err(|e| crate::error::unavailable("egress gateway could not start", &e))?;
        self.wait_ready(&triad.gateway).await
    }

    /// Replaces the gateway's policy without a restart: extracts it as the staging file, which
    /// the gateway renames over its policy once complete, then waits until the gateway enforces
    /// its version.
    pub async fn refresh(&self, triad: &Triad, policy: &PolicyFile) -> Result<(), ApiError> {
        self.ensure_gateway(triad).await?;
        let policy = policy.clone().with_content_version();
        let version = policy.version.clone().unwrap_or_default();
        let tar = config_tar(
            &[(sidecar::POLICY_STAGING_FILE, policy_json(&policy)?, 0o600)],
            false,
        );
        let body = futures::stream::once(async move { Ok(tar) }).boxed();
        self.engine
            .put_archive(&triad.gateway, sidecar::CONFIG_DIR, body)
            .await
            .map_err(|e| crate::error::unavailable("could not update the egress policy", &e))?;
        self.acknowledge(&triad.gateway, &version).await
    }

    /// A warm-pool claim's policy, in one exec: the session helper in the gateway writes it over
    /// the gateway's policy file (a complete file renamed into place, which the gateway reloads)
    /// and then runs the gateway's `health --expect-version`, the same acknowledgement as a
    /// refresh. Without the helper there (the write never said `ok`), the staged-file path of
    /// [`Egress::refresh`].
    pub async fn install(&self, triad: &Triad, policy: &PolicyFile) -> Result<(), ApiError> {
        let policy = policy.clone().with_content_version();
        let version = policy.version.clone().unwrap_or_default();
        let health = vec![
            sidecar::BINARY.to_string(),
            sidecar::HEALTH_SUBCOMMAND.to_string(),
            "--timeout-ms".to_string(),
            POLICY_ACK_TIMEOUT.as_millis().to_string(),
            "--expect-version".to_string(),
            version.clone(),
        ];
        let (user, path) = (
            format!("{GATEWAY_UID}:{GATEWAY_UID}"),
            sidecar::config_path(sidecar::POLICY_FILE),
        );
        let run = crate::pool::write_then(
            &*self.engine,
            &triad.gateway,
            &user,
            &path,
            0o600,
            policy_json(&policy)?,
            &health,
        );
        let said = tokio::time::timeout(POLICY_ACK_TIMEOUT + Duration::from_secs(5), run).await;
        let said = match said {
            Ok(Ok(said)) => said,
            Ok(Err(e)) => {
                tracing::debug!(gateway = %triad.gateway, error = %e, "policy not written by the helper; staging it");
                return self.refresh(triad, &policy).await;
            }
            Err(_) => String::new(),
        };
        if !said.starts_with("ok\n") {
            tracing::debug!(gateway = %triad.gateway, "no helper in the gateway; staging the policy");
            return self.refresh(triad, &policy).await;
        }
        if said.trim_end().ends_with("\nexit 0") {
            return Ok(());
        }
        let last = said
            .lines()
            .rev()
            .nth(1)
            .unwrap_or_default()
            .trim()
            .to_owned();
        tracing::warn!(gateway = %triad.gateway, version, answer = %last, "egress policy not acknowledged");
        Err(ApiError::Unavailable(format!(
            "the egress gateway did not enforce the new policy within {} s",
            POLICY_ACK_TIMEOUT.as_secs()
        )))
    }

    pub async fn stop(&self, triad: &Triad) {
        match self
            .engine
            .stop(&triad.gateway, self.config.stop_timeout)
            .await
        {
            Ok(()) | Err(EngineError::NotFound) => {}
            Err(e) => {
                tracing::warn!(gateway = %triad.gateway, error = %e, "could not stop egress gateway")
            }
        }
    }

    /// Removes the gateway and the network (the sandbox must be gone first: a network with
    /// members cannot be removed).
    pub async fn teardown(&self, created: &Created) {
        if let Some(gw) = &created.gateway {
            match self.engine.remove(gw).await {
                Ok(()) | Err(EngineError::NotFound) => {}
                Err(e) => {
                    tracing::warn!(gateway = %gw, error = %e, "could not remove egress gateway")
                }
            }
        }
        if let Some(net) = &created.network {
            match self.engine.remove_network(net).await {
                Ok(()) | Err(EngineError::NotFound) => {}
                Err(e) => {
                    tracing::warn!(network = %net, error = %e, "could not remove egress network")
                }
            }
        }
    }

    /// An internal network on a random /29 of the pool; a collision with an existing network
    /// is retried on another subnet.
    async fn create_network(&self, token: &str) -> Result<(String, ipnet::Ipv4Net), ApiError> {
        let pool = self.config.egress_subnet_pool;
        let name = format!("daiv-egress-{token}");
        let labels = HashMap::from([
            (MANAGED_LABEL.to_string(), "true".to_string()),
            (ROLE_LABEL.to_string(), ROLE_EGRESS_NETWORK.to_string()),
            (EGRESS_LABEL.to_string(), token.to_string()),
            (DEPLOYMENT_LABEL.to_string(), self.config.deployment.clone()),
        ]);
        let slots = 1u32 << (29 - u32::from(pool.prefix_len().min(29)));
        let mut last = None;
        for _ in 0..8 {
            let slot = rand::random::<u32>() % slots.max(1);
            let base = u32::from(pool.network()) + slot * 8;
            let Ok(subnet) = ipnet::Ipv4Net::new(Ipv4Addr::from(base), 29) else {
                continue;
            };
            let spec = NetworkSpec {
                name: name.clone(),
                internal: true,
                subnet: Some(subnet.to_string()),
                // The sandbox must reach its gateway and nothing else: not the host either.
                no_host_address: true,
                labels: labels.clone(),
            };
            match self.engine.create_network(&spec).await {
                Ok(_) => return Ok((name, subnet)),
                Err(EngineError::Rejected(m) | EngineError::Conflict(m))
                    if m.contains("overlap") =>
                {
                    last = Some(m);
                }
                Err(e) => return Err(e.into()),
            }
        }
        if let Some(m) = last {
            tracing::warn!(error = %m, "egress subnets overlap");
        }
        Err(ApiError::Unavailable(format!(
            "no free subnet for the egress network in {pool}"
        )))
    }

    fn gateway_spec(
        &self,
        token: &str,
        ip: IpAddr,
        policy: &PolicyFile,
        helper: Option<&Bytes>,
    ) -> Result<ContainerSpec, ApiError> {
        let c = &self.config;
        let path = sidecar::config_path;
        let mut env = vec![
            (
                sidecar::env::LISTEN.to_string(),
                format!("{ip}:{}", c.egress_proxy_port),
            ),
            (sidecar::env::SESSION_ID.to_string(), token.to_string()),
            (
                sidecar::env::POLICY_FILE.to_string(),
                path(sidecar::POLICY_FILE),
            ),
            (
                sidecar::env::CA_CERT_FILE.to_string(),
                path(sidecar::CA_CERT_FILE),
            ),
            (
                sidecar::env::CA_KEY_FILE.to_string(),
                path(sidecar::CA_KEY_FILE),
            ),
        ];
        if !c.egress_allowed_cidrs.is_empty() {
            let cidrs: Vec<String> = c
                .egress_allowed_cidrs
                .iter()
                .map(|n| n.to_string())
                .collect();
            env.push((sidecar::env::ALLOWED_CIDRS.to_string(), cidrs.join(",")));
        }
        let mut files = vec![
            (sidecar::POLICY_FILE, policy_json(policy)?, 0o600),
            (sidecar::CA_CERT_FILE, self.ca_cert.clone(), 0o644),
            (sidecar::CA_KEY_FILE, self.ca_key.clone(), 0o600),
        ];
        if let Some(bundle) = &self.upstream_ca {
            files.push((sidecar::UPSTREAM_CA_FILE, bundle.clone(), 0o644));
            env.push((
                sidecar::env::UPSTREAM_CA_FILE.to_string(),
                path(sidecar::UPSTREAM_CA_FILE),
            ));
        }
        if let Some(proxy) = &c.egress_upstream_proxy {
            env.push((
                sidecar::env::UPSTREAM_PROXY.to_string(),
                proxy.expose().to_string(),
            ));
        }
        let egress_network = c
            .egress_proxy_network
            .clone()
            .or_else(|| c.network.clone())
            .unwrap_or_else(|| "bridge".to_string());
        Ok(ContainerSpec {
            name: None,
            image: c.egress_proxy_image.clone(),
            entrypoint: None,
            cmd: None,
            env,
            labels: HashMap::from([
                (MANAGED_LABEL.to_string(), "true".to_string()),
                (ROLE_LABEL.to_string(), ROLE_EGRESS_GATEWAY.to_string()),
                (EGRESS_LABEL.to_string(), token.to_string()),
                (DEPLOYMENT_LABEL.to_string(), c.deployment.clone()),
            ]),
            user: None,
            init: false,
            runtime: c.egress_proxy_runtime.as_str().to_string(),
            memory_bytes: c.egress_proxy_memory_bytes,
            nano_cpus: c.egress_proxy_cpus.map(|n| (n * 1e9).round() as i64),
            pids_limit: GATEWAY_PIDS_LIMIT,
            network: NetworkAttach::Network {
                name: egress_network,
                ip: None,
            },
            volumes: Vec::new(),
            // Audit lines are the sandbox's to provoke: bounded on disk.
            log_options: vec![
                ("max-size".to_string(), "10m".to_string()),
                ("max-file".to_string(), "3".to_string()),
            ],
            skeleton: Some(config_tar_with(&files, true, helper)),
        })
    }
}

/// FNV-1a (64 bits): a change detector for the warm pool's spec hash, not a security property.
pub fn fnv(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// A fresh token for an egress session's parts.
pub fn random_token() -> String {
    format!("{:016x}", rand::random::<u64>())
}
