//! Flattening deep stacks in the background, so that no snapshot copies a whole view on the
//! request path.
//!
//! A snapshot taken over [`FLATTEN_AT`]` - 1` layers or more queues its session's snapshot
//! (the new layer's first lower, `X`) here. The stack's task copies `X`'s whole view (its
//! layers mounted as a read-only overlay, whiteouts and opaque directories applied) into a new
//! base layer `F` of its own, then records `X → F` on a marker volume (`daiv-snapshot-X-flat`,
//! made last: the flat layer exists exactly when its marker does). From then on every stack
//! that reaches `X` ends at `F` ([`Snapshots::stack_ids`]): a session from `X` or from any
//! snapshot above it mounts at most [`FLATTEN_AT`] layers, and a snapshot of such a session is
//! still a layer of its changes. A stack whose flattening has not landed by
//! [`MAX_DEPTH`](super::MAX_DEPTH) layers still gets a base layer copied on the request path,
//! as before.
//!
//! `F`'s view is `X`'s stack's, so a layer over `X`'s stack means the same over `F` (overlay's
//! merge is the same, whatever layers the lowers are cut into): a session that mounted the long
//! stack and one that mounts the short one snapshot alike.
//!
//! Uses are labels, as for every layer (see `layers`): the marker carries `F`'s use, so `F`
//! stays while `X`'s layer does, and every volume mounted over `F` carries it too. When `X`'s
//! layer goes, its marker goes with it and `F` is released like any layer without a record.
//! The overlay views the copy reads carry their stack's uses while they exist, and the sweep
//! removes any a crash left.
//!
//! A flat layer is the service's own copy, not a snapshot: it is not counted against the
//! deployment's byte cap. Each is at most its stack's view, and a chain of forks makes one
//! every [`FLATTEN_AT`]` - 1` generations.

use super::layers::{
    COPY_FROM, COPY_TO, Copy, LAYOUT_LABEL, LAYOUT_STATE, SEEDED_LABEL, lowers_of, uses_label,
};
use super::*;

/// A snapshot whose stack would be this deep or deeper queues its first lower for flattening.
pub const FLATTEN_AT: usize = 8;
/// Role of the marker volume that says a layer's stack has a flat copy.
pub const ROLE_SNAPSHOT_FLAT: &str = "snapshot-flat";
/// Role of the read-only overlay a flattening copies from.
pub const ROLE_LAYER_VIEW: &str = "layer-view";
/// On a marker: the flat layer's id.
const FLAT_LABEL: &str = "daiv.sandbox.snapshot.flat";
/// On a flat layer: the layer whose stack it copies.
const FLATTENS_LABEL: &str = "daiv.sandbox.snapshot.flattens";

/// The marker of layer `id`'s flat copy.
fn flat_volume(id: &str) -> String {
    format!("daiv-snapshot-{id}-flat")
}

/// The read-only overlay a flattening into `flat` reads, for state directory `key`.
fn view_volume(flat: &str, key: &str) -> String {
    format!("daiv-snapshot-{flat}-view-{key}")
}

impl Snapshots {
    /// Every layer with a flat copy, and that copy (one listing).
    async fn flats(&self) -> Result<HashMap<String, String>, EngineError> {
        let markers = self
            .engine
            .list_volumes(&self.mine(ROLE_SNAPSHOT_FLAT))
            .await?;
        Ok(markers
            .into_iter()
            .filter_map(|v| {
                let x = v.labels.get(SNAPSHOT_LABEL)?;
                let f = v.labels.get(FLAT_LABEL)?;
                (is_snapshot_id(x) && is_snapshot_id(f) && v.name == flat_volume(x))
                    .then(|| (x.clone(), f.clone()))
            })
            .collect())
    }

    /// The ids of the layers a session from snapshot `id` mounts, top first: its own and the
    /// ones below it, as far as the first that has a flat copy, which ends the stack.
    /// [`SnapshotError::NotFound`] when its layer is gone.
    pub(super) async fn stack_ids(&self, id: &str) -> Result<Vec<String>, SnapshotError> {
        let name = data_volume(id);
        let (flats, top) = tokio::join!(self.flats(), self.engine.inspect_volume(&name));
        let flats = flats?;
        let top = match top {
            Ok(top) => top,
            Err(EngineError::NotFound) => return Err(SnapshotError::NotFound),
            Err(e) => return Err(e.into()),
        };
        if let Some(f) = flats.get(id) {
            return Ok(vec![f.clone()]);
        }
        let mut ids = vec![id.to_string()];
        for l in lowers_of(&top) {
            if let Some(f) = flats.get(&l) {
                ids.push(f.clone());
                break;
            }
            ids.push(l);
        }
        Ok(ids)
    }

