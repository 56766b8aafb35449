//! The fake's images and volumes with content, enough for the service's snapshots and forks to
//! run in-process: a commit records an image (its labels, environment and parent, no layer), a
//! volume is a host directory, an `overlay` volume is a copy of its lower directories (writes
//! to it are not sent to its upper), a container's named volume at `/workspace` is where its
//! helper serves, and archives in and out of `/workspace` read and write that directory.
//!
//! The helper's `copy-tree` (a snapshot's layer copy) is emulated: from an overlay's upper, it
//! copies what the overlay's directory changed over its lowers, deletions as `.wh.<name>` marker
//! files (the fake's whiteouts; an overlay volume applies them), so a stack of layers means in
//! the fake what it means in Docker.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use sandbox_protocol::layout;

use super::FakeEngine;
use crate::{CommitSpec, EngineError, ImageInfo, VolumeInfo, VolumeSpec};

fn unavailable(e: impl std::fmt::Display) -> EngineError {
    EngineError::Unavailable(e.to_string())
}

impl FakeEngine {
    /// The host directory holding volume `name`'s content, where Docker's local driver has it
    /// under its root (`volumes/<name>/_data`).
    pub fn volume_dir(&self, name: &str) -> PathBuf {
        self.dirs.root.join("volumes").join(name).join("_data")
    }

    /// The named volume container `id` has at `at`, if any.
    pub(super) fn mounted_volume(&self, id: &str, at: &str) -> Option<String> {
        self.with(|s| {
            let (spec, _) = s.containers.get(id)?;
            spec.named_volumes
                .iter()
                .chain(&spec.read_only_volumes)
                .find(|(_, target)| target == at)
                .map(|(name, _)| name.clone())
        })
    }

    /// Makes container `id`'s anonymous volumes at the state directories named ones, as Docker
    /// names them (64 hex digits), mounted where they were asked for; the others stay its own
    /// files, as every container's are.
    pub(super) fn name_anonymous_volumes(&self, id: &str) -> Result<(), EngineError> {
        let state = |p: &String| layout::STATE.iter().any(|(_, at)| at == p);
        let paths: Vec<String> = self.with(|s| {
            s.containers
                .get(id)
                .map(|(spec, _)| spec.volumes.iter().filter(|p| state(p)).cloned().collect())
                .unwrap_or_default()
        });
        let mut named = Vec::new();
        for at in paths {
            let name = self.with(|s| {
                s.next_id += 1;
                format!("{:064x}", u128::from(s.next_id) << 64 | 0xa11)
            });
            self.make_volume(&VolumeSpec {
                name: name.clone(),
                labels: HashMap::new(),
                driver_opts: HashMap::new(),
            })?;
            named.push((name, at));
        }
        self.with(|s| {
            if let Some((spec, _)) = s.containers.get_mut(id) {
                s.asked.insert(id.to_string(), spec.clone());
                spec.volumes.retain(|p| !state(p));
                spec.named_volumes.extend(named.iter().cloned());
            }
            s.anonymous
                .insert(id.to_string(), named.into_iter().map(|(n, _)| n).collect());
        });
        Ok(())
    }

    /// The host directory standing for `path` in container `id`: in the volume mounted there
    /// or above it.
    fn mounted_dir(&self, id: &str, path: &str) -> Option<PathBuf> {
        if let Some(v) = self.mounted_volume(id, path) {
            return Some(self.volume_dir(&v));
        }
        let bound = self.with(|s| {
            let (spec, _) = s.containers.get(id)?;
            spec.host_dirs
                .iter()
                .find(|(_, target)| target == path)
                .map(|(host, _)| PathBuf::from(host))
        });
        if bound.is_some() {
            return bound;
        }
        let (parent, name) = path.rsplit_once('/')?;
        if parent.is_empty() {
            return None;
        }
        Some(self.mounted_dir(id, parent)?.join(name))
    }

    /// The volumes container `id` mounts right under `path`, by their names there.
    fn mounted_under(&self, id: &str, path: &str) -> Vec<(String, String)> {
        let under = format!("{path}/");
        self.with(|s| {
            s.containers
                .get(id)
                .map(|(spec, _)| {
                    spec.named_volumes
                        .iter()
                        .filter_map(|(v, at)| {
                            let key = at.strip_prefix(&under)?;
                            (!key.contains('/')).then(|| (key.to_string(), v.clone()))
                        })
                        .collect()
                })
                .unwrap_or_default()
        })
    }

