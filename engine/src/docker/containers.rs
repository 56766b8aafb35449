//! Containers: create (with the skeleton extracted before the start), start, stop, remove,
//! inspect, list, rename, limits, pause, their logs, and archives in and out of them.

use std::time::Duration;

use bollard::errors::Error as BollardError;
use bollard::query_parameters::{
    ListContainersOptions, RemoveContainerOptions, StopContainerOptions, UploadToContainerOptions,
};
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};

use super::DockerEngine;
use super::convert::{
    create_body, info_from_inspect, info_from_summary, managed_filter, map_err, parse_rfc3339,
};
use sandbox_common::archive::Part;

use crate::{ContainerInfo, ContainerSpec, ContainerStats, EngineError};

pub(super) async fn create(
    engine: &DockerEngine,
    spec: &ContainerSpec,
) -> Result<String, EngineError> {
    let body = create_body(spec);
    let options =
        spec.name
            .as_ref()
            .map(|name| bollard::query_parameters::CreateContainerOptions {
                name: Some(name.clone()),
                ..Default::default()
            });
    let created = engine
        .docker
        .create_container(options, body)
        .await
        .map_err(map_err)?;
    if !spec.skeleton.is_empty() {
        let parts = futures::stream::iter(spec.skeleton.clone()).flat_map(part_slices);
        let put = engine
            .docker
            .upload_to_container(
                &created.id,
                Some(UploadToContainerOptions {
                    path: "/".to_string(),
                    ..Default::default()
                }),
                bollard::body_try_stream(parts),
            )
            .await
            .map_err(map_err);
        if let Err(e) = put {
            // Nothing half-made is left behind.
            let _ = remove(engine, &created.id).await;
            return Err(e);
        }
    }
    Ok(created.id)
}

pub(super) async fn start(engine: &DockerEngine, id: &str) -> Result<(), EngineError> {
    engine
        .docker
        .start_container(id, None::<bollard::query_parameters::StartContainerOptions>)
        .await
        .map_err(map_err)
}

pub(super) async fn inspect(engine: &DockerEngine, id: &str) -> Result<ContainerInfo, EngineError> {
    let c = engine
        .docker
        .inspect_container(
            id,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .map_err(map_err)?;
    Ok(info_from_inspect(id, c))
}

pub(super) async fn writable_bytes(
    engine: &DockerEngine,
    id: &str,
) -> Result<Option<u64>, EngineError> {
    let c = engine
        .docker
        .inspect_container(
            id,
            Some(bollard::query_parameters::InspectContainerOptions { size: true }),
        )
        .await
        .map_err(map_err)?;
    Ok(c.size_rw.and_then(|s| u64::try_from(s).ok()))
}

pub(super) async fn stats(
    engine: &DockerEngine,
    id: &str,
) -> Result<Option<ContainerStats>, EngineError> {
    // One reading (`one-shot`): without it the daemon waits a second for a second reading.
    let mut stream = engine.docker.stats(
        id,
        Some(bollard::query_parameters::StatsOptions {
            stream: false,
            one_shot: true,
        }),
    );
    let Some(read) = stream.next().await else {
        return Ok(None);
    };
    let s = read.map_err(map_err)?;
    let cpu = s.cpu_stats.as_ref();
    let total = cpu
        .and_then(|c| c.cpu_usage.as_ref())
        .and_then(|u| u.total_usage);
    let Some(cpu_total_ns) = total.filter(|t| *t > 0) else {
        // A stopped container reads as zeros.
        return Ok(None);
    };
    let mem = s.memory_stats.as_ref();
    let stat = |key: &str| {
        mem.and_then(|m| m.stats.as_ref())
            .and_then(|st| st.get(key).copied())
    };
    // The reclaimable part, as `docker stats` takes it off: the inactive file cache (v2
    // `inactive_file`, v1 `total_inactive_file`). Not all of `file`/`cache`: gVisor keeps a
    // sandbox's own memory in a memfd, which the host counts as (active) cache.
    let mem_cache = stat("inactive_file")
        .or_else(|| stat("total_inactive_file"))
        .unwrap_or(0);
    Ok(Some(ContainerStats {
        cpu_total_ns,
        online_cpus: cpu.and_then(|c| c.online_cpus).unwrap_or(0),
        mem_usage: mem.and_then(|m| m.usage).unwrap_or(0),
        mem_cache,
        mem_limit: mem.and_then(|m| m.limit).unwrap_or(0),
    }))
}

pub(super) async fn stop(
    engine: &DockerEngine,
    id: &str,
    grace: Duration,
) -> Result<(), EngineError> {
    let t = i32::try_from(grace.as_secs()).unwrap_or(i32::MAX);
    match engine
        .docker
        .stop_container(
            id,
            Some(StopContainerOptions {
                t: Some(t),
                ..Default::default()
            }),
        )
        .await
    {
        // 304: already stopped.
        Err(BollardError::DockerResponseServerError {
            status_code: 304, ..
        }) => Ok(()),
        other => other.map_err(map_err),
    }
}

pub(super) async fn remove(engine: &DockerEngine, id: &str) -> Result<(), EngineError> {
    engine
        .docker
        .remove_container(
            id,
            Some(RemoveContainerOptions {
                force: true,
                v: true,
                ..Default::default()
            }),
        )
        .await
        .map_err(map_err)
}

pub(super) async fn rename(
    engine: &DockerEngine,
    current: &str,
    new: &str,
) -> Result<(), EngineError> {
    engine
        .docker
        .rename_container(
            current,
            bollard::query_parameters::RenameContainerOptions {
                name: new.to_string(),
            },
        )
        .await
        .map_err(map_err)
}

pub(super) async fn update_limits(
    engine: &DockerEngine,
    id: &str,
    memory_bytes: Option<i64>,
    nano_cpus: Option<i64>,
) -> Result<(), EngineError> {
    let body = bollard::models::ContainerUpdateBody {
        memory: memory_bytes,
        // What the daemon sets at create when only the memory is given.
        memory_swap: memory_bytes.map(|m| m.saturating_mul(2)),
        nano_cpus,
        ..Default::default()
    };
    engine
        .docker
        .update_container(id, body)
        .await
        .map_err(map_err)
}

pub(super) async fn list(
    engine: &DockerEngine,
    labels: &[(&str, &str)],
) -> Result<Vec<ContainerInfo>, EngineError> {
    let filters = managed_filter(labels);
    let found = engine
        .docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        }))
        .await
        .map_err(map_err)?;
    Ok(found.into_iter().filter_map(info_from_summary).collect())
}

