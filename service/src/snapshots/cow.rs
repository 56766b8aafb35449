//! Copy-on-write workspaces: a session from a snapshot mounts an overlay over its data.

use super::*;

impl Snapshots {
    /// A copy-on-write workspace over snapshot `s`'s data for a new session.
    pub async fn workspace(&self, s: &Snapshot) -> Result<Workspace<'_>, SnapshotError> {
        let lower = self
            .engine
            .inspect_volume(&data_volume(&s.id))
            .await
            .map_err(|e| match e {
                EngineError::NotFound => SnapshotError::NotFound,
                e => e.into(),
            })?;
        let token = crate::ids::random_token();
        let pin = self.pin(&token);
        let [merged, upper, work] = workspace_volumes(&token);
        let mut labels = self.labels(ROLE_WORKSPACE, &s.id);
        labels.insert(WORKSPACE_LABEL.to_string(), token.clone());
        let mut made: Vec<String> = Vec::new();
        let result = async {
            let mut dirs = Vec::new();
            for name in [&upper, &work] {
                let v = self
                    .engine
                    .create_volume(&VolumeSpec {
                        name: name.clone(),
                        labels: labels.clone(),
                        driver_opts: HashMap::new(),
                    })
                    .await?;
                made.push(name.clone());
                dirs.push(v.mountpoint);
            }
            let paths = [
                lower.mountpoint.as_str(),
                dirs[0].as_str(),
                dirs[1].as_str(),
            ];
            // The overlay's option string is split on commas and colons.
            if paths
                .iter()
                .any(|p| p.is_empty() || p.contains([',', ':', '\\']) || !p.starts_with('/'))
            {
                return Err(SnapshotError::UnusableMountpoint);
            }
            self.engine
                .create_volume(&VolumeSpec {
                    name: merged.clone(),
                    labels: labels.clone(),
                    driver_opts: HashMap::from([
                        ("type".to_string(), "overlay".to_string()),
                        ("device".to_string(), "overlay".to_string()),
                        (
                            "o".to_string(),
                            format!(
                                "lowerdir={},upperdir={},workdir={}",
                                paths[0], paths[1], paths[2]
                            ),
                        ),
                    ]),
                })
                .await?;
            made.push(merged.clone());
            Ok(())
        }
        .await;
        match result {
            Ok(()) => Ok(Workspace {
                token,
                merged,
                _pin: pin,
            }),
            Err(e) => {
                for name in made.iter().rev() {
                    let _ = self.engine.remove_volume(name).await;
                }
                Err(e)
            }
        }
    }

    /// Removes a session's copy-on-write workspace (after its container is gone).
    pub async fn remove_workspace(&self, token: &str) {
        for name in workspace_volumes(token) {
            match self.engine.remove_volume(&name).await {
                Ok(()) | Err(EngineError::NotFound) => {}
                Err(e) => {
                    tracing::warn!(volume = %name, error = %e, "workspace volume not removed")
                }
            }
        }
    }
}
