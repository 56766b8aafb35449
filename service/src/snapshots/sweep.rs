//! The reaper's part: retention, then payload without a record and workspaces of sessions
//! that are gone.

use super::*;

impl Snapshots {
    /// The reaper's part: retention (expired snapshots, then the oldest beyond the count and
    /// byte caps), then the payload of snapshots without a record and the workspaces of
    /// sessions that are gone, once older than `guard` (a snapshot or session being made has
    /// them before its record or container). Returns the ids of the snapshots deleted.
    pub async fn sweep(
        &self,
        now: SystemTime,
        guard: Duration,
    ) -> Result<Vec<String>, EngineError> {
        let now = crate::time::unix_secs(now);
        let guard = i64::try_from(guard.as_secs()).unwrap_or(i64::MAX);
        let mut all = match self.list().await {
            Ok(all) => all,
            Err(SnapshotError::Engine(e)) => return Err(e),
            Err(_) => Vec::new(),
        };
        // Newest first: keep from the front, evict from the back.
        let mut deleted = Vec::new();
        all.retain(|s| {
            let expired = s.expires.is_some_and(|e| e <= now);
            if expired {
                deleted.push(s.id.clone());
            }
            !expired
        });
        let caps = &self.config.snapshots;
        let mut bytes: u64 = 0;
        let mut kept = Vec::new();
        for (i, s) in all.into_iter().enumerate() {
            bytes = bytes.saturating_add(s.size);
            if i >= caps.max_count as usize || (bytes > caps.max_bytes && i > 0) {
                deleted.push(s.id.clone());
            } else {
                kept.push(s.id);
            }
        }
        for id in &deleted {
            match self.delete(id).await {
                Ok(()) | Err(SnapshotError::NotFound) => {
                    tracing::info!(snapshot_id = %id, "reaper: snapshot removed (retention)")
                }
                Err(e) => {
                    tracing::warn!(snapshot_id = %id, error = %e, "reaper: snapshot not removed")
                }
            }
        }
        let live: HashSet<String> = kept.into_iter().collect();
        let old = |created: Option<i64>| created.unwrap_or(now).saturating_add(guard) <= now;

        // Holders and copiers left by a crash mid-snapshot; not those of a snapshot this
        // replica is taking, however long its copy takes.
        for role in [
            ROLE_SNAPSHOT_HOLDER,
            layers::ROLE_LAYER_COPIER,
            probe::ROLE_LAYER_PROBE,
        ] {
            let found = self.engine.list(&self.mine(role)).await?;
            let pinned = self.ledger().protected();
            for c in found {
                let taking = c
                    .label(SNAPSHOT_LABEL)
                    .is_some_and(|id| pinned.contains(id));
                if old(c.created) && !taking {
                    // A copier of a session's own workspace mounted that anonymous volume by
                    // name, so removing the session meanwhile left it: it goes with the copier
                    // unless a session still uses it (the engine refuses then).
                    let own = match role {
                        layers::ROLE_LAYER_COPIER => self.anonymous_sources(&c.id).await,
                        _ => Vec::new(),
                    };
                    let _ = self.engine.remove(&c.id).await;
                    for volume in own {
                        let _ = self.engine.remove_volume(&volume).await;
                    }
                }
            }
        }
        // Layer workers another replica left (it died), and this replica's idle ones (the
        // stack's task does too, whether the reaper runs or not).
        self.sweep_workers(now, guard).await?;
        self.retire_idle_workers(false).await;
        // Flattenings a crash left half-way, and flat copies of layers that are gone.
        self.sweep_flats(old).await?;
        // An overlay probe's volumes (its container went above), the overlay before the
        // volumes it is mounted over.
        let (merged, plain): (Vec<_>, Vec<_>) = self
            .engine
            .list_volumes(&self.mine(probe::ROLE_LAYER_PROBE))
            .await?
            .into_iter()
            .filter(|v| old(v.created))
            .partition(|v| v.name.ends_with("-merged"));
        for v in merged.into_iter().chain(plain) {
            let _ = self.engine.remove_volume(&v.name).await;
        }
        // Workspaces whose session is gone. A workspace is pinned until its container exists:
        // the pins are read after the workspaces are listed and before the sessions are, so a
        // listed workspace is either still pinned or has its container in the listing.
        let workspaces = self.engine.list_volumes(&self.mine(ROLE_WORKSPACE)).await?;
        let pinned = self.ledger().protected();
        let sessions = self.engine.list(&self.mine(ROLE_SANDBOX)).await?;
        let tokens: HashSet<&str> = sessions
            .iter()
            .filter_map(|c| c.label(WORKSPACE_LABEL))
            .collect();
        let mut gone: Vec<&str> = workspaces
            .iter()
            .filter(|v| old(v.created))
            .filter_map(|v| v.labels.get(WORKSPACE_LABEL).map(String::as_str))
            .filter(|t| !tokens.contains(t) && !pinned.contains(*t))
            .collect();
        gone.sort_unstable();
        gone.dedup();
        for token in gone {
            self.remove_workspace(token).await;
        }
        self.sweep_held().await?;
        self.sweep_tags().await?;
        // Payload without a record.
        let mut orphans: HashSet<String> = HashSet::new();
        for i in self.engine.list_images(&self.mine(ROLE_SNAPSHOT)).await? {
            if let Some(id) = i.labels.get(SNAPSHOT_LABEL)
                && !live.contains(id)
                && old(i.created)
            {
                orphans.insert(id.clone());
            }
        }
        for v in self
            .engine
            .list_volumes(&self.mine(ROLE_SNAPSHOT_DATA))
            .await?
        {
            if let Some(id) = v.labels.get(SNAPSHOT_LABEL)
                && !live.contains(id)
                && old(v.created)
            {
                orphans.insert(id.clone());
            }
        }
        // A snapshot this replica is taking has its payload before its record, and a fork's
        // payload is pinned until its forks hold it: not orphans, however short the guard (the
        // guard alone covers other replicas). The records are read again after the pins: a
        // snapshot taken since the first reading has its record by the time its pin goes.
        if orphans.is_empty() {
            return Ok(deleted);
        }
        let pinned = self.ledger().protected();
        orphans.retain(|id| !pinned.contains(id));
        let recorded: HashSet<String> = match self.list().await {
            Ok(all) => all.into_iter().map(|s| s.id).collect(),
            Err(SnapshotError::Engine(e)) => return Err(e),
            Err(_) => return Ok(deleted),
        };
        orphans.retain(|id| !recorded.contains(id));
        for id in orphans {
            self.release(&id).await;
        }
        Ok(deleted)
    }
}

