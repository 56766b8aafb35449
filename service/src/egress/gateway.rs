//! The gateway sidecar: its container spec and config archive, readiness, and its restart.
//!
//! The CA key, the upstream bundle and the policy (with its secrets) go into the gateway's own
//! config directory, owned by the gateway's non-root user: nothing of them is ever in the
//! sandbox.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use shared_policy::PolicyFile;
use shared_policy::sidecar;

use super::EgressError;
use super::files::{config_tar, policy_json};
use super::{Egress, Triad};
use crate::engine::{
    ContainerSpec, DEPLOYMENT_LABEL, EGRESS_LABEL, MANAGED_LABEL, NetworkAttach,
    ROLE_EGRESS_GATEWAY, ROLE_LABEL,
};
use crate::shared_file::SharedFile;

const GATEWAY_READY_TIMEOUT: Duration = Duration::from_secs(20);
const GATEWAY_PIDS_LIMIT: i64 = 256;
/// Largest policy file read back from a gateway.
const POLICY_MAX: usize = 16 * 1024 * 1024;

impl Egress {
    pub(super) async fn wait_ready(&self, gateway: &str) -> Result<(), EgressError> {
        self.engine
            .wait_for_log(gateway, sidecar::READY_LINE, GATEWAY_READY_TIMEOUT)
            .await
            .map_err(EgressError::gateway("egress gateway did not become ready"))
    }

    /// Whether the triad's gateway runs (503 when it is gone).
    pub async fn gateway_running(&self, triad: &Triad) -> Result<bool, EgressError> {
        self.engine
            .inspect(&triad.gateway)
            .await
            .map(|info| info.is_running())
            .map_err(EgressError::gateway("egress gateway unavailable"))
    }

    /// Starts a stopped gateway and waits until it listens (warm restart, or one killed behind
    /// the service's back). Its policy file, the latest one, is kept in its container.
    /// A paused gateway (a paused session's) is thawed.
    pub async fn ensure_gateway(&self, triad: &Triad) -> Result<(), EgressError> {
        let info = self
            .engine
            .inspect(&triad.gateway)
            .await
            .map_err(EgressError::gateway("egress gateway unavailable"))?;
        if info.is_paused() {
            return self
                .engine
                .unpause(&triad.gateway)
                .await
                .map_err(EgressError::gateway("egress gateway could not be thawed"));
        }
        if info.is_running() {
            return Ok(());
        }
        self.engine
            .start(&triad.gateway)
            .await
            .map_err(EgressError::gateway("egress gateway could not start"))?;
        self.wait_ready(&triad.gateway).await
    }

    /// Freezes the triad's gateway with its paused sandbox (a running one only).
    pub async fn pause_gateway(&self, triad: &Triad) -> Result<(), EgressError> {
        let info = self
            .engine
            .inspect(&triad.gateway)
            .await
            .map_err(EgressError::gateway("egress gateway unavailable"))?;
        if !info.is_running() {
            return Ok(());
        }
        self.engine
            .pause(&triad.gateway)
            .await
            .map_err(EgressError::gateway("egress gateway could not be paused"))
    }

    /// The policy (with its secrets) the triad's gateway enforces now, read from its config
    /// directory: a fork's gateways get the same. Never logged.
    pub async fn current_policy(&self, triad: &Triad) -> Result<PolicyFile, EgressError> {
        let path = sidecar::config_path(sidecar::POLICY_FILE);
        let json = crate::engine::read_file(&*self.engine, &triad.gateway, &path, POLICY_MAX)
            .await
            .map_err(EgressError::gateway("egress gateway's policy unreadable"))?
            .ok_or(EgressError::PolicyUnreadable("no policy file"))?;
        serde_json::from_slice(&json)
            .map_err(|_| EgressError::PolicyUnreadable("not a policy file"))
    }

    pub(super) fn gateway_spec(
        &self,
        token: &str,
        ip: IpAddr,
        policy: &PolicyFile,
        helper: Option<&SharedFile>,
    ) -> Result<ContainerSpec, EgressError> {
        let c = &self.config;
        let path = sidecar::config_path;
        let mut env = vec![
            (
                sidecar::env::LISTEN.to_string(),
                format!("{ip}:{}", c.egress.proxy_port),
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
            // Loopback of the gateway's own network namespace: the acknowledgement (an exec in
            // the gateway) reaches it, the sandbox does not.
            (
                sidecar::env::HEALTH_LISTEN.to_string(),
                sidecar::DEFAULT_HEALTH_LISTEN.to_string(),
            ),
        ];
        if !c.egress.plain_http_hosts.is_empty() {
            let hosts: Vec<String> = c
                .egress
                .plain_http_hosts
                .iter()
                .map(ToString::to_string)
                .collect();
            env.push((sidecar::env::PLAIN_HTTP_HOSTS.to_string(), hosts.join(",")));
        }
        if !c.egress.allowed_cidrs.is_empty() {
            let cidrs: Vec<String> = c
                .egress
                .allowed_cidrs
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
        if let Some(proxy) = &c.egress.upstream_proxy {
            env.push((
                sidecar::env::UPSTREAM_PROXY.to_string(),
                proxy.expose().to_string(),
            ));
        }
        let egress_network = c
            .egress
            .proxy_network
            .clone()
            .or_else(|| c.sessions.network.clone())
            .unwrap_or_else(|| "bridge".to_string());
        Ok(ContainerSpec {
            name: None,
            image: c.egress.proxy_image.clone(),
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
            cap_add: Vec::new(),
            sysctls: Vec::new(),
            init: false,
            runtime: c.egress.proxy_runtime.as_str().to_string(),
            memory_bytes: c.egress.proxy_memory_bytes,
            nano_cpus: c.egress.proxy_cpus.map(crate::api::nano_cpus),
            pids_limit: GATEWAY_PIDS_LIMIT,
            network: NetworkAttach::Network {
                name: egress_network,
                ip: None,
            },
            volumes: Vec::new(),
            named_volumes: Vec::new(),
            read_only_volumes: Vec::new(),
            host_dirs: Vec::new(),
            // Audit lines are the sandbox's to provoke: bounded on disk.
            log_options: vec![
                ("max-size".to_string(), "10m".to_string()),
                ("max-file".to_string(), "3".to_string()),
            ],
            auto_remove: false,
            skeleton: config_tar(&files, helper),
        })
    }
}
