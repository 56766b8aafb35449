//! OpenSandbox's egress over the session's gateway: a create's `networkPolicy`, and the egress
//! sidecar's `/policy` and `/credential-vault` (port 18080's endpoint, `/egress/{id}/...`).
//!
//! The gateway's policy file is the one store. `networkPolicy` rules become `allow` and `deny`
//! rules, in order (first match decides, as OpenSandbox's sidecar does); the vault is kept in
//! the file's `door` state (credential values included: the file lives only in the gateway),
//! and each binding becomes `credential` rules (one per host) with a secret that renders its
//! header. A `credential` rule never widens what is reachable, and as OpenSandbox's sidecar
//! does, a binding's hosts must be covered by an explicit `allow` rule. Every edit reads the
//! file the gateway enforces and installs the next one under the session's lock
//! ([`op::EditEgress`]), acknowledged before the answer.

use std::collections::{BTreeMap, HashSet};

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use shared_policy::{
    DefaultAction, Evaluator, HeaderSecret, Host, InterceptMode, PolicyError, PolicyFile, Rule,
    RuleAction, SecretValue,
};

use super::{Answer, Failure, OpenSandbox};
use crate::error::ApiError;
use crate::ops::lifecycle as op;

/// Secrets (and the `inject` of credential rules) the vault writes are named under this.
const VAULT_SECRET: &str = "opensandbox-vault:";
/// OpenSandbox's default binding methods.
const DEFAULT_METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

/// `allow` or `deny`, as OpenSandbox writes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Allow,
    Deny,
}

/// One `networkPolicy.egress[]` entry.
#[derive(Debug, Clone, Deserialize)]
pub struct NetworkRule {
    action: Action,
    #[serde(default)]
    target: Option<String>,
    #[serde(default)]
    ports: Option<Value>,
}

/// A create's `networkPolicy`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicy {
    #[serde(default)]
    default_action: Option<Action>,
    #[serde(default)]
    egress: Option<Vec<NetworkRule>>,
}

/// The native `egress` body of a create with `networkPolicy`: TLS is intercepted only where a
/// credential is injected (as OpenSandbox's sidecar leaves other traffic alone).
pub fn create_body(np: &NetworkPolicy) -> Result<Value, Failure> {
    let rules = np
        .egress
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, r)| rule_of(r, &format!("networkPolicy.egress[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let default = match np.default_action.unwrap_or(Action::Deny) {
        Action::Allow => DefaultAction::Allow,
        Action::Deny => DefaultAction::Deny,
    };
    if default == DefaultAction::Deny && !rules.iter().any(|r| r.action == RuleAction::Allow) {
        return Err(Failure::bad_request(
            "networkPolicy: a deny default without an allow rule reaches nothing; leave \
             networkPolicy out for a sandbox without network",
        ));
    }
    let mut file = PolicyFile::default();
    file.policy.default = default;
    file.policy.intercept = InterceptMode::Credentialed;
    file.policy.rules = rules;
    settle_intercept(&mut file);
    check(&file, None)?;
    serde_json::to_value(&file).map_err(|_| Failure::bad_request("networkPolicy: not encodable"))
}

/// TLS is terminated only where a credential is injected, unless a deny rule under an allow
/// default must hold: a blind tunnel to an allowed name could carry requests for the denied
/// one (a shared CDN front), which only a terminated connection's destination binding (SNI
/// and `Host` against the CONNECT name) refuses. Never lowered: a policy that terminated
/// everything keeps doing so.
fn settle_intercept(file: &mut PolicyFile) {
    let denylist = file.policy.default == DefaultAction::Allow
        && file
            .policy
            .rules
            .iter()
            .any(|r| r.action == RuleAction::Deny);
    if denylist {
        file.policy.intercept = InterceptMode::All;
    }
}

/// A target as rules are compared by name: lower case, without a trailing dot.
fn same_target(host: &str) -> String {
    host.trim().trim_end_matches('.').to_ascii_lowercase()
}

/// Our rule for an OpenSandbox rule (`at` names it in errors).
fn rule_of(r: &NetworkRule, at: &str) -> Result<Rule, Failure> {
    if r.ports.as_ref().is_some_and(|p| !p.is_null()) {
        return Err(Failure::bad_request(format!(
            "{at}.ports: rules name hosts here, on every port; port rules are not served"
        )));
    }
    let target = r
        .target
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Failure::bad_request(format!("{at}.target is required")))?;
    if target.contains('/') {
        return Err(Failure::bad_request(format!(
            "{at}.target {target:?}: CIDR ranges are not served; name a host or an address"
        )));
    }
    Ok(Rule {
        host: same_target(target),
        methods: vec!["*".to_string()],
        inject: None,
        paths: None,
        action: match r.action {
            Action::Allow => RuleAction::Allow,
            Action::Deny => RuleAction::Deny,
        },
    })
}