    /// Queues layer `id` for flattening, with an image its copier can run (the helper is put
    /// into it). The stack's task takes it ([`Snapshots::run_flattener`]).
    pub(super) fn queue_flatten(&self, id: &str, image: &str) {
        self.flattening
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string(), image.to_string());
        self.flatten_wake.notify_one();
    }

    /// Flattens every queued layer, one after the other; how many got a flat copy.
    pub async fn flatten_pending(&self) -> usize {
        let mut made = 0;
        loop {
            let next = {
                let mut queue = self.flattening.lock().unwrap_or_else(|e| e.into_inner());
                let first = queue.keys().next().cloned();
                first.and_then(|id| queue.remove_entry(&id))
            };
            let Some((id, image)) = next else {
                return made;
            };
            let t = std::time::Instant::now();
            match self.flatten(&id, &image).await {
                Ok(Some(flat)) => {
                    made += 1;
                    tracing::info!(snapshot_id = %id, flat = %flat, ms = t.elapsed().as_millis() as u64, "snapshot: a deep stack flattened");
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(snapshot_id = %id, error = %e, "snapshot: a deep stack not flattened; the next snapshot over it retries")
                }
            }
        }
    }

    /// The stack's task: flattens what snapshots queue, as they queue it.
    pub async fn run_flattener(self: Arc<Self>) {
        loop {
            self.flatten_wake.notified().await;
            self.flatten_pending().await;
        }
    }

    /// Copies layer `x`'s whole stack into a new base layer and marks `x` with it; the flat
    /// layer's id, or `None` when there is nothing to do (flat already, or not a stack). On
    /// error nothing of it is left.
    async fn flatten(&self, x: &str, image: &str) -> Result<Option<String>, SnapshotError> {
        if !is_snapshot_id(x) {
            return Ok(None);
        }
        let flat = new_id(self.engine.id_prefix());
        // Its stack stays while it is read (the view's labels say so to other replicas too),
        // and the sweep leaves the flat layer alone until its marker holds it.
        let _pins = (self.pin(x), self.pin(&flat));
        let ids = self.stack_ids(x).await?;
        if ids.len() < 2 {
            return Ok(None);
        }
        let mut stack = Vec::with_capacity(ids.len());
        for id in &ids {
            stack.push(self.engine.inspect_volume(&data_volume(id)).await?);
        }
        let top = &stack[0].labels;
        let state = top.get(LAYOUT_LABEL).map(String::as_str) == Some(LAYOUT_STATE);
        let mut labels = self.labels(ROLE_SNAPSHOT_DATA, &flat);
        for key in [LAYOUT_LABEL, SEEDED_LABEL] {
            if let Some(v) = top.get(key) {
                labels.insert(key.to_string(), v.clone());
            }
        }
        labels.insert(FLATTENS_LABEL.to_string(), x.to_string());
        let data = self
            .engine
            .create_volume(&VolumeSpec {
                name: data_volume(&flat),
                labels,
                driver_opts: HashMap::new(),
            })
            .await?;
        let mut views = Vec::new();
        let made = self
            .copy_flat(x, &flat, image, (&ids, &stack, state), (&data, &mut views))
            .await;
        for name in &views {
            let _ = self.engine.remove_volume(name).await;
        }
        match made {
            Ok(true) => Ok(Some(flat)),
            Ok(false) => {
                let _ = self.engine.remove_volume(&data.name).await;
                Ok(None)
            }
            Err(e) => {
                let _ = self.engine.remove_volume(&data.name).await;
                Err(e)
            }
        }
    }

    /// [`Snapshots::flatten`]'s copy and marker: whether the marker is ours (another replica
    /// may have flattened `x` meanwhile). The views it made are pushed to `views`.
    async fn copy_flat(
        &self,
        x: &str,
        flat: &str,
        image: &str,
        (ids, stack, state): (&[String], &[VolumeInfo], bool),
        (data, views): (&VolumeInfo, &mut Vec<String>),
    ) -> Result<bool, SnapshotError> {
        let mut view_labels = self.labels(ROLE_LAYER_VIEW, flat);
        for id in ids {
            view_labels.insert(uses_label(id), "true".to_string());
        }
        let mut from = Vec::new();
        for (key, _) in state_keys(state) {
            let lowers = lower_dirs(stack, state, key);
            let options = format!("lowerdir={},userxattr", lowers.join(":"));
            if !lowers.iter().all(|p| usable_dir(p)) || options.len() > OPTIONS_MAX {
                return Err(SnapshotError::UnusableMountpoint);
            }
            let name = view_volume(flat, key);
            // Lower directories only: overlay mounts it read-only, its whiteouts applied and
            // its own records (`user.overlay.*`) hidden, which is the view a copy wants.
            let spec = VolumeSpec {
                name: name.clone(),
                labels: view_labels.clone(),
                driver_opts: HashMap::from([
                    ("type".to_string(), "overlay".to_string()),
                    ("device".to_string(), "overlay".to_string()),
                    ("o".to_string(), options),
                ]),
            };
            self.engine.create_volume(&spec).await?;
            views.push(name.clone());
            from.push((state.then_some(*key), name));
        }
        let copier = self
            .create_copier(flat, image, &from, &[(None, data.name.clone())])
            .await?;
        // Not capped: every layer of the stack was, when it was taken.
        let copied = self
            .run_copy(
                &copier,
                &[(COPY_FROM.to_string(), COPY_TO.to_string())],
                u64::MAX,
            )
            .await;
        let _ = self.engine.remove(&copier).await;
        match copied? {
            Ok(_) => {}
            Err(Copy::Refused) => {
                return Err(SnapshotError::Uncopyable {
                    depth: layers::COPY_DEPTH_MAX,
                });
            }
            Err(_) => {
                return Err(EngineError::Unavailable("the flat copy failed".into()).into());
            }
        }
        // The marker last: from now on every stack through `x` ends at the flat layer.
        let mut labels = self.labels(ROLE_SNAPSHOT_FLAT, x);
        labels.insert(FLAT_LABEL.to_string(), flat.to_string());
        labels.insert(uses_label(flat), "true".to_string());
        let marker = self
            .engine
            .create_volume(&VolumeSpec {
                name: flat_volume(x),
                labels,
                driver_opts: HashMap::new(),
            })
            .await?;
        // Docker answers an existing volume for a name taken: another replica's marker.
        Ok(marker.labels.get(FLAT_LABEL).map(String::as_str) == Some(flat))
    }

    /// Removes layer `x`'s marker (its layer is gone); the flat layer it held, to release.
    pub(super) async fn unmark_flat(&self, x: &str) -> Option<String> {
        let marker = self.engine.inspect_volume(&flat_volume(x)).await.ok()?;
        let flat = marker.labels.get(FLAT_LABEL).cloned();
        match self.engine.remove_volume(&marker.name).await {
            Ok(()) | Err(EngineError::NotFound) => flat.filter(|f| is_snapshot_id(f)),
            Err(_) => None,
        }
    }

    /// The sweep's part: views a crash left (not those of a flattening this replica runs),
    /// and markers whose layer is gone, with the flat layers they held.
    pub(super) async fn sweep_flats(
        &self,
        old: impl Fn(Option<i64>) -> bool,
    ) -> Result<(), EngineError> {
        let pinned = self.ledger().protected();
        for v in self
            .engine
            .list_volumes(&self.mine(ROLE_LAYER_VIEW))
            .await?
        {
            let mine = v
                .labels
                .get(SNAPSHOT_LABEL)
                .is_some_and(|f| pinned.contains(f));
            if old(v.created) && !mine {
                let _ = self.engine.remove_volume(&v.name).await;
            }
        }
        for v in self
            .engine
            .list_volumes(&self.mine(ROLE_SNAPSHOT_FLAT))
            .await?
        {
            let Some(x) = v.labels.get(SNAPSHOT_LABEL) else {
                continue;
            };
            if let Err(EngineError::NotFound) = self.engine.inspect_volume(&data_volume(x)).await
                && let Some(flat) = self.unmark_flat(x).await
            {
                self.release(&flat).await;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::fake::{FakeEngine, FakeExec};

    /// What a flattening that crashed leaves (its read-only view), and a marker whose layer
    /// went: the sweep removes both, with the flat layer the marker held; the view of a
    /// flattening this replica is running stays.
    #[tokio::test]
    async fn the_sweep_collects_a_crashed_flattenings_view_and_a_flat_copy_whose_layer_went()
    -> Result<(), Box<dyn std::error::Error>> {
        let engine = Arc::new(FakeEngine::new(|_| FakeExec::default()));
        let s = Snapshots::new(engine.clone(), crate::config::for_tests("k", &[]), None);
        let (x, flat, running) = (new_id(None), new_id(None), new_id(None));
        let volume = |name: String, labels| VolumeSpec {
            name,
            labels,
            driver_opts: HashMap::new(),
        };
        let data = s.labels(ROLE_SNAPSHOT_DATA, &flat);
        s.engine
            .create_volume(&volume(data_volume(&flat), data))
            .await?;
        let mut marker = s.labels(ROLE_SNAPSHOT_FLAT, &x);
        marker.insert(FLAT_LABEL.to_string(), flat.clone());
        marker.insert(uses_label(&flat), "true".to_string());
        s.engine
            .create_volume(&volume(flat_volume(&x), marker))
            .await?;
        for id in [&flat, &running] {
            let labels = s.labels(ROLE_LAYER_VIEW, id);
            s.engine
                .create_volume(&volume(view_volume(id, "workspace"), labels))
                .await?;
        }
        let _running = s.pin(&running);
        let later = SystemTime::now() + Duration::from_secs(60);
        s.sweep(later, Duration::ZERO).await?;
        assert_eq!(engine.volumes(), vec![view_volume(&running, "workspace")]);
        Ok(())
    }
}
