//! A triad's lifecycle: create (network, gateway and the sandbox's wiring), stop, teardown, and
//! what is left of triads on the engine (the reaper's orphan sweep).
//!
//! Creation is one call, [`Egress::create`], so the order that keeps the triad sound lives in one
//! place: the network and the gateway before the sandbox (the sandbox joins the network and needs
//! the gateway's address), the gateway's start beside the sandbox's create and start (the two
//! slowest steps), the CA install and the policy acknowledgement before the session is handed
//! out, and on any failure the sandbox removed before the network (a network with members cannot
//! be removed). Removal is one function, [`teardown`], for every caller.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr};

use bytes::Bytes;
use futures::StreamExt;
use shared_policy::PolicyFile;

use super::EgressError;
use super::{Egress, GATEWAY_LABEL, NETWORK_LABEL, RULES_LABEL, RULES_WITH_ACTIONS};
use crate::engine::{
    ContainerEngine, ContainerInfo, ContainerSpec, DEPLOYMENT_LABEL, EGRESS_LABEL, EngineError,
    ExecSpec, MANAGED_LABEL, NetworkAttach, NetworkSpec, ROLE_EGRESS_GATEWAY, ROLE_EGRESS_NETWORK,
    ROLE_LABEL,
};
use crate::layout;
use crate::shared_file::SharedFile;

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

/// The caller's environment as a session takes it: for an egress session, without the
/// variables its own settings set (those win). The one rule a create (the skeleton's
/// environment file) and a warm-pool claim (the same file, written at the claim) both apply.
pub fn caller_env(
    env: Option<&std::collections::BTreeMap<String, String>>,
    egress: bool,
) -> impl Iterator<Item = (&String, &String)> {
    env.into_iter()
        .flatten()
        .filter(move |(k, _)| !egress || !sets_env(k))
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
    /// Whether its gateway enforces rule actions ([`RULES_LABEL`]).
    pub actions: bool,
}

impl Triad {
    pub fn of(info: &ContainerInfo) -> Option<Self> {
        Some(Self {
            token: info.label(EGRESS_LABEL)?.to_string(),
            gateway: info.label(GATEWAY_LABEL)?.to_string(),
            network: info.label(NETWORK_LABEL)?.to_string(),
            policy_version: None,
            actions: info.label(RULES_LABEL) == Some(RULES_WITH_ACTIONS),
        })
    }

    /// The parts [`teardown`] removes once the sandbox is gone.
    pub fn parts(&self) -> Parts {
        Parts {
            gateways: vec![self.gateway.clone()],
            networks: vec![self.network.clone()],
        }
    }
}

/// A triad's gateways and networks (ids or names): those a create made so far, those a
/// sandbox's labels name, or those the reaper found for one token.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Parts {
    pub gateways: Vec<String>,
    pub networks: Vec<String>,
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

/// Removes a triad's gateways, then its networks (the sandbox must be gone first: a network with
/// members cannot be removed). Parts already gone count as removed; a failure is logged and the
/// rest is still tried. Returns whether everything is gone. Session close, failed creates, pool
/// discards and the reaper's orphan sweep all remove through here.
pub async fn teardown(engine: &dyn ContainerEngine, parts: &Parts) -> bool {
    let mut ok = true;
    for gw in &parts.gateways {
        match engine.remove(gw).await {
            Ok(()) | Err(EngineError::NotFound) => {}
            Err(e) => {
                tracing::warn!(gateway = %gw, error = %e, "could not remove egress gateway");
                ok = false;
            }
        }
    }
    for net in &parts.networks {
        match engine.remove_network(net).await {
            Ok(()) | Err(EngineError::NotFound) => {}
            Err(e) => {
                tracing::warn!(network = %net, error = %e, "could not remove egress network");
                ok = false;
            }
        }
    }
    ok
}

/// One token's parts as found on the engine, whatever became of its sandbox.
#[derive(Debug, Default)]
pub struct Leftover {
    pub parts: Parts,
    /// Each part's creation (Unix seconds), `None` when the engine did not say.
    pub created: Vec<Option<i64>>,
}

