//! Taking a snapshot: the freeze, the commit (or the tag of the base image) and the layer copy
//! side by side.

use super::budget::Reservation;
use super::layers::{Copier, Layering, SEEDED_LABEL};
use super::*;
use crate::engine::ImageInfo;

impl Snapshots {
    /// Snapshots the session `info` (the caller holds its lock), whose image the caller
    /// inspected (`source`: a fork reads its environment too). A running session is frozen
    /// while its container is committed (unless its base image is tagged instead, before) and
    /// its workspace copied, side by side; a stopped one is read as it is. On error nothing of the snapshot is left. The pin
    /// keeps the sweep off its payload: a fork holds it until its forks' containers hold it.
    pub async fn take(
        &self,
        info: &ContainerInfo,
        source: &ImageInfo,
        req: &SnapshotRequest,
        keep: Keep,
    ) -> Result<(Snapshot, Timings, Pin<'_>), SnapshotError> {
        let id = new_id(self.engine.id_prefix());
        let pin = self.pin(&id);
        let base_image = info.labels.get(IMAGE_LABEL).cloned().unwrap_or_default();
        // Over the session's snapshot's layers when it has them: only its changes are copied.
        // Its own workspace is copied whole by the same copier (holes stay holes).
        let layering = self.layering(info).await;
        let mut labels = self.labels(ROLE_SNAPSHOT_DATA, &id);
        if let Some(l) = &layering {
            labels.extend(l.labels());
            // The seed marker is the service's, in the container's layer, which a state
            // snapshot does not keep: its layer says it instead.
            if l.state
                && self
                    .engine
                    .get_archive(&info.id, layout::SEED_MARKER)
                    .await
                    .is_ok()
            {
                labels.insert(SEEDED_LABEL.to_string(), "true".to_string());
            }
        }
        let data = match self
            .engine
            .create_volume(&VolumeSpec {
                name: data_volume(&id),
                labels,
                driver_opts: HashMap::new(),
            })
            .await
        {
            Ok(data) => data,
            Err(e) => {
                self.discard(&id).await;
                return Err(e.into());
            }
        };
        // Everything that does not need the freeze is done before it: the holder or the
        // copier, and whether the container's own layer needs a commit at all.
        let holder = match self.holder(source, &id, (&data, layering.as_ref())).await {
            Ok(holder) => holder,
            Err(e) => {
                self.discard(&id).await;
                return Err(e.into());
            }
        };
        // A session whose writable directories are all on its volumes, of an image where the
        // sandbox user can write nothing else: its container's layer holds only what the
        // service put there, which a session from the snapshot gets again. No commit: the
        // snapshot's image is its base image, by another name, and that layer is not measured
        // (Docker sizes a container by walking its whole root filesystem: seconds on
        // fuse-overlayfs, for nothing the snapshot keeps).
        let tag = match &layering {
            Some(l) if l.state => self.commits_nothing(holder.id(), &source.id, info).await,
            _ => false,
        };
        let reservation = match self.reserve(&id, info, !tag).await {
            Ok(r) => r,
            Err(e) => {
                self.release_copier(&holder).await;
                self.discard(&id).await;
                return Err(e);
            }
        };
        let made = self
            .capture(
                info,
                source,
                &id,
                &base_image,
                (&holder, tag, layering.as_ref()),
                &reservation,
            )
            .await;
        let (image_bytes, workspace_bytes, timings) = match made {
            Ok(m) => m,
            Err(e) => {
                self.discard(&id).await;
                return Err(e);
            }
        };
        let created = unix_now();
        let snapshot = Snapshot {
            id: id.clone(),
            name: req.name.clone(),
            source: info.id.clone(),
            base_image,
            created,
            expires: req
                .ttl
                .map(|t| created.saturating_add(i64::try_from(t.as_secs()).unwrap_or(i64::MAX))),
            size: image_bytes.saturating_add(workspace_bytes),
            user: info
                .labels
                .get(SANDBOX_USER_LABEL)
                .and_then(|l| SandboxUser::parse(l)),
        };
        if keep == Keep::Recorded
            && let Err(e) = self.write_record(&snapshot).await
        {
            self.discard(&id).await;
            return Err(e.into());
        }
        if keep == Keep::ForForks {
            // No record says a fork's size: this replica counts it until its payload goes.
            self.ledger().forks.insert(id.clone(), snapshot.size);
        }
        drop(reservation);
        // Deep enough: the stack below is flattened in the background, so that sessions from
        // this snapshot (and snapshots of theirs) stay layers.
        if let Some(l) = &layering
            && l.lowers.len() + 1 >= flatten::FLATTEN_AT
        {
            self.queue_flatten(&l.lowers[0], &source.id);
        }
        Ok((snapshot, timings, pin))
    }

