//! Engines that wrap another: the one list of [`ContainerEngine`]'s verbs, and [`Decorate`],
//! through which a wrapper writes only what it changes.
//!
//! A type that implements [`Decorate`] is a [`ContainerEngine`]: every verb goes to
//! [`Decorate::inner`] through [`Decorate::around`], its container ids mapped in by
//! [`Decorate::id_in`] and out by [`Decorate::id_out`], the streams it answers passed through
//! [`Decorate::stream_out`]. That forwarding is generated from `verbs!`, the only place that
//! lists the verbs; the Docker adapter's impl is generated from it too (each verb a call into
//! its area's module).

use std::future::Future;
use std::ops::Deref;

use futures::stream::BoxStream;

use crate::{AttachedExec, ContainerEngine, ContainerInfo, EngineError, ExecStream};

/// Every async verb of [`ContainerEngine`], once, handed to the macro `$then` (which generates
/// an impl of the trait from it). A line is
///
/// ```text
/// area verb(args) -> answer = "op" => out;
/// ```
///
/// - `area`: the Docker adapter's module that implements it (`docker::area::verb`);
/// - `#[id]` before an argument: a container id as its caller knows it ([`Decorate::id_in`]);
/// - `"op"`: the verb's `op` label in the engine's metrics (a wire contract: dashboards query
///   these; some verbs share one, as they share a Docker call);
/// - `=> out`: what of the answer carries container ids or streams, mapped on the way out
///   (`id`: a container id; `info`, `infos`: containers; `exec`, `attached`, `stream`: streams).
///
/// `id_prefix`, the one verb that is not a call, is forwarded by hand ([`Decorate::prefix`]).
macro_rules! verbs {
    ($then:ident) => {
        $then! {
            daemon ping() -> () = "ping";
            daemon info() -> EngineInfo = "info";

            containers create(spec: &ContainerSpec) -> String = "create" => id;
            containers start(#[id] id: &str) -> () = "start";
            containers inspect(#[id] id: &str) -> ContainerInfo = "inspect" => info;
            containers writable_bytes(#[id] id: &str) -> Option<u64> = "writable_bytes";
            containers stats(#[id] id: &str) -> Option<ContainerStats> = "stats";
            containers stop(#[id] id: &str, grace: Duration) -> () = "stop";
            containers remove(#[id] id: &str) -> () = "remove";
            containers rename(#[id] current: &str, new: &str) -> () = "rename";
            containers update_limits(
                #[id] id: &str,
                memory_bytes: Option<i64>,
                nano_cpus: Option<i64>
            ) -> () = "update";
            containers list(labels: &[(&str, &str)]) -> Vec<ContainerInfo> = "list" => infos;
            containers pause(#[id] id: &str) -> () = "pause";
            containers unpause(#[id] id: &str) -> () = "unpause";
            containers wait_for_log(#[id] id: &str, needle: &str, timeout: Duration) -> ()
                = "wait_for_log";
            containers put_archive(
                #[id] id: &str,
                path: &str,
                tar: BoxStream<'static, Result<Bytes, std::io::Error>>
            ) -> () = "put_archive";
            containers get_archive(#[id] id: &str, path: &str)
                -> BoxStream<'static, Result<Bytes, EngineError>> = "get_archive" => stream;

            exec exec(#[id] id: &str, spec: &ExecSpec) -> ExecStream = "exec" => exec;
            exec exec_attached(#[id] id: &str, spec: &ExecSpec) -> AttachedExec
                = "exec_attached" => attached;
            exec exec_exit_code(exec_id: &str) -> Option<i64> = "exec_inspect";

            images ensure_image(image: &str) -> ImageInfo = "ensure_image";
            images image_id(image: &str) -> String = "inspect_image";
            images inspect_image(reference: &str) -> ImageInfo = "inspect_image";
            images list_images(labels: &[(&str, &str)]) -> Vec<ImageInfo> = "list_images";
            images image_tags(repository: &str) -> Vec<String> = "list_images";
            images remove_image(reference: &str) -> () = "remove_image";
            images commit(#[id] id: &str, spec: &CommitSpec) -> String = "commit";
            images tag_image(source: &str, reference: &str) -> () = "tag_image";

            networks create_network(spec: &NetworkSpec) -> String = "create_network";
            networks remove_network(id_or_name: &str) -> () = "remove_network";
            networks connect_network(network: &str, #[id] container: &str, ip: Option<IpAddr>)
                -> () = "connect_network";
            networks list_networks(labels: &[(&str, &str)]) -> Vec<NetworkInfo>
                = "list_networks";

            volumes create_volume(spec: &VolumeSpec) -> VolumeInfo = "create_volume";
            volumes inspect_volume(name: &str) -> VolumeInfo = "inspect_volume";
            volumes list_volumes(labels: &[(&str, &str)]) -> Vec<VolumeInfo> = "list_volumes";
            volumes remove_volume(name: &str) -> () = "remove_volume";
        }
    };
}
pub(crate) use verbs;

/// An engine that wraps another and changes some of what passes: what a wrapper implements to
/// be a [`ContainerEngine`] (the forwarding is generated; see the module's doc). Only
/// [`Decorate::inner`], [`Decorate::prefix`] and what the wrapper changes are written.
pub trait Decorate: Send + Sync + 'static {
    /// The engine a call goes to, or why the call fails before it is made.
    fn inner(
        &self,
    ) -> Result<impl Deref<Target = dyn ContainerEngine> + Send + Sync + '_, EngineError>;

    /// What [`ContainerEngine::id_prefix`] answers.
    fn prefix(&self) -> Option<&str>;

    /// Runs one call made on [`Decorate::inner`]; `op` is its label in the engine's metrics.
    fn around<T: Send>(
        &self,
        op: &'static str,
        call: impl Future<Output = Result<T, EngineError>> + Send,
    ) -> impl Future<Output = Result<T, EngineError>> + Send {
        let _ = op;
        call
    }

    /// A container id as the wrapped engine knows it, for one the caller gave.
    fn id_in<'a>(&self, id: &'a str) -> &'a str {
        id
    }

    /// A container id as the caller knows it, for one the wrapped engine answered.
    fn id_out(&self, id: String) -> String {
        id
    }

    /// A stream the wrapped engine answered (an exec's output, an archive).
    fn stream_out<T: Send + 'static>(
        &self,
        stream: BoxStream<'static, Result<T, EngineError>>,
    ) -> BoxStream<'static, Result<T, EngineError>> {
        stream
    }
}

/// What of an answer a wrapper maps on the way out (the `=> out` of a line of [`verbs!`]).
mod out {
    use super::*;

    pub(super) fn id<D: Decorate>(d: &D, id: String) -> String {
        d.id_out(id)
    }

    pub(super) fn info<D: Decorate>(d: &D, mut info: ContainerInfo) -> ContainerInfo {
        info.id = d.id_out(std::mem::take(&mut info.id));
        info
    }

    pub(super) fn infos<D: Decorate>(d: &D, list: Vec<ContainerInfo>) -> Vec<ContainerInfo> {
        list.into_iter().map(|i| info(d, i)).collect()
    }

    pub(super) fn stream<D: Decorate, T: Send + 'static>(
        d: &D,
        stream: BoxStream<'static, Result<T, EngineError>>,
    ) -> BoxStream<'static, Result<T, EngineError>> {
        d.stream_out(stream)
    }

    pub(super) fn exec<D: Decorate>(d: &D, e: ExecStream) -> ExecStream {
        ExecStream {
            exec_id: e.exec_id,
            output: d.stream_out(e.output),
        }
    }

    pub(super) fn attached<D: Decorate>(d: &D, a: AttachedExec) -> AttachedExec {
        AttachedExec {
            output: d.stream_out(a.output),
            input: a.input,
        }
    }
}

/// An argument as the wrapped engine gets it.
macro_rules! arg_in {
    ($d:ident, $arg:ident) => {
        $arg
    };
    ($d:ident, $arg:ident, id) => {
        Decorate::id_in($d, $arg)
    };
}

/// An answer as the caller gets it.
macro_rules! answer_out {
    ($d:ident, $answer:ident) => {
        $answer
    };
    ($d:ident, $answer:ident, $out:ident) => {
        $answer.map(|a| out::$out($d, a))
    };
}

/// `impl ContainerEngine for D` for every `D: Decorate`, from [`verbs!`].
macro_rules! decorated {
    ($(
        $area:ident $verb:ident ( $( $(#[$mark:ident])? $arg:ident : $ty:ty ),* $(,)? )
            -> $answer:ty = $op:literal $(=> $out:ident)? ;
    )*) => {
        const _: () = {
            use std::net::IpAddr;
            use std::time::Duration;

            use bytes::Bytes;

            use crate::{
                CommitSpec, ContainerSpec, ContainerStats, EngineInfo, ExecSpec, ImageInfo, NetworkInfo,
                NetworkSpec, VolumeInfo, VolumeSpec,
            };

            #[async_trait::async_trait]
            impl<D: Decorate> ContainerEngine for D {
                fn id_prefix(&self) -> Option<&str> {
                    Decorate::prefix(self)
                }

                $(
                    async fn $verb(&self, $( $arg: $ty ),*) -> Result<$answer, EngineError> {
                        let engine = Decorate::inner(self)?;
                        let call = ContainerEngine::$verb(
                            &*engine,
                            $( arg_in!(self, $arg $(, $mark)?) ),*
                        );
                        let answer = Decorate::around(self, $op, call).await;
                        answer_out!(self, answer $(, $out)?)
                    }
                )*
            }
        };
    };
}

verbs!(decorated);

/// The verbs [`verbs!`] lists, for the test that none of the trait's is missing.
#[cfg(test)]
macro_rules! names {
    ($( $area:ident $verb:ident ( $($args:tt)* ) -> $answer:ty = $op:literal $(=> $out:ident)? ; )*) => {
        pub(crate) const VERBS: &[(&str, &str)] = &[$( (stringify!($verb), $op) ),*];
    };
}

#[cfg(test)]
verbs!(names);

#[cfg(test)]
mod tests {
    use super::*;

    /// A verb with a default body that the list left out would not be forwarded: a wrapper
    /// would answer the default instead of asking the engine it wraps.
    #[test]
    fn the_list_names_every_verb_of_the_trait() {
        let source = include_str!("lib.rs");
        let start = source.find("pub trait ContainerEngine").expect("the trait");
        let body = &source[start..];
        let body = &body[..body.find("\n}\n").expect("its end")];
        let mut declared: Vec<&str> = body
            .split("async fn ")
            .skip(1)
            .map(|rest| &rest[..rest.find('(').expect("a signature")])
            .collect();
        let mut listed: Vec<&str> = VERBS.iter().map(|(verb, _)| *verb).collect();
        declared.sort_unstable();
        listed.sort_unstable();
        assert_eq!(declared, listed);
    }
}