/// What the gateway would refuse, said in OpenSandbox's terms, and (with a vault) bindings
/// whose hosts the network policy does not explicitly allow.
fn check(file: &PolicyFile, vault: Option<&Vault>) -> Result<(), Failure> {
    let mut bare = file.clone();
    bare.door = None;
    shared_policy::validate_for_api(&bare).map_err(|e| match e {
        PolicyError::InvalidHost { index, reason } => {
            let host = file.policy.rules.get(index).map(|r| r.host.as_str());
            match (file.policy.rules.get(index).map(|r| r.action), host) {
                (Some(RuleAction::Credential), Some(h)) => {
                    Failure::bad_request(format!("a binding's host {h:?}: {reason}"))
                }
                (_, h) => Failure::bad_request(format!(
                    "networkPolicy rule target {:?}: {reason}",
                    h.unwrap_or("")
                )),
            }
        }
        PolicyError::NothingReachable => Failure::bad_request(
            "networkPolicy: a deny default without an allow rule reaches nothing",
        ),
        // Secret names and values never appear in these messages.
        other => Failure::bad_request(other.to_string()),
    })?;
    if let Some(v) = vault {
        covered(file, v)?;
    }
    Ok(())
}

/// Every binding host must be reached through an explicit `allow` rule of the network policy
/// (a credential for a host the policy leaves to its default, or denies, is refused as
/// OpenSandbox's sidecar refuses it).
fn covered(file: &PolicyFile, vault: &Vault) -> Result<(), Failure> {
    let mut deciding = file.clone();
    deciding.door = None;
    deciding
        .policy
        .rules
        .retain(|r| r.action != RuleAction::Credential);
    let ev = Evaluator::from_file_model(deciding)
        .map_err(|e| Failure::bad_request(format!("networkPolicy: {e}")))?;
    // An allow rule written as `*.s`: it covers a binding's `*.x` where `x` is `s` or under it.
    let wildcards: Vec<String> = file
        .policy
        .rules
        .iter()
        .filter(|r| r.action == RuleAction::Allow)
        .filter_map(|r| r.host.strip_prefix("*.").map(same_target))
        .collect();
    for b in &vault.bindings {
        for h in &b.matching.hosts {
            let probe = match h.strip_prefix("*.") {
                Some(rest) => format!("probe.{rest}"),
                None => h.clone(),
            };
            // A wildcard binding needs a wildcard allow rule at least as wide, not a rule that
            // happens to match the probe (an exact `probe.x`, or `p*`).
            let wide_enough = match h.strip_prefix("*.") {
                None => true,
                Some(rest) => wildcards
                    .iter()
                    .any(|w| rest == w || rest.ends_with(&format!(".{w}"))),
            };
            let ok = wide_enough
                && Host::parse(&probe).is_ok_and(|host| {
                    let d = ev.decide_connect(&host);
                    d.allowed && d.reason == shared_policy::Reason::RuleAllowed
                });
            if !ok {
                return Err(Failure::bad_request(format!(
                    "binding {:?} host {h:?} is not covered by an explicit allow egress rule",
                    b.name
                )));
            }
        }
    }
    Ok(())
}

// === the vault, as the door keeps it ===

/// The vault with its credential values: the `door` state of the gateway's policy file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Vault {
    revision: i64,
    credentials: Vec<StoredCredential>,
    bindings: Vec<Binding>,
}

#[derive(Clone, Serialize, Deserialize)]
struct StoredCredential {
    name: String,
    revision: i64,
    value: String,
}

/// Never the value: a credential in a log line or a panic message is a leaked credential.
impl std::fmt::Debug for StoredCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredCredential")
            .field("name", &self.name)
            .field("revision", &self.revision)
            .finish_non_exhaustive()
    }
}

/// The door's state in the policy file.
#[derive(Debug, Default, Serialize, Deserialize)]
struct DoorState {
    #[serde(default, rename = "opensandboxVault")]
    vault: Option<Vault>,
}

/// A credential as a request gives it.
#[derive(Deserialize)]
struct Credential {
    name: String,
    source: Source,
}

#[derive(Deserialize)]
struct Source {
    #[serde(rename = "type")]
    kind: String,
    value: String,
}

/// `match`, with OpenSandbox's defaults filled in.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Match {
    #[serde(default)]
    schemes: Option<Vec<String>>,
    #[serde(default)]
    ports: Option<Vec<u32>>,
    hosts: Vec<String>,
    #[serde(default)]
    methods: Option<Vec<String>>,
    #[serde(default)]
    paths: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type")]