    /// The holder (a never-started container for an archive copy of the workspace) or what
    /// copies the session's changes into `data`, as a layer (the image's layer worker, or a
    /// copier of its own), made before the freeze.
    async fn holder(
        &self,
        source: &ImageInfo,
        id: &str,
        (data, layering): (&VolumeInfo, Option<&Layering>),
    ) -> Result<Copier, EngineError> {
        match layering {
            Some(l) => {
                if let Some(worker) = self.worker_for(&source.id, data, l).await {
                    return Ok(worker);
                }
                let from: Vec<_> = l
                    .from
                    .iter()
                    .map(|(key, v)| (l.state.then_some(*key), v.clone()))
                    .collect();
                self.create_copier(id, &source.id, &from, &[(None, data.name.clone())])
                    .await
                    .map(Copier::Own)
            }
            None => self
                .engine
                .create(&self.holder_spec(id, &source.id, &data.name))
                .await
                .map(Copier::Own),
        }
    }

    /// Removes a copier or holder of the snapshot's own; a worker stays for the next.
    async fn release_copier(&self, copier: &Copier) {
        if let Copier::Own(id) = copier {
            let _ = self.engine.remove(id).await;
        }
    }

    /// The freeze, the commit (or, with `tag`, the tag before it) and the copy by `holder` (the
    /// session's changes as a layer over its snapshot's when `layering` says how, its whole
    /// workspace otherwise); the bytes of the image's own layer and of the copy. The holder is
    /// removed.
    async fn capture(
        &self,
        info: &ContainerInfo,
        source: &ImageInfo,
        id: &str,
        base_image: &str,
        (holder, tag, layering): (&Copier, bool, Option<&Layering>),
        reservation: &Reservation<'_>,
    ) -> Result<(u64, u64, Timings), SnapshotError> {
        // The commit's config (the source image's environment; its size is ours).
        let spec = self.commit_spec(info, id, &source.env, base_image);
        // The tag names the base image, which nothing the session does changes: made before the
        // freeze (the caller discards it with the rest should the snapshot fail).
        let tagged = match tag {
            true => {
                let t = std::time::Instant::now();
                if let Err(e) = self.engine.tag_image(&source.id, &image_ref(id)).await {
                    self.release_copier(holder).await;
                    return Err(e.into());
                }
                Some(t.elapsed())
            }
            false => None,
        };
        let freeze = info.is_running();
        let started = std::time::Instant::now();
        if freeze && let Err(e) = self.engine.pause(&info.id).await {
            self.release_copier(holder).await;
            return Err(e.into());
        }
        let size_max = self.config.snapshots.size_max;
        let commit = async {
            if let Some(took) = tagged {
                return Ok::<_, SnapshotError>((None, took));
            }
            let t = std::time::Instant::now();
            // Measured again frozen: what the sandbox wrote since the first measure (a sparse
            // file is made in an instant) cannot slip past the cap.
            if freeze {
                let layer = self.engine.writable_bytes(&info.id).await?.unwrap_or(0);
                if layer > size_max {
                    return Err(SnapshotError::TooLarge {
                        cap: size_max,
                        found: layer,
                        where_: "outside /workspace (the container's own files)",
                    });
                }
            }
            let image = self.engine.commit(&info.id, &spec).await?;
            Ok::<_, SnapshotError>((Some(image), t.elapsed()))
        };
        let copy = async {
            let t = std::time::Instant::now();
            let bytes = match layering {
                Some(_) => self.copy_layer(holder, reservation).await?,
                None => {
                    self.copy_workspace(&info.id, holder.id(), reservation)
                        .await?
                }
            };
            Ok::<_, SnapshotError>((bytes, t.elapsed()))
        };
        let (committed, copied) = tokio::join!(commit, copy);
        let frozen = started.elapsed();
        if freeze && let Err(e) = self.engine.unpause(&info.id).await {
            // Left frozen, the session would hang: say so loudly (the next request thaws it).
            tracing::error!(session_id = %info.id, error = %e, "snapshot: could not thaw the session");
        }
        self.release_copier(holder).await;
        let (image, commit_time) = committed?;
        let (workspace_bytes, copy_time) = copied?;
        let image_bytes = match image {
            Some(image) => {
                let own = self.engine.inspect_image(&image).await?.size;
                u64::try_from(own.saturating_sub(source.size)).unwrap_or(0)
            }
            None => 0,
        };
        Ok((
            image_bytes,
            workspace_bytes,
            Timings {
                frozen,
                commit: commit_time,
                copy: copy_time,
            },
        ))
    }

