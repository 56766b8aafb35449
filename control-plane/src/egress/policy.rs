//! The policy file as the API takes it and the gateway reads it: parsing and validation (never
//! echoing the body's strings), and installing a policy into a live gateway, acknowledged.
//!
//! Every install ends the same way, in [`Egress::acknowledge`]: the gateway's own
//! `health --expect-version` runs inside the gateway until it enforces the new version, so a
//! 204 (or a 201 from a claim) means the policy is in effect.

use std::time::Duration;

use futures::StreamExt;
use shared_policy::PolicyFile;
use shared_policy::sidecar;

use super::EgressError;
use super::files::{config_tar, policy_json};
use super::{Egress, GATEWAY_UID, POLICY_ACK_TIMEOUT, Triad};
use crate::backoff::Backoff;
use crate::engine::{EngineError, ExecSpec};
use crate::runtime::Writer;

/// Parses an `egress` body as the policy file and applies the API's validation. Parse errors
/// never echo the body's strings (see [`EgressError::MalformedPolicy`]).
pub fn parse_policy(value: &serde_json::Value) -> Result<PolicyFile, EgressError> {
    let file: PolicyFile =
        serde_json::from_value(value.clone()).map_err(EgressError::MalformedPolicy)?;
    shared_policy::validate_for_api(&file)?;
    Ok(file)
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

    /// Replaces the gateway's policy without a restart: extracts it as the staging file, which
    /// the gateway renames over its policy once complete, then waits until the gateway enforces
    /// its version.
    pub async fn refresh(&self, triad: &Triad, policy: &PolicyFile) -> Result<(), EgressError> {
        self.ensure_gateway(triad).await?;
        let policy = self.versions.label(policy);
        let version = policy.version.clone().unwrap_or_default();
        let tar = config_tar(
            &[(sidecar::POLICY_STAGING_FILE, policy_json(&policy)?, 0o600)],
            false,
        );
        let body = futures::stream::once(async move { Ok(tar) }).boxed();
        self.engine
            .put_archive(&triad.gateway, sidecar::CONFIG_DIR, body)
            .await
            .map_err(EgressError::gateway("could not update the egress policy"))?;
        self.acknowledge(&triad.gateway, &version).await
    }

    /// A warm-pool claim's policy, in one exec: the session helper in the gateway writes it over
    /// the gateway's policy file (a complete file renamed into place, which the gateway reloads)
    /// and then runs the gateway's `health --expect-version`, the same acknowledgement as a
    /// refresh. `ready` is that exec opened ahead of the claim ([`Egress::installer`]); when it
    /// is gone, a fresh one. Without the helper there (the write never said `ok`), the
    /// staged-file path of [`Egress::refresh`].
    pub async fn install(
        &self,
        triad: &Triad,
        policy: &PolicyFile,
        ready: Option<Writer>,
    ) -> Result<(), EgressError> {
        let policy = self.versions.label(policy);
        let version = policy.version.clone().unwrap_or_default();
        let content = policy_json(&policy)?;
        let run = async {
            if let Some(writer) = ready {
                match writer.finish_then(&content, vec![version.clone()]).await {
                    Ok(said) => return Ok(said),
                    Err(e) => {
                        tracing::debug!(gateway = %triad.gateway, error = %e, "the installer opened ahead was lost; opening another")
                    }
                }
            }
            let writer = self.installer(triad).await?;
            writer.finish_then(&content, vec![version.clone()]).await
        };
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
        Err(EgressError::NotAcknowledged { detail: "" })
    }

    /// The exec [`Egress::install`] writes a policy through, waiting for it: the helper's
    /// `write-file` over the gateway's policy file, then `health --expect-version` with the
    /// version given at the write.
    pub async fn installer(&self, triad: &Triad) -> Result<Writer, EngineError> {
        let health = [
            sidecar::BINARY.to_string(),
            sidecar::HEALTH_SUBCOMMAND.to_string(),
            "--timeout-ms".to_string(),
            POLICY_ACK_TIMEOUT.as_millis().to_string(),
            "--expect-version".to_string(),
        ];
        Writer::open(
            &*self.engine,
            &triad.gateway,
            &format!("{GATEWAY_UID}:{GATEWAY_UID}"),
            &sidecar::config_path(sidecar::POLICY_FILE),
            0o600,
            &health,
        )
        .await
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