    /// Makes volume `spec.name` (answered as it is when it exists, as Docker does); an
    /// `overlay` one starts as a copy of its lower directories, lowest first.
    pub(super) fn make_volume(&self, spec: &VolumeSpec) -> Result<VolumeInfo, EngineError> {
        if let Some(v) = self.with(|s| s.volumes.get(&spec.name).cloned()) {
            return Ok(v);
        }
        let lowers = match spec.driver_opts.get("type").map(String::as_str) {
            None if spec.driver_opts.is_empty() => Vec::new(),
            Some("overlay") => {
                let (lowers, upper) = overlay_dirs(&spec.driver_opts)?;
                self.with(|s| {
                    s.overlays
                        .insert(spec.name.clone(), (lowers.clone(), upper.clone()))
                });
                lowers
            }
            _ => {
                return Err(EngineError::Rejected(
                    "the fake engine makes plain and overlay volumes only".into(),
                ));
            }
        };
        let dir = self.volume_dir(&spec.name);
        std::fs::create_dir_all(&dir).map_err(unavailable)?;
        for lower in lowers.iter().rev() {
            apply_layer(lower, &dir).map_err(unavailable)?;
        }
        let info = VolumeInfo {
            name: spec.name.clone(),
            mountpoint: dir.display().to_string(),
            labels: spec.labels.clone(),
            created: Some(sandbox_common::time::unix_now()),
        };
        self.with(|s| s.volumes.insert(spec.name.clone(), info.clone()));
        Ok(info)
    }

    /// Removes volume `name` and its content; one a container mounts is refused, as Docker
    /// does.
    pub(super) fn drop_volume(&self, name: &str) -> Result<(), EngineError> {
        self.with(|s| {
            let in_use = s.containers.values().any(|(spec, _)| {
                spec.named_volumes
                    .iter()
                    .chain(&spec.read_only_volumes)
                    .any(|(v, _)| v == name)
            });
            if in_use {
                return Err(EngineError::Conflict(format!("volume {name} is in use")));
            }
            s.overlays.remove(name);
            s.volumes
                .remove(name)
                .map(drop)
                .ok_or(EngineError::NotFound)
        })?;
        let _ = std::fs::remove_dir_all(self.dirs.root.join("volumes").join(name));
        Ok(())
    }

    /// Records container `id` as image `spec.reference`.
    pub(super) fn record_commit(&self, id: &str, spec: &CommitSpec) -> Result<String, EngineError> {
        self.with(|s| {
            let parent = s
                .container_images
                .get(id)
                .cloned()
                .ok_or(EngineError::NotFound)?;
            s.next_id += 1;
            let image_id = format!("sha256:{:064x}", s.next_id);
            let image = ImageInfo {
                id: image_id.clone(),
                tags: vec![spec.reference.clone()],
                labels: spec.labels.clone(),
                // What a commit of the skeleton alone adds: a few KB.
                size: 4096,
                created: Some(sandbox_common::time::unix_now()),
                env: spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
                parent: Some(parent),
                ..Default::default()
            };
            s.image_ids.insert(spec.reference.clone(), image_id.clone());
            s.images.insert(spec.reference.clone(), image);
            Ok(image_id)
        })
    }

    /// A further reference to an image: a committed one, or one sessions are made from (its
    /// id as `ensure_image` gives it, its labels as set for tests).
    pub(super) fn record_tag(&self, source: &str, reference: &str) -> Result<(), EngineError> {
        if let Some(mut image) = self.committed(source) {
            // An entry per reference: each goes by its own name.
            image.tags = vec![reference.to_string()];
            return self.with(|s| {
                s.image_ids.insert(reference.to_string(), image.id.clone());
                s.images.insert(reference.to_string(), image);
                Ok(())
            });
        }
        self.with(|s| {
            if s.missing_images.iter().any(|m| m == source) {
                return Err(EngineError::NotFound);
            }
            let id = match source.starts_with("sha256:") {
                true => source.to_string(),
                false => super::emulation::image_id_of(s, source),
            };
            let image = ImageInfo {
                id: id.clone(),
                tags: vec![reference.to_string()],
                labels: s.image_labels.get(source).cloned().unwrap_or_default(),
                created: Some(sandbox_common::time::unix_now()),
                ..Default::default()
            };
            s.image_ids.insert(reference.to_string(), id);
            s.images.insert(reference.to_string(), image);
            Ok(())
        })
    }

    /// A committed image by reference or id.
    pub(super) fn committed(&self, reference: &str) -> Option<ImageInfo> {
        self.with(|s| {
            s.images
                .values()
                .find(|i| i.id == reference || i.tags.iter().any(|t| t == reference))
                .cloned()
        })
    }