enum Auth {
    #[serde(rename = "bearer")]
    Bearer { credential: String },
    #[serde(rename = "basic")]
    Basic { credential: String },
    #[serde(rename = "apiKey")]
    ApiKey { name: String, credential: String },
    #[serde(rename = "customHeaders")]
    CustomHeaders { headers: Vec<CustomHeader> },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct CustomHeader {
    name: String,
    credential: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Binding {
    name: String,
    #[serde(rename = "match")]
    matching: Match,
    auth: Auth,
}

impl Auth {
    /// The one header this binding sets, and the credential whose value it carries.
    fn header(&self) -> Result<(String, &str, &'static str), Failure> {
        Ok(match self {
            Self::Bearer { credential } => ("Authorization".into(), credential, "Bearer "),
            Self::Basic { credential } => ("Authorization".into(), credential, "Basic "),
            Self::ApiKey { name, credential } => (name.trim().to_string(), credential, ""),
            Self::CustomHeaders { headers } => match headers.as_slice() {
                [one] => (one.name.trim().to_string(), &one.credential, ""),
                _ => {
                    return Err(Failure::bad_request(
                        "auth.customHeaders: one header per binding is served here; bind \
                         other headers in bindings of their own",
                    ));
                }
            },
        })
    }

    /// What a read shows: the type, and an API key's header name.
    fn shown(&self) -> Value {
        match self {
            Self::Bearer { .. } => json!({"type": "bearer"}),
            Self::Basic { .. } => json!({"type": "basic"}),
            Self::ApiKey { name, .. } => json!({"type": "apiKey", "name": name}),
            Self::CustomHeaders { .. } => json!({"type": "customHeaders"}),
        }
    }
}

/// A binding checked and normalised: defaults filled in, what the gateway cannot do refused.
fn normalise(mut b: Binding) -> Result<Binding, Failure> {
    let at = format!("binding {:?}", b.name);
    if b.name.trim().is_empty() {
        return Err(Failure::bad_request("a binding needs a name"));
    }
    let m = &mut b.matching;
    let schemes = m.schemes.get_or_insert_with(|| vec!["https".into()]);
    if schemes.iter().any(|s| !s.eq_ignore_ascii_case("https")) {
        return Err(Failure::bad_request(format!(
            "{at}: match.schemes: credentials are injected over TLS only (https)"
        )));
    }
    let ports = m.ports.get_or_insert_with(|| vec![443]);
    if ports.iter().any(|p| *p != 443) {
        return Err(Failure::bad_request(format!(
            "{at}: match.ports: only 443 (https) is accepted; the gateway's rules name hosts, \
             so the credential is set on TLS requests to the host whichever port they use"
        )));
    }
    if m.hosts.is_empty() {
        return Err(Failure::bad_request(format!(
            "{at}: match.hosts must name a host"
        )));
    }
    for h in &mut m.hosts {
        *h = h.trim().trim_end_matches('.').to_ascii_lowercase();
    }
    let methods = m
        .methods
        .get_or_insert_with(|| DEFAULT_METHODS.map(String::from).to_vec());
    for x in methods.iter_mut() {
        *x = x.trim().to_ascii_uppercase();
    }
    let paths = m.paths.get_or_insert_with(|| vec!["/*".into()]);
    for p in paths.iter() {
        path_glob(p)
            .map_err(|why| Failure::bad_request(format!("{at}: match.paths {p:?}: {why}")))?;
    }
    let (name, _, _) = b.auth.header()?;
    if name.is_empty() {
        return Err(Failure::bad_request(format!(
            "{at}: auth needs a header name"
        )));
    }
    Ok(b)
}

/// OpenSandbox's path pattern as a path glob of ours: `/*` is every path, a pattern ending in
/// `/*` a prefix, anything else exact. `None` for every path.
fn path_glob(p: &str) -> Result<Option<String>, &'static str> {
    if !p.starts_with('/') {
        return Err("a path starts with /");
    }
    if p == "/*" {
        return Ok(None);
    }
    match p.strip_suffix("/*") {
        Some(prefix) if !prefix.contains('*') => Ok(Some(format!("{prefix}/**"))),
        Some(_) => Err("only a trailing /* is a wildcard here"),
        None if p.contains('*') => Err("only a trailing /* is a wildcard here"),
        None => Ok(Some(p.to_string())),
    }
}

impl Vault {
    fn value_of(&self, credential: &str) -> Option<&str> {
        self.credentials
            .iter()
            .find(|c| c.name == credential)
            .map(|c| c.value.as_str())
    }

    /// Its rules and secrets (credential values rendered into headers).
    fn rules(&self) -> Result<(Vec<Rule>, BTreeMap<String, HeaderSecret>), Failure> {
        let mut rules = Vec::new();
        let mut secrets = BTreeMap::new();
        for b in &self.bindings {
            let (header, credential, prefix) = b.auth.header()?;
            let value = self.value_of(credential).ok_or_else(|| {
                Failure::bad_request(format!(
                    "binding {:?} references unknown credential {credential:?}",
                    b.name
                ))
            })?;
            let secret = format!("{VAULT_SECRET}{}", b.name);
            secrets.insert(
                secret.clone(),
                HeaderSecret {
                    header,
                    value: SecretValue::new(format!("{prefix}{value}")),
                },
            );
            let m = &b.matching;
            let mut paths = Vec::new();
            let mut every = false;
            for p in m.paths.iter().flatten() {
                match path_glob(p) {
                    Ok(Some(g)) => paths.push(g),
                    Ok(None) => every = true,
                    Err(_) => {}
                }
            }
            for host in &m.hosts {
                rules.push(Rule {
                    host: host.clone(),
                    methods: m.methods.clone().unwrap_or_default(),
                    inject: Some(secret.clone()),
                    paths: (!every).then(|| paths.clone()),
                    action: RuleAction::Credential,
                });
            }
        }
        Ok((rules, secrets))
    }

