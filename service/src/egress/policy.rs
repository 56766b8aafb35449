//! The policy file as the API takes it and the gateway reads it: parsing and validation (never
//! echoing the body's strings), and installing a policy into a live gateway, acknowledged.
//!
//! Every install ends the same way, in [`Egress::acknowledge`]: the gateway's own
//! `health --expect-version` runs inside the gateway until it enforces the new version, so a
//! 204 (or a created session from a claim) means the policy is in effect.

use std::time::Duration;

use futures::StreamExt;
use shared_policy::PolicyFile;
use shared_policy::sidecar;

use super::EgressError;
use super::files::policy_json;
use super::{Egress, GATEWAY_UID, POLICY_ACK_TIMEOUT, Triad};
use crate::backoff::Backoff;
use crate::engine::{EngineError, ExecSpec};
use crate::runtime::{ServiceFile, Writer, Written};
use sandbox_protocol::write_file::WriteAnswer;

/// Parses an `egress` body as the policy file and applies the API's validation. Parse errors
/// never echo the body's strings (see [`EgressError::MalformedPolicy`]).
pub fn parse_policy(value: &serde_json::Value) -> Result<PolicyFile, EgressError> {
    let file: PolicyFile =
        serde_json::from_value(value.clone()).map_err(EgressError::MalformedPolicy)?;
    shared_policy::validate_for_api(&file)?;
    Ok(file)
}

/// Refuses a policy with `deny` or `credential` rules for a gateway made before them, which
/// would read them as `allow` rules (and widen what the sandbox reaches).
fn enforceable(triad: &Triad, policy: &PolicyFile) -> Result<(), EgressError> {
    let acts = policy
        .policy
        .rules
        .iter()
        .any(|r| r.action != shared_policy::RuleAction::Allow);
    if acts && !triad.actions {
        return Err(EgressError::GatewayPredatesActions);
    }
    Ok(())
}