    /// Committed images carrying every label of `labels`.
    pub(super) fn committed_with(&self, labels: &[(&str, &str)]) -> Vec<ImageInfo> {
        self.with(|s| {
            s.images
                .values()
                .filter(|i| {
                    labels
                        .iter()
                        .all(|(k, v)| i.labels.get(*k).map(String::as_str) == Some(*v))
                })
                .cloned()
                .collect()
        })
    }

    /// Removes a committed image; one a container was created from is refused, as Docker does.
    pub(super) fn drop_image(&self, reference: &str) -> Result<(), EngineError> {
        self.with(|s| {
            let (key, id) = s
                .images
                .iter()
                .find(|(_, i)| i.id == reference || i.tags.iter().any(|t| t == reference))
                .map(|(k, i)| (k.clone(), i.id.clone()))
                .ok_or(EngineError::NotFound)?;
            // A tag of a base image only drops its name (the base image has its own).
            let tag = s.images.get(&key).is_some_and(|i| i.parent.is_none());
            if !tag && s.container_images.values().any(|c| *c == id) {
                return Err(EngineError::Conflict(format!("image {key} is in use")));
            }
            s.images.remove(&key);
            s.image_ids.remove(&key);
            Ok(())
        })
    }

    /// `/workspace` of container `id` as Docker's archive API sends it (entries under
    /// `workspace/`), read from the directory its helper serves.
    pub(super) fn workspace_archive(&self, id: &str) -> Result<Bytes, EngineError> {
        let dir = self.workspace_dir(id);
        let mut tar = tar::Builder::new(Vec::new());
        tar.follow_symlinks(false);
        let base = layout::WORKSPACE.trim_start_matches('/');
        if dir.is_dir() {
            tar.append_dir_all(base, &dir).map_err(unavailable)?;
        } else {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_size(0);
            tar.append_data(&mut h, format!("{base}/"), std::io::empty())
                .map_err(unavailable)?;
        }
        tar.into_inner().map(Bytes::from).map_err(unavailable)
    }

    /// Extracts the entries of `whole` (an archive put at `path`) that fall in one of container
    /// `id`'s named volumes into that volume's directory, as Docker does with a mounted volume.
    /// Returns an archive of the others, for the container's own files.
    pub(super) fn extract_into_volumes(
        &self,
        id: &str,
        path: &str,
        whole: &[u8],
    ) -> Result<Vec<u8>, EngineError> {
        let mounts: HashMap<String, String> = self.with(|s| {
            s.containers
                .get(id)
                .map(|(spec, _)| {
                    spec.named_volumes
                        .iter()
                        .map(|(v, at)| (at.clone(), v.clone()))
                        .collect()
                })
                .unwrap_or_default()
        });
        if mounts.is_empty() {
            return Ok(whole.to_vec());
        }
        let mut rest = tar::Builder::new(Vec::new());
        let mut archive = tar::Archive::new(whole);
        for entry in archive.entries().map_err(unavailable)? {
            let mut entry = entry.map_err(unavailable)?;
            let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let full = format!(
                "{}/{}",
                path.trim_end_matches('/'),
                name.trim_end_matches('/')
            );
            let Some((at, volume)) = mounts
                .iter()
                .find(|(at, _)| full == **at || full.starts_with(&format!("{at}/")))
            else {
                let mut header = entry.header().clone();
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut entry, &mut data).map_err(unavailable)?;
                rest.append_data(&mut header, &name, &data[..])
                    .map_err(unavailable)?;
                continue;
            };
            let rel = full[at.len()..].trim_start_matches('/').to_string();
            let root = self.volume_dir(volume);
            // Never through a link already there (a sandbox's, or an earlier entry's), as
            // Docker resolves a path within the container.
            let parts: Vec<&str> = rel.split('/').filter(|c| !c.is_empty()).collect();
            let through_link = (1..parts.len()).any(|n| {
                std::fs::symlink_metadata(root.join(parts[..n].join("/")))
                    .is_ok_and(|m| m.file_type().is_symlink())
            });
            if parts.contains(&"..") || through_link {
                return Err(EngineError::Rejected(format!("{name}: outside its volume")));
            }
            let wanted = root.join(&rel);
            let mode = entry.header().mode().unwrap_or(0o644);
            let kind = entry.header().entry_type();
            if kind.is_dir() {
                std::fs::create_dir_all(&wanted).map_err(unavailable)?;
            } else if kind.is_symlink() {
                let target = entry
                    .link_name()
                    .map_err(unavailable)?
                    .ok_or_else(|| EngineError::Rejected(format!("{name}: no link target")))?;
                let _ = std::fs::remove_file(&wanted);
                std::os::unix::fs::symlink(target, &wanted).map_err(unavailable)?;
                continue;
            } else if kind.is_file() {
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut entry, &mut data).map_err(unavailable)?;
                std::fs::write(&wanted, data).map_err(unavailable)?;
            } else {
                continue;
            }
            std::fs::set_permissions(
                &wanted,
                std::os::unix::fs::PermissionsExt::from_mode(mode & 0o7777),
            )
            .map_err(unavailable)?;
        }
        rest.into_inner().map_err(unavailable)
    }
}