    /// What a read shows: names, revisions, matches and auth types; never a value.
    fn state(&self) -> Value {
        let mut credentials: Vec<Value> = self
            .credentials
            .iter()
            .map(|c| json!({"name": c.name, "sourceType": "inline", "revision": c.revision}))
            .collect();
        credentials.sort_by_key(|c| c["name"].as_str().map(str::to_owned));
        json!({
            "revision": self.revision,
            "credentials": credentials,
            "bindings": self.bindings_shown(),
        })
    }

    fn binding_shown(&self, b: &Binding) -> Value {
        json!({
            "name": b.name,
            "revision": self.revision,
            "match": b.matching,
            "auth": b.auth.shown(),
        })
    }

    fn bindings_shown(&self) -> Vec<Value> {
        let mut all: Vec<&Binding> = self.bindings.iter().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all.into_iter().map(|b| self.binding_shown(b)).collect()
    }
}

/// The vault the file keeps, if one was created.
fn vault_of(file: &PolicyFile) -> Option<Vault> {
    let door = file.door.as_ref()?;
    serde_json::from_str::<DoorState>(door.expose()).ok()?.vault
}

/// `file` with `vault` (or none) as its door state and its credential rules and secrets
/// derived from it; the deciding rules and any other secrets are kept as they are.
fn with_vault(mut file: PolicyFile, vault: Option<&Vault>) -> Result<PolicyFile, Failure> {
    let ours = |name: Option<&str>| name.is_some_and(|n| n.starts_with(VAULT_SECRET));
    file.policy
        .rules
        .retain(|r| !(r.action == RuleAction::Credential && ours(r.inject.as_deref())));
    file.secrets.retain(|k, _| !ours(Some(k)));
    file.door = None;
    settle_intercept(&mut file);
    if let Some(v) = vault {
        let (rules, secrets) = v.rules()?;
        file.policy.rules.extend(rules);
        file.secrets.extend(secrets);
        let state = DoorState {
            vault: Some(v.clone()),
        };
        let text = serde_json::to_string(&state)
            .map_err(|_| Failure::bad_request("credential vault: not encodable"))?;
        // Either intercept mode terminates TLS where a credential rule matches.
        file.door = Some(SecretValue::new(text));
    }
    check(&file, vault)?;
    Ok(file)
}

// === /policy ===

fn action_of(r: &Rule) -> Option<Action> {
    match r.action {
        RuleAction::Allow => Some(Action::Allow),
        RuleAction::Deny => Some(Action::Deny),
        RuleAction::Credential => None,
    }
}

/// The policy as OpenSandbox's sidecar reports it.
fn policy_status(file: &PolicyFile) -> Value {
    let egress: Vec<Value> = file
        .policy
        .rules
        .iter()
        .filter_map(|r| action_of(r).map(|a| json!({"action": a, "target": r.host})))
        .collect();
    let (default, mode) = match file.policy.default {
        DefaultAction::Allow => ("allow", "allow_all"),
        DefaultAction::Deny => ("deny", "deny_all"),
    };
    json!({
        "status": "ok",
        "mode": mode,
        "enforcementMode": "proxy",
        "policy": {"defaultAction": default, "egress": egress},
    })
}

/// A body as JSON of `T`: a 400 naming what is wrong (serde's message names fields and types,
/// never a value for the shapes here, but the value is dropped all the same).
fn parsed<T: serde::de::DeserializeOwned>(raw: &[u8], what: &str) -> Result<T, Failure> {
    serde_json::from_slice(raw).map_err(|e| {
        Failure::bad_request(format!("{what}: {}", shared_policy::redact(&e.to_string())))
    })
}

/// `GET /policy`.
pub async fn get_policy(State(s): State<OpenSandbox>, Path(id): Path<String>) -> Answer {
    let file = s.reach(&id, op::ReadEgress).await?;
    Ok(Json(policy_status(&file)).into_response())
}

/// `PATCH /policy`: the given rules first (the first of a target wins), then the current rules
/// for other targets; the default and the vault stay.
pub async fn patch_policy(
    State(s): State<OpenSandbox>,
    Path(id): Path<String>,
    raw: axum::body::Bytes,
) -> Answer {
    let given: Vec<NetworkRule> = parsed(&raw, "a list of egress rules")?;
    if given.is_empty() {
        return Err(Failure::bad_request("at least one rule"));
    }
    let mut incoming = Vec::new();
    let mut seen = HashSet::new();
    for (i, r) in given.iter().enumerate() {
        let rule = rule_of(r, &format!("[{i}]"))?;
        if seen.insert(same_target(&rule.host)) {
            incoming.push(rule);
        }
    }
    let edit = op::EditEgress {
        edit: move |file: PolicyFile| {
            let vault = vault_of(&file);
            let mut next = file;
            let (deciding, rest): (Vec<Rule>, Vec<Rule>) = std::mem::take(&mut next.policy.rules)
                .into_iter()
                .partition(|r| r.action != RuleAction::Credential);
            let kept = deciding
                .into_iter()
                .filter(|r| !seen.contains(&same_target(&r.host)));
            next.policy.rules = incoming.into_iter().chain(kept).chain(rest).collect();
            Ok((
                with_vault(next, vault.as_ref()).map_err(failure_to_api)?,
                (),
            ))
        },
    };
    let (file, ()) = s.reach(&id, edit).await?;
    Ok(Json(policy_status(&file)).into_response())
}

/// `DELETE /policy`: the rules for these targets removed (an absent one is no error).
pub async fn delete_policy(
    State(s): State<OpenSandbox>,
    Path(id): Path<String>,
    raw: axum::body::Bytes,
) -> Answer {
    let targets: Vec<String> = parsed(&raw, "a list of targets")?;
    if targets.is_empty() {
        return Err(Failure::bad_request("at least one target"));
    }
    let gone: HashSet<String> = targets.iter().map(|t| same_target(t)).collect();
    let edit = op::EditEgress {
        edit: move |file: PolicyFile| {
            let vault = vault_of(&file);
            let mut next = file;
            next.policy.rules.retain(|r| {
                r.action == RuleAction::Credential || !gone.contains(&same_target(&r.host))
            });
            Ok((
                with_vault(next, vault.as_ref()).map_err(failure_to_api)?,
                (),
            ))
        },
    };
    let (file, ()) = s.reach(&id, edit).await?;
    Ok(Json(policy_status(&file)).into_response())
}

/// A door's refusal inside an edit, as the operation's error (its status and message kept).
fn failure_to_api(f: Failure) -> ApiError {
    match f.status {
        StatusCode::NOT_FOUND => ApiError::NotFoundDetail(f.message),
        StatusCode::CONFLICT => ApiError::Conflict(f.message),
        _ => ApiError::BadRequest(f.message),
    }
}

// === /credential-vault ===

#[derive(Deserialize)]
struct NewVault {
    credentials: Vec<Credential>,
    bindings: Vec<Binding>,
}

#[derive(Deserialize)]
#[serde(bound = "T: serde::de::DeserializeOwned")]
struct Mutations<T> {
    #[serde(default)]
    add: Vec<T>,
    #[serde(default)]
    replace: Vec<T>,
    #[serde(default)]
    delete: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VaultPatch {
    #[serde(default)]
    expected_revision: Option<i64>,
    #[serde(default)]
    credentials: Option<Mutations<Credential>>,
    #[serde(default)]
    bindings: Option<Mutations<Binding>>,
}

fn stored(c: Credential, revision: i64) -> Result<StoredCredential, Failure> {
    let name = c.name.trim().to_string();
    if name.is_empty() {
        return Err(Failure::bad_request("a credential needs a name"));
    }
    if c.source.kind != "inline" {
        return Err(Failure::bad_request(format!(
            "credential {name:?}: source.type must be inline"
        )));
    }
    let value = c.source.value.trim().to_string();
    if value.is_empty() {
        return Err(Failure::bad_request(format!(
            "credential {name:?}: source.value is empty"
        )));
    }
    Ok(StoredCredential {
        name,
        revision,
        value,
    })
}

/// Applies `add`, `replace` and `delete` by name; a name in two operations, an add of one
/// that exists or a replace or delete of one that does not is refused.
fn mutate<T>(
    list: &mut Vec<T>,
    m: Mutations<T>,
    name_of: impl Fn(&T) -> &str,
    what: &str,
) -> Result<(), Failure> {
    let mut mentioned = HashSet::new();
    let names = m
        .delete
        .iter()
        .map(String::as_str)
        .chain(m.replace.iter().map(&name_of))
        .chain(m.add.iter().map(&name_of));
    for n in names {
        if !mentioned.insert(n.to_string()) {
            return Err(Failure::bad_request(format!(
                "{what} {n:?} mentioned by more than one operation"
            )));
        }
    }
    for n in &m.delete {
        let before = list.len();
        list.retain(|x| name_of(x) != n);
        if list.len() == before {
            return Err(Failure::bad_request(format!("{what} {n:?} does not exist")));
        }
    }
    for x in m.replace {
        let slot = list
            .iter_mut()
            .find(|y| name_of(y) == name_of(&x))
            .ok_or_else(|| {
                Failure::bad_request(format!("{what} {:?} does not exist", name_of(&x)))
            })?;
        *slot = x;
    }
    for x in m.add {
        if list.iter().any(|y| name_of(y) == name_of(&x)) {
            return Err(Failure::bad_request(format!(
                "{what} {:?} already exists",
                name_of(&x)
            )));
        }
        list.push(x);
    }
    Ok(())
}

fn no_vault() -> Failure {
    Failure::new(StatusCode::NOT_FOUND, "credential vault not found")
}

/// `POST /credential-vault`: 201 and its state.
pub async fn create_vault(
    State(s): State<OpenSandbox>,
    Path(id): Path<String>,
    raw: axum::body::Bytes,
) -> Answer {
    let req: NewVault = parsed(&raw, "credential vault")?;
    let mut vault = Vault {
        revision: 1,
        ..Vault::default()
    };
    for c in req.credentials {
        let c = stored(c, 1)?;
        if vault.value_of(&c.name).is_some() {
            return Err(Failure::bad_request(format!(
                "duplicate credential name {:?}",
                c.name
            )));
        }
        vault.credentials.push(c);
    }
    for b in req.bindings {
        let b = normalise(b)?;
        if vault.bindings.iter().any(|x| x.name == b.name) {
            return Err(Failure::bad_request(format!(
                "duplicate binding name {:?}",
                b.name
            )));
        }
        vault.bindings.push(b);
    }
    let edit = op::EditEgress {
        edit: move |file: PolicyFile| {
            if vault_of(&file).is_some() {
                return Err(ApiError::Conflict(
                    "credential vault already exists".to_string(),
                ));
            }
            let next = with_vault(file, Some(&vault)).map_err(failure_to_api)?;
            Ok((next, vault.state()))
        },
    };
    let (_, state) = s.reach(&id, edit).await?;
    Ok((StatusCode::CREATED, Json(state)).into_response())
}

/// `GET /credential-vault`.
pub async fn get_vault(State(s): State<OpenSandbox>, Path(id): Path<String>) -> Answer {
    let vault = read_vault(&s, &id).await?;
    Ok(Json(vault.state()).into_response())
}

async fn read_vault(s: &OpenSandbox, id: &str) -> Result<Vault, Failure> {
    let file = s.reach(id, op::ReadEgress).await?;
    vault_of(&file).ok_or_else(no_vault)
}

/// `PATCH /credential-vault`: one atomic mutation, the revision one higher.
pub async fn patch_vault(
    State(s): State<OpenSandbox>,
    Path(id): Path<String>,
    raw: axum::body::Bytes,
) -> Answer {
    let req: VaultPatch = parsed(&raw, "credential vault mutation")?;
    let edit = op::EditEgress {
        edit: move |file: PolicyFile| {
            let mut vault = vault_of(&file)
                .ok_or_else(|| ApiError::NotFoundDetail("credential vault not found".into()))?;
            if let Some(want) = req.expected_revision
                && want != vault.revision
            {
                return Err(ApiError::Conflict(format!(
                    "expectedRevision {want} does not match current revision {}",
                    vault.revision
                )));
            }
            let next_revision = vault.revision + 1;
            let apply = || -> Result<(), Failure> {
                if let Some(m) = req.credentials {
                    let m = Mutations {
                        add: m
                            .add
                            .into_iter()
                            .map(|c| stored(c, next_revision))
                            .collect::<Result<_, _>>()?,
                        replace: m
                            .replace
                            .into_iter()
                            .map(|c| stored(c, next_revision))
                            .collect::<Result<_, _>>()?,
                        delete: m.delete,
                    };
                    mutate(&mut vault.credentials, m, |c| &c.name, "credential")?;
                }
                if let Some(m) = req.bindings {
                    let m = Mutations {
                        add: m.add.into_iter().map(normalise).collect::<Result<_, _>>()?,
                        replace: m
                            .replace
                            .into_iter()
                            .map(normalise)
                            .collect::<Result<_, _>>()?,
                        delete: m.delete,
                    };
                    mutate(&mut vault.bindings, m, |b| &b.name, "binding")?;
                }
                vault.revision = next_revision;
                Ok(())
            };
            apply().map_err(failure_to_api)?;
            let next = with_vault(file, Some(&vault)).map_err(failure_to_api)?;
            Ok((next, vault.state()))
        },
    };
    let (_, state) = s.reach(&id, edit).await?;
    Ok(Json(state).into_response())
}

/// `DELETE /credential-vault`: its credentials are injected no more (204).
pub async fn delete_vault(State(s): State<OpenSandbox>, Path(id): Path<String>) -> Answer {
    let edit = op::EditEgress {
        edit: |file: PolicyFile| {
            if vault_of(&file).is_none() {
                return Err(ApiError::NotFoundDetail(
                    "credential vault not found".into(),
                ));
            }
            Ok((with_vault(file, None).map_err(failure_to_api)?, ()))
        },
    };
    s.reach(&id, edit).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /credential-vault/credentials`.
pub async fn list_credentials(State(s): State<OpenSandbox>, Path(id): Path<String>) -> Answer {
    let state = read_vault(&s, &id).await?.state();
    Ok(
        Json(json!({"revision": state["revision"], "credentials": state["credentials"]}))
            .into_response(),
    )
}

/// `GET /credential-vault/credentials/{name}`.
pub async fn get_credential(
    State(s): State<OpenSandbox>,
    Path((id, name)): Path<(String, String)>,
) -> Answer {
    let state = read_vault(&s, &id).await?.state();
    let found = state["credentials"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["name"] == name.as_str()).cloned())
        .ok_or_else(|| {
            Failure::new(
                StatusCode::NOT_FOUND,
                format!("credential {name:?} not found"),
            )
        })?;
    Ok(Json(found).into_response())
}

/// `GET /credential-vault/bindings`.
pub async fn list_bindings(State(s): State<OpenSandbox>, Path(id): Path<String>) -> Answer {
    let vault = read_vault(&s, &id).await?;
    Ok(
        Json(json!({"revision": vault.revision, "bindings": vault.bindings_shown()}))
            .into_response(),
    )
}

/// `GET /credential-vault/bindings/{name}`.
pub async fn get_binding(
    State(s): State<OpenSandbox>,
    Path((id, name)): Path<(String, String)>,
) -> Answer {
    let vault = read_vault(&s, &id).await?;
    let b = vault
        .bindings
        .iter()
        .find(|b| b.name == name)
        .ok_or_else(|| {
            Failure::new(StatusCode::NOT_FOUND, format!("binding {name:?} not found"))
        })?;
    Ok(Json(vault.binding_shown(b)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn np(json: Value) -> NetworkPolicy {
        serde_json::from_value(json).expect("network policy")
    }

    fn file(json: Value) -> PolicyFile {
        serde_json::from_value(create_body(&np(json)).expect("accepted")).expect("policy file")
    }

    fn vault(bindings: Value) -> Vault {
        let bindings: Vec<Binding> = serde_json::from_value(bindings).expect("bindings");
        Vault {
            revision: 1,
            credentials: vec![StoredCredential {
                name: "gh".into(),
                revision: 1,
                value: "tok-1".into(),
            }],
            bindings: bindings
                .into_iter()
                .map(|b| normalise(b).expect("binding"))
                .collect(),
        }
    }

    #[test]
    fn a_network_policy_becomes_rules_in_order() {
        let f = file(json!({"defaultAction": "allow", "egress": [
            {"action": "allow", "target": "a.bad.test"},
            {"action": "deny", "target": "*.bad.test"}
        ]}));
        assert_eq!(f.policy.default, DefaultAction::Allow);
        // A deny rule under an allow default: every connection terminated, so a tunnel to an
        // allowed name cannot carry requests for the denied one.
        assert_eq!(f.policy.intercept, InterceptMode::All);
        let allowlist = file(json!({"egress": [{"action": "allow", "target": "a.test"},
            {"action": "deny", "target": "b.test"}]}));
        assert_eq!(allowlist.policy.intercept, InterceptMode::Credentialed);
        let shown = policy_status(&f);
        assert_eq!(
            shown["policy"],
            json!({"defaultAction": "allow", "egress": [
                {"action": "allow", "target": "a.bad.test"},
                {"action": "deny", "target": "*.bad.test"}
            ]})
        );
        assert_eq!(shown["mode"], "allow_all");
    }

    #[test]
    fn what_the_gateway_cannot_enforce_is_refused() {
        for (json, want) in [
            (json!({"egress": []}), "reaches nothing"),
            (
                json!({"egress": [{"action": "deny", "target": "x.test"}]}),
                "reaches nothing",
            ),
            (
                json!({"egress": [{"action": "allow", "target": "10.0.0.0/8"}]}),
                "CIDR",
            ),
            (
                json!({"egress": [{"action": "allow", "ports": [443]}]}),
                "ports",
            ),
            (
                json!({"egress": [{"action": "allow", "target": "a.test:443"}]}),
                "a.test:443",
            ),
        ] {
            let e = create_body(&np(json.clone())).expect_err(&json.to_string());
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert!(e.message.contains(want), "{json}: {}", e.message);
        }
    }

    #[test]
    fn a_binding_becomes_credential_rules_and_its_header() {
        let f = file(json!({"egress": [{"action": "allow", "target": "api.vault.test"}]}));
        let v = vault(json!([{"name": "b", "match": {"hosts": ["API.vault.test"]},
            "auth": {"type": "bearer", "credential": "gh"}}]));
        let next = with_vault(f, Some(&v)).expect("covered");
        let ev = Evaluator::from_file_model(next.clone()).expect("valid");
        let host = Host::parse("api.vault.test").expect("host");
        let d = ev.decide_http(&host, "GET", Some("/repos"));
        assert!(d.allowed);
        assert_eq!(
            d.inject.map(|i| i.value.expose().to_owned()),
            Some("Bearer tok-1".into())
        );
        // HEAD is not a default binding method: allowed, with no credential.
        assert_eq!(ev.decide_http(&host, "HEAD", Some("/")).inject, None);
        // The state comes back; a read shows no value.
        let back = vault_of(&next).expect("kept");
        assert_eq!(back.credentials[0].value, "tok-1");
        let shown = back.state().to_string();
        assert!(!shown.contains("tok-1"), "{shown}");
        assert!(!format!("{next:?}").contains("tok-1"));
        // Deleting the vault removes its rules and secrets, and nothing else.
        let gone = with_vault(next, None).expect("deleted");
        assert_eq!(gone.policy.rules.len(), 1);
        assert!(gone.secrets.is_empty() && gone.door.is_none());
    }

    #[test]
    fn a_binding_must_be_covered_by_an_allow_rule() {
        let f = file(json!({"defaultAction": "allow", "egress": [
            {"action": "deny", "target": "bad.test"}, {"action": "allow", "target": "*.ok.test"}
        ]}));
        for host in ["bad.test", "elsewhere.test"] {
            let v = vault(json!([{"name": "b", "match": {"hosts": [host]},
                "auth": {"type": "apiKey", "name": "X-Key", "credential": "gh"}}]));
            let e = with_vault(f.clone(), Some(&v)).expect_err(host);
            assert!(e.message.contains("not covered"), "{}", e.message);
        }
        let v = vault(
            json!([{"name": "b", "match": {"hosts": ["*.ok.test"], "paths": ["/v1/*"]},
            "auth": {"type": "apiKey", "name": "X-Key", "credential": "gh"}}]),
        );
        let next = with_vault(f, Some(&v)).expect("covered");
        let rule = next.policy.rules.last().expect("a credential rule");
        assert_eq!(rule.paths, Some(vec!["/v1/**".to_string()]));
    }

    #[test]
    fn a_wildcard_binding_needs_a_wildcard_allow_as_wide() {
        let b = |host: &str| {
            vault(json!([{"name": "b", "match": {"hosts": [host]},
                "auth": {"type": "bearer", "credential": "gh"}}]))
        };
        // Rules that match the probe name but not every name under the wildcard.
        for rules in [
            json!([{"action": "allow", "target": "probe.x.test"}]),
            json!([{"action": "allow", "target": "p*"}]),
            json!([{"action": "allow", "target": "*.y.x.test"}]),
        ] {
            let f = file(json!({"defaultAction": "allow", "egress": rules}));
            let e = with_vault(f, Some(&b("*.x.test"))).expect_err("not covered");
            assert!(e.message.contains("not covered"), "{}", e.message);
        }
        for rules in [
            json!([{"action": "allow", "target": "*.x.test"}]),
            json!([{"action": "allow", "target": "*.test"}]),
        ] {
            let f = file(json!({"egress": rules}));
            with_vault(f, Some(&b("*.x.test"))).expect("covered");
        }
    }

    #[test]
    fn targets_are_compared_by_name_whatever_their_case_or_final_dot() {
        let f = file(json!({"egress": [{"action": "allow", "target": "A.Test."},
            {"action": "allow", "target": "b.test"}]}));
        assert_eq!(f.policy.rules[0].host, "a.test");
        let ev = Evaluator::from_file_model(f).expect("valid");
        assert!(
            ev.decide_connect(&Host::parse("a.test").expect("host"))
                .allowed
        );
        assert_eq!(same_target(" A.TEST. "), same_target("a.test"));
    }

    #[test]
    fn a_stored_credential_never_prints_its_value() {
        let c = StoredCredential {
            name: "gh".into(),
            revision: 3,
            value: "tok-printed".into(),
        };
        let shown = format!("{c:?} {:?}", vault(json!([])));
        assert!(
            !shown.contains("tok-printed") && !shown.contains("tok-1"),
            "{shown}"
        );
    }

    #[test]
    fn bindings_the_gateway_cannot_honour_are_refused() {
        for (b, want) in [
            (
                json!({"name": "b", "match": {"hosts": ["a.test"], "schemes": ["http"]},
                "auth": {"type": "bearer", "credential": "gh"}}),
                "TLS",
            ),
            (
                json!({"name": "b", "match": {"hosts": ["a.test"], "ports": [8443]},
                "auth": {"type": "bearer", "credential": "gh"}}),
                "443",
            ),
            (
                json!({"name": "b", "match": {"hosts": ["a.test"], "paths": ["/a*b"]},
                "auth": {"type": "bearer", "credential": "gh"}}),
                "wildcard",
            ),
            (
                json!({"name": "b", "match": {"hosts": ["a.test"]},
                "auth": {"type": "customHeaders", "headers": [
                    {"name": "A", "credential": "gh"}, {"name": "B", "credential": "gh"}]}}),
                "one header",
            ),
        ] {
            let b: Binding = serde_json::from_value(b).expect("shape");
            let e = normalise(b).expect_err(want);
            assert!(e.message.contains(want), "{}", e.message);
        }
    }

    #[test]
    fn mutations_name_each_item_once() {
        let mut list = vec!["a".to_string(), "b".to_string()];
        let m = Mutations {
            add: vec!["c".to_string()],
            replace: vec!["a".to_string()],
            delete: vec!["b".to_string()],
        };
        mutate(&mut list, m, |s| s, "x").expect("applied");
        assert_eq!(list, ["a", "c"]);
        let twice = Mutations {
            add: vec!["a".to_string()],
            replace: vec![],
            delete: vec!["a".to_string()],
        };
        assert!(mutate(&mut list, twice, |s| s, "x").is_err());
        let missing = Mutations {
            add: vec![],
            replace: vec![],
            delete: vec!["zz".to_string()],
        };
        assert!(mutate(&mut list, missing, |s| s, "x").is_err());
    }
}