    /// A never-started container with the data volume at `/workspace`: the daemon mounts its
    /// volumes for an archive upload, which is how the copy lands in the volume.
    pub(super) fn holder_spec(&self, id: &str, image: &str, volume: &str) -> ContainerSpec {
        ContainerSpec {
            name: None,
            image: image.to_string(),
            entrypoint: Some(Vec::new()),
            cmd: Some(vec![layout::HELPER.to_string()]),
            env: Vec::new(),
            labels: self.labels(ROLE_SNAPSHOT_HOLDER, id),
            user: Some("0:0".to_string()),
            cap_add: Vec::new(),
            sysctls: Vec::new(),
            init: false,
            runtime: "runc".to_string(),
            memory_bytes: None,
            nano_cpus: None,
            pids_limit: 16,
            network: NetworkAttach::None,
            volumes: Vec::new(),
            named_volumes: vec![(volume.to_string(), layout::WORKSPACE.to_string())],
            read_only_volumes: Vec::new(),
            host_dirs: Vec::new(),
            log_options: Vec::new(),
            auto_remove: false,
            skeleton: Vec::new(),
        }
    }

    /// The image's config: the base image's environment plus the sandbox's own variables, and
    /// every other variable of the container's (the egress settings; a container of an older
    /// build had the caller's there too) blanked, because Docker merges the container's
    /// environment into a committed image's. The caller's environment is on the session's own
    /// volume, which no commit keeps (see the `sandbox` module); the container's own config, which
    /// Docker keeps as the image's `container_config`, holds none of it either.
    fn commit_spec(
        &self,
        info: &ContainerInfo,
        id: &str,
        image_env: &[String],
        base_image: &str,
    ) -> CommitSpec {
        let mut env: Vec<(String, String)> =
            image_env.iter().filter_map(|kv| split_env(kv)).collect();
        let mut blanked = Vec::new();
        for kv in &info.env {
            let Some((k, _)) = split_env(kv) else {
                continue;
            };
            if env.iter().any(|(ek, _)| *ek == k) {
                continue;
            }
            blanked.push(k.clone());
            env.push((k, String::new()));
        }
        // The container's own labels (its triad, its pool, its workspace) would otherwise be
        // the image's, and every session made from it would carry them: each is given an empty
        // value, which the service reads as absent ([`ContainerInfo::label`]). The base image's
        // labels stay.
        let mut labels: HashMap<String, String> = info
            .labels
            .keys()
            .filter(|k| k.starts_with("daiv.sandbox."))
            .map(|k| (k.clone(), String::new()))
            .collect();
        labels.extend(self.labels(ROLE_SNAPSHOT, id));
        labels.insert(IMAGE_LABEL.to_string(), base_image.to_string());
        labels.insert(BLANKED_LABEL.to_string(), blanked.join(","));
        CommitSpec {
            reference: image_ref(id),
            labels,
            env,
            entrypoint: Vec::new(),
            cmd: vec![layout::HELPER.to_string(), "init".to_string()],
            user: "0:0".to_string(),
        }
    }

    /// Streams the session's `/workspace` into the holder's volume; the bytes streamed. The
    /// stream is cut once it passes the reservation's budget (the archive writes a sparse
    /// file's holes as zeros): the snapshot is refused and its partial copy discarded.
    async fn copy_workspace(
        &self,
        session: &str,
        holder: &str,
        reservation: &Reservation<'_>,
    ) -> Result<u64, SnapshotError> {
        let budget = reservation.copy_budget;
        let counted = Arc::new(AtomicU64::new(0));
        let seen = counted.clone();
        let tar = self
            .engine
            .get_archive(session, layout::WORKSPACE)
            .await?
            .map(move |chunk| {
                let chunk = chunk.map_err(std::io::Error::other)?;
                let total =
                    seen.fetch_add(chunk.len() as u64, Ordering::Relaxed) + chunk.len() as u64;
                if total > budget {
                    return Err(std::io::Error::other("snapshot over its size cap"));
                }
                Ok(chunk)
            })
            .boxed();
        let put = self.engine.put_archive(holder, "/", tar).await;
        let total = counted.load(Ordering::Relaxed);
        if total > budget {
            return Err(reservation.refusal(total));
        }
        put?;
        Ok(total)
    }
}

fn split_env(kv: &str) -> Option<(String, String)> {
    let (k, v) = kv.split_once('=')?;
    Some((k.to_string(), v.to_string()))
}