/// The lower directories of an overlay volume's options (top first, as overlay lists them)
/// and its upper directory.
fn overlay_dirs(opts: &HashMap<String, String>) -> Result<(Vec<PathBuf>, PathBuf), EngineError> {
    let o = opts.get("o").map(String::as_str).unwrap_or_default();
    let find = |key: &str| o.split(',').find_map(|kv| kv.strip_prefix(key));
    let lowers = find("lowerdir=")
        .ok_or_else(|| EngineError::Rejected("an overlay volume needs a lowerdir".into()))?;
    let upper = find("upperdir=").unwrap_or_default();
    Ok((
        lowers.split(':').map(PathBuf::from).collect(),
        PathBuf::from(upper),
    ))
}

/// The fake's whiteout: `.wh.<name>` in a layer deletes `<name>` below it.
const WHITEOUT: &str = ".wh.";

/// Lays the layer `from` over the tree `to`: its files and links replace what is there, its
/// directories merge, its whiteouts delete. Keeps modes.
fn apply_layer(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let name = entry.file_name();
        if let Some(gone) = name.to_str().and_then(|n| n.strip_prefix(WHITEOUT)) {
            remove_any(&to.join(gone))?;
            continue;
        }
        let target = to.join(&name);
        let there = std::fs::symlink_metadata(&target).ok();
        if kind.is_dir() {
            if there.as_ref().is_some_and(|m| !m.is_dir()) {
                remove_any(&target)?;
            }
            std::fs::create_dir_all(&target)?;
            std::fs::set_permissions(&target, entry.metadata()?.permissions())?;
            apply_layer(&entry.path(), &target)?;
            continue;
        }
        if there.is_some() {
            remove_any(&target)?;
        }
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

fn remove_any(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Writes into `out` the layer that turns `below` into `now`: what `now` added or changed, and
/// a whiteout for what it removed.
fn diff_layer(now: &Path, below: &Path, out: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for entry in std::fs::read_dir(now)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let name = entry.file_name();
        let was = std::fs::symlink_metadata(below.join(&name)).ok();
        let target = out.join(&name);
        let meta = entry.metadata()?;
        if kind.is_dir() {
            std::fs::create_dir_all(&target)?;
            std::fs::set_permissions(&target, meta.permissions())?;
            if was.as_ref().is_some_and(|m| m.is_dir()) {
                diff_layer(&entry.path(), &below.join(&name), &target)?;
            } else {
                apply_layer(&entry.path(), &target)?;
            }
            continue;
        }
        let same = match &was {
            Some(m) if kind.is_symlink() && m.is_symlink() => {
                std::fs::read_link(entry.path())? == std::fs::read_link(below.join(&name))?
            }
            Some(m) if kind.is_file() && m.is_file() => {
                m.permissions().mode() == meta.permissions().mode()
                    && std::fs::read(entry.path())? == std::fs::read(below.join(&name))?
            }
            _ => false,
        };
        if same {
            continue;
        }
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    if below.is_dir() {
        for entry in std::fs::read_dir(below)? {
            let name = entry?.file_name();
            if std::fs::symlink_metadata(now.join(&name)).is_err() {
                let mut marker = std::ffi::OsString::from(WHITEOUT);
                marker.push(&name);
                std::fs::write(out.join(marker), b"")?;
            }
        }
    }
    Ok(())
}

/// What the helper counts for the tree under `dir`: the apparent bytes of its regular files
/// and a 512-byte header per entry (its long-name records are not emulated).
fn tree_bytes(dir: &Path) -> std::io::Result<u64> {
    let mut total = 0u64;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        total = total.saturating_add(512);
        if kind.is_dir() {
            total = total.saturating_add(tree_bytes(&entry.path())?);
        } else if kind.is_file() {
            total = total.saturating_add(entry.metadata()?.len());
        }
    }
    Ok(total)
}

impl FakeEngine {
    /// The helper's `copy-tree FROM TO [FROM TO...] --max-bytes N` in container `id`, over the
    /// volumes it mounts there (or the host directories it binds): an overlay's upper gives
    /// what the overlay changed (see the module's doc). Answers what the helper prints, and its
    /// exit status (3 past the budget).
    pub(super) fn copy_tree_exec(&self, id: &str, args: &[String]) -> super::FakeExec {
        let fail = |e: String| super::FakeExec {
            chunks: vec![format!("copy-tree: {e}\n").into_bytes()],
            exit_code: 1,
        };
        let [pairs @ .., flag, max] = args else {
            return fail("usage".into());
        };
        let (true, Ok(max)) = (flag == "--max-bytes", max.parse::<u64>()) else {
            return fail("usage".into());
        };
        if pairs.is_empty() || pairs.len() % 2 != 0 {
            return fail("usage".into());
        }
        let mut bytes = 0u64;
        for pair in pairs.chunks(2) {
            let (from, to) = (&pair[0], &pair[1]);
            let Some(to_dir) = self.mounted_dir(id, to) else {
                return fail("usage".into());
            };
            // A volume at FROM (or above it), or one under it per key.
            let sources = match self.mounted_dir(id, from) {
                Some(dir) => vec![(dir, to_dir.clone())],
                None => self
                    .mounted_under(id, from)
                    .into_iter()
                    .map(|(key, v)| (self.volume_dir(&v), to_dir.join(key)))
                    .collect(),
            };
            if sources.is_empty() {
                return fail("usage".into());
            }
            for (from_dir, to) in sources {
                if let Err(e) =
                    std::fs::create_dir_all(&to).and_then(|()| self.copy_one(&from_dir, &to))
                {
                    return fail(e.to_string());
                }
            }
            match tree_bytes(&to_dir) {
                Ok(b) => bytes = bytes.saturating_add(b),
                Err(e) => return fail(e.to_string()),
            }
        }
        if bytes > max {
            return super::FakeExec {
                chunks: vec![format!("over cap: {bytes} bytes\n").into_bytes()],
                exit_code: 3,
            };
        }
        super::FakeExec {
            chunks: vec![format!("{{\"bytes\":{bytes},\"files\":0}}\n").into_bytes()],
            exit_code: 0,
        }
    }

    /// One tree's copy: an overlay's upper gives what the overlay changed over its lowers.
    fn copy_one(&self, from_dir: &Path, to_dir: &Path) -> std::io::Result<()> {
        let overlay = self.with(|s| {
            s.overlays
                .iter()
                .find(|(_, (_, upper))| upper == from_dir)
                .map(|(merged, (lowers, _))| (merged.clone(), lowers.clone()))
        });
        match overlay {
            Some((merged, lowers)) => {
                let view = self.dirs.root.join(format!("view-{merged}"));
                let made = (|| {
                    std::fs::create_dir_all(&view)?;
                    for lower in lowers.iter().rev() {
                        apply_layer(lower, &view)?;
                    }
                    diff_layer(&self.volume_dir(&merged), &view, to_dir)
                })();
                let _ = std::fs::remove_dir_all(&view);
                made
            }
            None => apply_layer(from_dir, to_dir),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ContainerEngine, ContainerSpec};

    /// An archive put at `/` across a named volume and the container's own files lands in both,
    /// as Docker's does: nothing of it is dropped.
    #[tokio::test]
    async fn an_archive_across_a_volume_lands_on_both_sides() -> Result<(), EngineError> {
        let engine = FakeEngine::new(|_| super::super::FakeExec::default());
        engine
            .create_volume(&VolumeSpec {
                name: "ws".into(),
                labels: HashMap::new(),
                driver_opts: HashMap::new(),
            })
            .await?;
        let id = engine
            .create(&ContainerSpec {
                named_volumes: vec![("ws".into(), "/workspace".into())],
                ..ContainerSpec::for_tests("img")
            })
            .await?;
        let mut tar = tar::Builder::new(Vec::new());
        for (path, data) in [("workspace/in.txt", "in"), ("etc/out.txt", "out")] {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            tar.append_data(&mut h, path, data.as_bytes())
                .map_err(unavailable)?;
        }
        let whole = Bytes::from(tar.into_inner().map_err(unavailable)?);
        let body = futures::stream::once(async move { Ok(whole) });
        engine.put_archive(&id, "/", Box::pin(body)).await?;
        let inside = std::fs::read(engine.volume_dir("ws").join("in.txt")).map_err(unavailable)?;
        assert_eq!(inside, b"in");
        assert_eq!(
            engine.file(&id, "/etc/out.txt").as_deref(),
            Some(&b"out"[..])
        );
        Ok(())
    }
}