pub(super) async fn pause(engine: &DockerEngine, id: &str) -> Result<(), EngineError> {
    engine.docker.pause_container(id).await.map_err(map_err)
}

pub(super) async fn unpause(engine: &DockerEngine, id: &str) -> Result<(), EngineError> {
    engine.docker.unpause_container(id).await.map_err(map_err)
}

pub(super) async fn wait_for_log(
    engine: &DockerEngine,
    id: &str,
    needle: &str,
    timeout: Duration,
) -> Result<(), EngineError> {
    // Only this start's lines count: a previous start's "listening" must not pass for it.
    // The boundary is the previous run's end (every line it logged is older), not this
    // start's `StartedAt`, which the daemon records after the process may already have
    // logged.
    let previous_end = engine
        .docker
        .inspect_container(
            id,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .map_err(map_err)?
        .state
        .and_then(|s| s.finished_at)
        .and_then(|t| parse_rfc3339(&t))
        .filter(|t| t.year() > 1);
    let opts = bollard::query_parameters::LogsOptions {
        follow: true,
        stdout: true,
        stderr: true,
        timestamps: true,
        since: previous_end.map_or(0, |t| t.unix_timestamp() as i32),
        ..Default::default()
    };
    let mut logs = engine.docker.logs(id, Some(opts));
    // Each line is "<RFC 3339 timestamp> <text>"; lines can be split across frames.
    let mut pending = String::new();
    let search = async {
        while let Some(frame) = logs.next().await {
            let frame = frame.map_err(map_err)?;
            pending.push_str(&String::from_utf8_lossy(&frame.into_bytes()));
            while let Some(nl) = pending.find('\n') {
                let line: String = pending.drain(..=nl).collect();
                let (ts, text) = line.split_once(' ').unwrap_or(("", &line));
                let current = match (previous_end, parse_rfc3339(ts)) {
                    (Some(end), Some(t)) => t > end,
                    _ => true,
                };
                if current && text.contains(needle) {
                    return Ok(());
                }
            }
            if pending.len() > 64 * 1024 {
                pending.clear();
            }
        }
        Err(EngineError::Unavailable(format!(
            "container {id} exited before logging {needle:?}"
        )))
    };
    tokio::time::timeout(timeout, search)
        .await
        .map_err(|_| EngineError::Unavailable(format!("container {id} not ready in {timeout:?}")))?
}

pub(super) async fn put_archive(
    engine: &DockerEngine,
    id: &str,
    path: &str,
    tar: BoxStream<'static, Result<Bytes, std::io::Error>>,
) -> Result<(), EngineError> {
    engine
        .docker
        .upload_to_container(
            id,
            Some(UploadToContainerOptions {
                path: path.to_string(),
                ..Default::default()
            }),
            bollard::body_try_stream(tar),
        )
        .await
        .map_err(map_err)
}

pub(super) async fn get_archive(
    engine: &DockerEngine,
    id: &str,
    path: &str,
) -> Result<BoxStream<'static, Result<Bytes, EngineError>>, EngineError> {
    let mut stream = engine
        .docker
        .download_from_container(
            id,
            Some(bollard::query_parameters::DownloadFromContainerOptions {
                path: path.to_string(),
            }),
        )
        .map_err(map_err)
        .boxed();
    // The daemon's answer (404 for a missing path) arrives as the first item: surface it as
    // the call's error rather than as a broken stream.
    match stream.next().await {
        None => Ok(futures::stream::empty().boxed()),
        Some(Err(e)) => Err(e),
        Some(Ok(first)) => Ok(futures::stream::once(async move { Ok(first) })
            .chain(stream)
            .boxed()),
    }
}