impl Snapshots {
    /// Snapshot tags whose layer is gone. A tag ([`ContainerEngine::tag_image`]) carries its
    /// image's labels, not ours, so the listings by label miss it; one is left when its
    /// snapshot is released while it is its image's only name and a container uses that image
    /// (Docker refuses to untag then). No step of taking or releasing a snapshot has its tag
    /// without its layer (the layer is made first and removed last), so such a tag is nobody's,
    /// in any deployment.
    async fn sweep_tags(&self) -> Result<(), EngineError> {
        let tags = self.engine.image_tags(IMAGE_REPOSITORY).await?;
        let pinned = self.ledger().protected();
        for tag in tags {
            let Some((_, id)) = tag.rsplit_once(':') else {
                continue;
            };
            if pinned.contains(id) {
                continue;
            }
            if let Err(EngineError::NotFound) = self.engine.inspect_volume(&data_volume(id)).await {
                match self.engine.remove_image(&tag).await {
                    Ok(()) | Err(EngineError::NotFound) => {
                        tracing::info!(
                            snapshot_id = id,
                            "reaper: a snapshot's tag removed (its layer was gone)"
                        )
                    }
                    Err(e) => {
                        tracing::debug!(snapshot_id = id, error = %e, "reaper: a snapshot's tag still in use; kept")
                    }
                }
            }
        }
        Ok(())
    }

