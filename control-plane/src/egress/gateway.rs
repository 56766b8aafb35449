//! The gateway sidecar: its container spec and config archive, readiness, and its restart.
//!
//! The CA key, the upstream bundle and the policy (with its secrets) go into the gateway's own
//! config directory, owned by the gateway's non-root user: nothing of them is ever in the
//! sandbox.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use shared_policy::PolicyFile;
use shared_policy::sidecar;

use super::EgressError;
use super::policy::policy_json;
use super::{Egress, GATEWAY_UID, Triad};
use crate::archive::{Archive, ROOT, entry_name};
use crate::engine::{
    ContainerSpec, DEPLOYMENT_LABEL, EGRESS_LABEL, MANAGED_LABEL, NetworkAttach,
    ROLE_EGRESS_GATEWAY, ROLE_LABEL,
};
use crate::layout;

/// What the gateway logs once it accepts connections.
const GATEWAY_READY_LINE: &str = sidecar::READY_LINE;
const GATEWAY_READY_TIMEOUT: Duration = Duration::from_secs(20);
const GATEWAY_PIDS_LIMIT: i64 = 256;

impl Egress {
    pub(super) async fn wait_ready(&self, gateway: &str) -> Result<(), EgressError> {
        self.engine
            .wait_for_log(gateway, GATEWAY_READY_LINE, GATEWAY_READY_TIMEOUT)
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
    pub async fn ensure_gateway(&self, triad: &Triad) -> Result<(), EgressError> {
        if self.gateway_running(triad).await? {
            return Ok(());
        }
        self.engine
            .start(&triad.gateway)
            .await
            .map_err(EgressError::gateway("egress gateway could not start"))?;
        self.wait_ready(&triad.gateway).await
    }

    pub(super) fn gateway_spec(
        &self,
        token: &str,
        ip: IpAddr,
        policy: &PolicyFile,
        helper: Option<&Bytes>,
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
            nano_cpus: c.egress.proxy_cpus.map(|n| (n * 1e9).round() as i64),
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

/// The gateway's config files, owned by the gateway's user; `with_dir` adds the directory
/// entry itself (first creation).
pub(super) fn config_tar(files: &[(&str, Bytes, u32)], with_dir: bool) -> Bytes {
    config_tar_with(files, with_dir, None)
}

/// [`config_tar`], plus the session helper at its usual path (root-owned, as in a sandbox): a
/// warm-pool member's gateway gets it so a claim installs its policy with one exec instead of
/// an archive upload.
pub(super) fn config_tar_with(
    files: &[(&str, Bytes, u32)],
    with_dir: bool,
    helper: Option<&Bytes>,
) -> Bytes {
    let gateway = (GATEWAY_UID, GATEWAY_UID);
    let mut tar = Archive::new();
    let prefix = if with_dir {
        format!("{}/", entry_name(sidecar::CONFIG_DIR))
    } else {
        String::new()
    };
    if with_dir {
        tar.dir(&prefix, 0o700, gateway);
    }
    for (name, data, mode) in files {
        tar.file(&format!("{prefix}{name}"), *mode, gateway, data);
    }
    if let Some(bin) = helper {
        tar.dir(entry_name(layout::SERVICE_DIR), 0o755, ROOT).file(
            entry_name(layout::HELPER),
            0o755,
            ROOT,
            bin,
        );
    }
    // The names are constants and the policy files' fixed names: nothing `tar` refuses.
    tar.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_tar_is_owned_by_the_gateway_user() -> std::io::Result<()> {
        let tar_bytes = config_tar(&[("config.json", Bytes::from_static(b"{}"), 0o600)], true);
        let mut archive = tar::Archive::new(&tar_bytes[..]);
        for entry in archive.entries()? {
            let entry = entry?;
            assert_eq!(entry.header().uid()?, u64::from(GATEWAY_UID));
        }
        Ok(())
    }
}