/// Bytes of an archive handed to the HTTP client at a time. It copies what it is given into its
/// write buffer: the whole skeleton at once (3 MB, most of it the helper binary, shared by every
/// create) would be one copy per create in flight.
const UPLOAD_SLICE: usize = 64 * 1024;

/// A skeleton's part as slices of at most [`UPLOAD_SLICE`] bytes: a buffer's share it, a file's
/// are read one at a time, off the async workers, as the upload takes them (a read error
/// fails the upload, and with it the create).
fn part_slices(part: Part) -> BoxStream<'static, std::io::Result<Bytes>> {
    match part {
        Part::Bytes(b) => futures::stream::iter(slices(&b).into_iter().map(Ok)).boxed(),
        Part::File(file) => {
            let len = file.len();
            futures::stream::try_unfold(0u64, move |at| {
                let file = file.clone();
                async move {
                    if at >= len {
                        return Ok(None);
                    }
                    let n = usize::try_from((len - at).min(UPLOAD_SLICE as u64))
                        .unwrap_or(UPLOAD_SLICE);
                    let chunk = tokio::task::spawn_blocking(move || file.read_at(at, n))
                        .await
                        .map_err(std::io::Error::other)??;
                    Ok(Some((chunk, at + n as u64)))
                }
            })
            .boxed()
        }
    }
}

/// `data` as slices of [`UPLOAD_SLICE`] bytes, sharing its buffer.
fn slices(data: &Bytes) -> Vec<Bytes> {
    (0..data.len())
        .step_by(UPLOAD_SLICE)
        .map(|at| data.slice(at..(at + UPLOAD_SLICE).min(data.len())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_share_the_buffer_and_cover_it() {
        let data = Bytes::from(vec![7u8; 3 * UPLOAD_SLICE + 5]);
        let parts = slices(&data);
        assert_eq!(
            parts.iter().map(Bytes::len).collect::<Vec<_>>(),
            [UPLOAD_SLICE, UPLOAD_SLICE, UPLOAD_SLICE, 5]
        );
        assert_eq!(parts[1].as_ptr(), data[UPLOAD_SLICE..].as_ptr());
        assert!(slices(&Bytes::new()).is_empty());
    }

    #[tokio::test]
    async fn a_file_part_is_read_in_slices_as_it_is_sent() -> std::io::Result<()> {
        let data: Vec<u8> = (0..2 * UPLOAD_SLICE + 7).map(|i| (i % 253) as u8).collect();
        let file = sandbox_common::shared_file::SharedFile::from_bytes(&data)?;
        let sent: Vec<Bytes> = part_slices(file.into()).try_collect().await?;
        assert_eq!(
            sent.iter().map(Bytes::len).collect::<Vec<_>>(),
            [UPLOAD_SLICE, UPLOAD_SLICE, 7]
        );
        assert_eq!(sent.concat(), data);
        Ok(())
    }
}
