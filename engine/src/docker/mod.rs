//! [`ContainerEngine`] over the Docker Engine API (bollard). The only module that imports bollard.
//!
//! By area, each a module of daemon calls: `daemon` (reaching the daemon: its socket, TCP, or
//! mutual TLS over our own transport; ping and info), `containers` (lifecycle, logs, archives),
//! `exec`, `images` (pulls with the registry credentials, commits), `networks` and `volumes`.
//! `convert` translates between the engine's types and bollard's models (specs, inspect and list
//! answers, errors, states, timestamps). The trait's impl is generated from the list of verbs
//! (`crate::decorate`): each verb is the function of that name in its area's module.

use bollard::Docker;

use crate::ContainerEngine;
use crate::credentials::CredentialStore;
use crate::decorate::verbs;

mod containers;
mod convert;
mod daemon;
mod exec;
mod images;
mod networks;
mod volumes;

/// Upper bound on one Docker API call that is not a stream; a daemon that hangs longer is
/// treated as unavailable rather than holding a request (and its session lock) forever.
const API_TIMEOUT_SECS: u64 = 120;

/// A client of one Docker daemon (see `daemon` for how it connects).
pub struct DockerEngine {
    docker: Docker,
    /// Registry credentials for pulls, looked up per pull.
    credentials: CredentialStore,
}

/// `impl ContainerEngine for DockerEngine`: each verb calls `area::verb(self, args)`.
macro_rules! by_area {
    ($(
        $area:ident $verb:ident ( $( $(#[$mark:ident])? $arg:ident : $ty:ty ),* $(,)? )
            -> $answer:ty = $op:literal $(=> $out:ident)? ;
    )*) => {
        const _: () = {
            use std::net::IpAddr;
            use std::time::Duration;

            use bytes::Bytes;
            use futures::stream::BoxStream;

            use crate::{
                AttachedExec, CommitSpec, ContainerInfo, ContainerSpec, ContainerStats,
                EngineError, EngineInfo,
                ExecSpec, ExecStream, ImageInfo, NetworkInfo, NetworkSpec, VolumeInfo,
                VolumeSpec,
            };

            #[async_trait::async_trait]
            impl ContainerEngine for DockerEngine {
                $(
                    async fn $verb(&self, $( $arg: $ty ),*) -> Result<$answer, EngineError> {
                        $area::$verb(self, $( $arg ),*).await
                    }
                )*
            }
        };
    };
}

verbs!(by_area);