    /// The volumes a copier copies from that are anonymous ones (a session's own: Docker
    /// names those with 64 hex digits, ours all have names), at `/from` or under it.
    async fn anonymous_sources(&self, copier: &str) -> Vec<String> {
        let Ok(info) = self.engine.inspect(copier).await else {
            return Vec::new();
        };
        let under = format!("{}/", layers::COPY_FROM);
        info.volumes
            .into_iter()
            .filter(|(at, _)| at == layers::COPY_FROM || at.starts_with(&under))
            .map(|(_, name)| name)
            .filter(|name| name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::fake::{FakeEngine, FakeExec};

    /// A copier a crash left, of a session's own (anonymous) workspace: the sweep removes it,
    /// and the volume with it once no session uses it (a session removed meanwhile left it to
    /// the copier), never while one does.
    #[tokio::test]
    async fn a_left_copier_takes_the_anonymous_workspace_only_its_session_left()
    -> Result<(), Box<dyn std::error::Error>> {
        let engine = Arc::new(FakeEngine::new(|_| FakeExec::default()));
        let s = Snapshots::new(engine.clone(), crate::config::for_tests("k", &[]), None);
        let later = SystemTime::now() + Duration::from_secs(60);
        for session_lives in [true, false] {
            let own = format!("{:064x}", u8::from(session_lives));
            s.engine
                .create_volume(&VolumeSpec {
                    name: own.clone(),
                    labels: HashMap::new(),
                    driver_opts: HashMap::new(),
                })
                .await?;
            let layer = data_volume(&new_id(None));
            let copier = s
                .create_copier(
                    &new_id(None),
                    "img",
                    &[(None, own.clone())],
                    &[(None, layer.clone())],
                )
                .await?;
            let session = if session_lives {
                let mut spec = s.holder_spec("x", "img", &own);
                spec.labels = HashMap::new();
                Some(s.engine.create(&spec).await?)
            } else {
                None
            };
            s.sweep(later, Duration::ZERO).await?;
            assert!(matches!(
                s.engine.inspect(&copier).await,
                Err(EngineError::NotFound)
            ));
            assert_eq!(
                engine.volumes().contains(&own),
                session_lives,
                "session lives: {session_lives}"
            );
            if let Some(id) = session {
                s.engine.remove(&id).await?;
            }
        }
        Ok(())
    }

    /// A payload without a record and a workspace without a container, as a snapshot or a
    /// session being made has them for a moment: the sweep leaves them while they are pinned,
    /// however old they look, and collects them once the pins are gone.
    #[tokio::test]
    async fn the_sweep_leaves_what_is_pinned_and_collects_it_after()
    -> Result<(), Box<dyn std::error::Error>> {
        let engine = Arc::new(FakeEngine::new(|_| FakeExec::default()));
        let s = Snapshots::new(engine.clone(), crate::config::for_tests("k", &[]), None);
        let id = new_id(None);
        let payload = s.pin(&id);
        s.engine
            .create_volume(&VolumeSpec {
                name: data_volume(&id),
                labels: s.labels(ROLE_SNAPSHOT_DATA, &id),
                driver_opts: HashMap::new(),
            })
            .await?;
        let snapshot = Snapshot {
            id: id.clone(),
            name: None,
            source: "src".into(),
            base_image: "img".into(),
            created: unix_now(),
            expires: None,
            size: 0,
            user: None,
        };
        let present = || {
            let mut v = engine.volumes();
            v.sort();
            v
        };
        // Everything looks a minute old to these sweeps.
        let later = SystemTime::now() + Duration::from_secs(60);
        s.sweep(later, Duration::ZERO).await?;
        assert_eq!(present(), vec![data_volume(&id)], "a pinned payload");

        let workspace = s.workspace(&snapshot).await?;
        let mut all = workspace_volumes(&workspace.token).to_vec();
        all.push(data_volume(&id));
        all.sort();
        assert_eq!(present(), all);
        s.sweep(later, Duration::ZERO).await?;
        assert_eq!(present(), all, "pinned payload and workspace");
        drop(payload);
        s.sweep(later, Duration::ZERO).await?;
        assert_eq!(
            present(),
            all,
            "a pinned workspace keeps its snapshot's data"
        );
        drop(workspace);
        s.sweep(later, Duration::ZERO).await?;
        assert_eq!(
            present(),
            Vec::<String>::new(),
            "nothing pinned, nothing kept"
        );
        Ok(())
    }
}