impl Egress {
    /// Runs the gateway's `health --expect-version` inside the gateway (the image has only that
    /// binary; the exec shares the gateway's network namespace, so its listen address answers)
    /// until the gateway enforces `version`, for at most [`POLICY_ACK_TIMEOUT`]: 503 otherwise.
    pub(super) async fn acknowledge(
        &self,
        gateway: &str,
        version: &str,
    ) -> Result<(), EgressError> {
        let not_acked = |detail| EgressError::NotAcknowledged { detail };
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
            let mut exec = self
                .engine
                .exec(gateway, &spec)
                .await
                .map_err(EgressError::gateway("could not ask the egress gateway"))?;
            let mut output = Vec::new();
            while let Some(chunk) = exec.output.next().await {
                let chunk =
                    chunk.map_err(EgressError::gateway("could not ask the egress gateway"))?;
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
                        return Err(EgressError::gateway("could not ask the egress gateway")(e));
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

    /// Replaces the gateway's policy without a restart: uploads it as the staging file, which
    /// the gateway renames over its policy once complete, then waits until the gateway enforces
    /// its version. (A gateway made on the cold path has no helper to write through.)
    pub async fn refresh(&self, triad: &Triad, policy: &PolicyFile) -> Result<(), EgressError> {
        enforceable(triad, policy)?;
        self.ensure_gateway(triad).await?;
        let policy = self.versions.label(policy);
        let version = policy.version.clone().unwrap_or_default();
        policy_file()
            .upload(&*self.engine, &triad.gateway, &policy_json(&policy)?)
            .await
            .map_err(EgressError::gateway("could not update the egress policy"))?;
        self.acknowledge(&triad.gateway, &version).await
    }

    /// A warm-pool claim's policy, in one exec: the session helper in the gateway writes it over
    /// the gateway's policy file (which the gateway reloads) and then runs the gateway's
    /// `health --expect-version`, the same acknowledgement as a refresh. `ready` is that exec
    /// opened ahead of the claim ([`Egress::installer`]). Written any other way (the
    /// [`ServiceFile`] steps), it is acknowledged as a refresh is.
    pub async fn install(
        &self,
        triad: &Triad,
        policy: &PolicyFile,
        ready: Option<Writer>,
    ) -> Result<(), EgressError> {
        enforceable(triad, policy)?;
        let policy = self.versions.label(policy);
        let version = policy.version.clone().unwrap_or_default();
        let content = policy_json(&policy)?;
        let written = policy_file()
            .write(
                &*self.engine,
                &triad.gateway,
                &content,
                std::slice::from_ref(&version),
                ready,
            )
            .await
            .map_err(EgressError::gateway("could not update the egress policy"))?;
        match written {
            // No helper answered: the gateway may be down too (a stopped gateway still takes
            // an upload); it renames the staged file once it runs.
            Written::Uploaded => {
                self.ensure_gateway(triad).await?;
                self.acknowledge(&triad.gateway, &version).await
            }
            Written::ByHelper(WriteAnswer { exit: Some(0), .. }) => Ok(()),
            Written::ByHelper(answer) => {
                let last = answer.last_other.unwrap_or_default();
                tracing::warn!(gateway = %triad.gateway, version, answer = %last, "egress policy not acknowledged");
                Err(EgressError::NotAcknowledged { detail: "" })
            }
        }
    }

    /// The exec [`Egress::install`] writes a policy through, opened ahead of a claim.
    pub async fn installer(&self, triad: &Triad) -> Result<Writer, EngineError> {
        policy_file().open(&*self.engine, &triad.gateway).await
    }
}

/// The gateway's policy as a service file: the gateway user's, written through the session
/// helper a warm-pool gateway carries and acknowledged by `health --expect-version` (the
/// version given at the write) in the same exec; uploaded as the staging file otherwise.
fn policy_file() -> ServiceFile {
    ServiceFile {
        path: sidecar::config_path(sidecar::POLICY_FILE),
        mode: 0o600,
        owner: (GATEWAY_UID, GATEWAY_UID),
        upload_path: Some(sidecar::config_path(sidecar::POLICY_STAGING_FILE)),
        then: vec![
            sidecar::BINARY.to_string(),
            sidecar::HEALTH_SUBCOMMAND.to_string(),
            "--timeout-ms".to_string(),
            POLICY_ACK_TIMEOUT.as_millis().to_string(),
            "--expect-version".to_string(),
        ],
        deadline: POLICY_ACK_TIMEOUT + Duration::from_secs(5),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parse_errors_never_echo_body_strings() {
        let body = json!({"policy": {"default": "ghp_supersecret"}});
        let Err(e @ EgressError::MalformedPolicy(_)) = parse_policy(&body) else {
            panic!("expected a malformed policy");
        };
        let msg = e.to_string();
        assert!(msg.starts_with("invalid egress policy: "), "{msg}");
        assert!(!msg.contains("ghp_supersecret"), "{msg}");
    }

    #[test]
    fn api_validation_applies() {
        let deny_nothing = json!({"policy": {"default": "deny", "rules": []}});
        assert!(matches!(
            parse_policy(&deny_nothing),
            Err(EgressError::InvalidPolicy(_))
        ));
        let unknown_secret = json!({"policy": {"rules": [{"host": "a.test", "inject": "nope"}]}});
        assert!(matches!(
            parse_policy(&unknown_secret),
            Err(EgressError::InvalidPolicy(_))
        ));
        let ok =
            json!({"policy": {"rules": [{"host": "*.a.test", "methods": ["get"]}]}, "extra": 1});
        let file = parse_policy(&ok).expect("valid");
        assert_eq!(file.policy.rules[0].methods, vec!["GET"]);
    }
}

#[cfg(test)]
mod action_tests {
    use super::*;

    fn triad(actions: bool) -> Triad {
        Triad {
            token: "t".into(),
            gateway: "gw".into(),
            network: "net".into(),
            policy_version: None,
            actions,
        }
    }

    #[test]
    fn rule_actions_go_only_to_a_gateway_that_knows_them() {
        let with_deny: PolicyFile = serde_json::from_value(serde_json::json!({
            "policy": {"default": "allow", "rules": [{"host": "a.test", "action": "deny"}]}
        }))
        .expect("policy");
        let plain: PolicyFile = serde_json::from_value(serde_json::json!({
            "policy": {"rules": [{"host": "a.test"}]}
        }))
        .expect("policy");
        assert!(matches!(
            enforceable(&triad(false), &with_deny),
            Err(EgressError::GatewayPredatesActions)
        ));
        assert!(enforceable(&triad(true), &with_deny).is_ok());
        assert!(enforceable(&triad(false), &plain).is_ok());
    }
}