impl Leftover {
    /// When the newest part was created; an unknown time counts as `unknown`.
    pub fn newest(&self, unknown: i64) -> i64 {
        self.created
            .iter()
            .map(|c| c.unwrap_or(unknown))
            .max()
            .unwrap_or(unknown)
    }
}

/// Every gateway and network of `deployment`, by egress token (parts without one are not
/// triads' and are left alone). The reaper removes those whose token no sandbox carries.
pub async fn leftovers(
    engine: &dyn ContainerEngine,
    deployment: &str,
) -> Result<BTreeMap<String, Leftover>, EngineError> {
    let mine = |role| [(ROLE_LABEL, role), (DEPLOYMENT_LABEL, deployment)];
    let gateways = engine.list(&mine(ROLE_EGRESS_GATEWAY)).await?;
    let networks = engine.list_networks(&mine(ROLE_EGRESS_NETWORK)).await?;
    let mut out: BTreeMap<String, Leftover> = BTreeMap::new();
    let token = |labels: &HashMap<String, String>| {
        labels.get(EGRESS_LABEL).filter(|t| !t.is_empty()).cloned()
    };
    for g in &gateways {
        if let Some(t) = token(&g.labels) {
            let found = out.entry(t).or_default();
            found.parts.gateways.push(g.id.clone());
            found.created.push(g.created);
        }
    }
    for n in &networks {
        if let Some(t) = token(&n.labels) {
            let found = out.entry(t).or_default();
            found.parts.networks.push(n.id.clone());
            found.created.push(n.created);
        }
    }
    Ok(out)
}

impl Egress {
    /// Creates an egress session whole: the internal network, the gateway, and the sandbox whose
    /// spec `sandbox` makes from the plan (how to wire it in); then waits until the sandbox trusts
    /// the CA and the gateway enforces `policy`. Returns the sandbox's id; on error nothing of it
    /// is left behind. `helper`: put the session helper into the gateway too (warm-pool members:
    /// their claim installs the policy through it, see [`Egress::install`]).
    pub async fn create(
        &self,
        token: &str,
        policy: &PolicyFile,
        helper: Option<&SharedFile>,
        sandbox: impl FnOnce(&SandboxPlan) -> ContainerSpec,
    ) -> Result<String, EgressError> {
        let mut created = Parts::default();
        let mut sandbox_id = None;
        let result = async {
            let plan = self.prepare(token, policy, &mut created, helper).await?;
            let spec = sandbox(&plan);
            let triad = plan.triad;
            let sandbox_up = async {
                let id = self.engine.create(&spec).await?;
                sandbox_id = Some(id.clone());
                self.engine.start(&id).await?;
                Ok::<_, EgressError>(id)
            };
            let gateway_up = async { self.engine.start(&triad.gateway).await };
            let (gateway_up, sandbox_up) = tokio::join!(gateway_up, sandbox_up);
            gateway_up?;
            let id = sandbox_up?;
            self.finish(&id, &triad).await?;
            Ok::<_, EgressError>(id)
        }
        .await;
        if result.is_err() {
            if let Some(id) = &sandbox_id {
                let _ = self.engine.remove(id).await;
            }
            teardown(&*self.engine, &created).await;
        }
        result
    }

