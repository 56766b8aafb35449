//! Processes in a running container: started with their output attached (and their stdin, for
//! the session helper's channel), and their exit codes.

use bollard::errors::Error as BollardError;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::ExecConfig;
use futures::{StreamExt, TryStreamExt};

use super::DockerEngine;
use super::convert::{env_list, map_err};
use crate::{AttachedExec, EngineError, ExecSpec, ExecStream};

/// An exec's output as bollard delivers it, and its stdin when attached.
type ExecOutput = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<bollard::container::LogOutput, BollardError>> + Send>,
>;

/// Creates and starts an exec, attached to its output (and to its stdin with `stdin`).
async fn start_exec(
    engine: &DockerEngine,
    id: &str,
    spec: &ExecSpec,
    stdin: bool,
) -> Result<
    (
        String,
        ExecOutput,
        std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    ),
    EngineError,
> {
    let created = engine
        .docker
        .create_exec(
            id,
            ExecConfig {
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                attach_stdin: Some(stdin),
                tty: Some(false),
                cmd: Some(spec.cmd.clone()),
                user: Some(spec.user.clone()),
                working_dir: spec.workdir.clone(),
                env: Some(env_list(&spec.env)),
                ..Default::default()
            },
        )
        .await
        .map_err(map_err)?;
    let started = engine
        .docker
        .start_exec(
            &created.id,
            Some(StartExecOptions {
                detach: false,
                tty: false,
                // The read buffer's starting size, which it keeps while the exec lives: an
                // attached exec is a session's helper channel, open for the session's life, so a
                // small one (it grows to the largest frame Docker sends, 32 KiB of output plus
                // its header, on the first that needs it). 256 KiB here was 250 KiB of every idle
                // session's memory in the control plane.
                output_capacity: Some(if stdin {
                    ATTACHED_READ_BUFFER
                } else {
                    64 * 1024
                }),
            }),
        )
        .await
        .map_err(map_err)?;
    let StartExecResults::Attached { output, input } = started else {
        return Err(EngineError::Unavailable(
            "exec started detached".to_string(),
        ));
    };
    Ok((created.id, output, input))
}

/// The starting read buffer of an attached exec (see [`start_exec`]).
const ATTACHED_READ_BUFFER: usize = 16 * 1024;

pub(super) async fn exec(
    engine: &DockerEngine,
    id: &str,
    spec: &ExecSpec,
) -> Result<ExecStream, EngineError> {
    let (exec_id, output, _) = start_exec(engine, id, spec, false).await?;
    let output = output
        .map_ok(|chunk| chunk.into_bytes())
        .map_err(map_err)
        .boxed();
    Ok(ExecStream { exec_id, output })
}

pub(super) async fn exec_attached(
    engine: &DockerEngine,
    id: &str,
    spec: &ExecSpec,
) -> Result<AttachedExec, EngineError> {
    let (exec_id, output, input) = start_exec(engine, id, spec, true).await?;
    let output = output
        .try_filter_map(move |chunk| {
            let exec_id = exec_id.clone();
            async move {
                Ok(match chunk {
                    bollard::container::LogOutput::StdOut { message } => Some(message),
                    bollard::container::LogOutput::StdErr { message } => {
                        tracing::debug!(exec_id = %exec_id, line = %String::from_utf8_lossy(&message).trim_end(), "session helper");
                        None
                    }
                    _ => None,
                })
            }
        })
        .map_err(map_err)
        .boxed();
    Ok(AttachedExec { output, input })
}

pub(super) async fn exec_exit_code(
    engine: &DockerEngine,
    exec_id: &str,
) -> Result<Option<i64>, EngineError> {
    let info = engine.docker.inspect_exec(exec_id).await.map_err(map_err)?;
    if info.running == Some(true) {
        return Ok(None);
    }
    Ok(info.exit_code)
}