    /// Creates the internal network and the gateway (not started: [`Egress::create`] starts it
    /// while it creates the sandbox); returns how to attach the sandbox. On error, `created`
    /// says what to tear down.
    async fn prepare(
        &self,
        token: &str,
        policy: &PolicyFile,
        created: &mut Parts,
        helper: Option<&SharedFile>,
    ) -> Result<SandboxPlan, EgressError> {
        let c = &self.config;
        // Pulled on demand (with the registry credentials), before anything of the triad
        // exists: a failed pull leaves nothing to tear down.
        self.engine
            .ensure_image(&c.egress.proxy_image)
            .await
            .map_err(EgressError::gateway(super::GATEWAY_IMAGE_FAILED))?;
        let token = token.to_string();
        let (network, subnet) = self.create_network(&token).await?;
        created.networks.push(network.clone());
        let base = u32::from(subnet.network());
        let gateway_ip = IpAddr::V4(Ipv4Addr::from(base + 2));
        let sandbox_ip = IpAddr::V4(Ipv4Addr::from(base + 3));

        let policy = self.versions.label(policy);
        let spec = self.gateway_spec(&token, gateway_ip, &policy, helper)?;
        let gateway = self.engine.create(&spec).await?;
        created.gateways.push(gateway.clone());
        self.engine
            .connect_network(&network, &gateway, Some(gateway_ip))
            .await?;

        let proxy = format!("http://{gateway_ip}:{}", c.egress.proxy_port);
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
                actions: true,
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
                (RULES_LABEL.to_string(), RULES_WITH_ACTIONS.to_string()),
            ],
            files: vec![(
                crate::archive::entry_name(layout::CA_CERT).to_string(),
                self.ca_cert.clone(),
            )],
        })
    }

    /// After the sandbox started: trust the CA inside it, and wait for the gateway to listen and
    /// enforce the session's policy, so the first command already reaches the proxy.
    async fn finish(&self, sandbox: &str, triad: &Triad) -> Result<(), EgressError> {
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

    async fn install_ca(&self, sandbox: &str) -> Result<(), EgressError> {
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

    /// Stops the gateway of a session being stopped (kept, as the sandbox is, for a warm
    /// restart by [`Egress::ensure_gateway`]).
    pub async fn stop(&self, triad: &Triad) {
        match self
            .engine
            .stop(&triad.gateway, self.config.sessions.stop_timeout)
            .await
        {
            Ok(()) | Err(EngineError::NotFound) => {}
            Err(e) => {
                tracing::warn!(gateway = %triad.gateway, error = %e, "could not stop egress gateway")
            }
        }
    }

    /// An internal network on a random /29 of the pool; a collision with an existing network
    /// is retried on another subnet.
    async fn create_network(&self, token: &str) -> Result<(String, ipnet::Ipv4Net), EgressError> {
        let pool = self.config.egress.subnet_pool;
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
        Err(EgressError::NoFreeSubnet(pool))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ContainerStatus;

    fn sandbox(labels: &[(&str, &str)]) -> ContainerInfo {
        ContainerInfo {
            id: "sandbox".to_string(),
            name: "sandbox".to_string(),
            image_id: None,
            status: ContainerStatus::Running,
            created: None,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            finished_at: None,
            memory_bytes: None,
            nano_cpus: None,
            env: Vec::new(),
            volumes: Vec::new(),
        }
    }

    #[test]
    fn a_triad_from_labels_names_its_parts_for_teardown() {
        let info = sandbox(&[
            (EGRESS_LABEL, "t"),
            (GATEWAY_LABEL, "gw"),
            (NETWORK_LABEL, "net"),
        ]);
        let parts = Triad::of(&info).map(|t| t.parts());
        assert_eq!(
            parts,
            Some(Parts {
                gateways: vec!["gw".to_string()],
                networks: vec!["net".to_string()],
            })
        );
        assert!(Triad::of(&sandbox(&[(EGRESS_LABEL, "t")])).is_none());
    }

    #[test]
    fn a_gateway_made_before_rule_actions_is_told_apart() {
        let old = [
            (EGRESS_LABEL, "t"),
            (GATEWAY_LABEL, "gw"),
            (NETWORK_LABEL, "net"),
        ];
        assert_eq!(Triad::of(&sandbox(&old)).map(|t| t.actions), Some(false));
        let new = [
            (EGRESS_LABEL, "t"),
            (GATEWAY_LABEL, "gw"),
            (NETWORK_LABEL, "net"),
            (RULES_LABEL, RULES_WITH_ACTIONS),
        ];
        assert_eq!(Triad::of(&sandbox(&new)).map(|t| t.actions), Some(true));
    }

    #[test]
    fn an_unknown_creation_time_counts_as_the_given_one() {
        let found = Leftover {
            parts: Parts::default(),
            created: vec![Some(10), None, Some(30)],
        };
        assert_eq!(found.newest(20), 30);
        assert_eq!(found.newest(40), 40);
        assert_eq!(Leftover::default().newest(5), 5);
    }
}
