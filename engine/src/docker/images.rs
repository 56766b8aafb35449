//! Images: pulls (with the registry credentials of the client config), inspects, lists,
//! removals, and commits of a container's filesystem into one.

use bollard::errors::Error as BollardError;
use bollard::query_parameters::CreateImageOptions;
use futures::StreamExt;

use super::DockerEngine;
use super::convert::{
    docker_credentials, env_list, managed_filter, map_err, pull_failure, unix_seconds,
    with_default_tag,
};
use crate::credentials::Registry;
use crate::reference::names_image;
use crate::{CommitSpec, EngineError, ImageInfo, PullFailure};

pub(super) async fn ensure_image(
    engine: &DockerEngine,
    image: &str,
) -> Result<ImageInfo, EngineError> {
    match inspect_image(engine, image).await {
        Ok(found) if names_image(image, &found) => return Ok(found),
        // Only a name of hex digits can resolve by id: a prefix of an id the engine holds
        // (another deployment's snapshot, say). Refused as such, and never pulled: its
        // repository would be Docker Hub's.
        Ok(_) => {
            return Err(EngineError::ImageUnavailable {
                image: image.to_string(),
                failure: PullFailure::InvalidReference,
                reason: "the name resolves to an image by its id, not by a tag".into(),
            });
        }
        Err(EngineError::NotFound) => {}
        Err(other) => return Err(other),
    }
    let registry = Registry::of_image(image);
    let (credentials, source) = pull_credentials(engine, image, &registry).await;
    let opts = CreateImageOptions {
        // The daemon pulls every tag of an untagged name; the CLI (and the reference's SDK)
        // mean `latest`.
        from_image: Some(with_default_tag(image)),
        ..Default::default()
    };
    let failed = |status: Option<u16>, reason: String| {
        let failure = pull_failure(status, &reason);
        tracing::warn!(image, registry = registry.server(), credentials = %source, failure = ?failure, error = %reason, "image pull failed");
        EngineError::ImageUnavailable {
            image: image.to_string(),
            failure,
            reason,
        }
    };
    let mut progress = engine.docker.create_image(Some(opts), None, credentials);
    while let Some(item) = progress.next().await {
        match item {
            Ok(info) => {
                if let Some(detail) = info.error_detail {
                    let status = detail.code.and_then(|c| u16::try_from(c).ok());
                    return Err(failed(status, detail.message.unwrap_or_default()));
                }
            }
            Err(BollardError::DockerResponseServerError {
                status_code,
                message,
            }) => return Err(failed(Some(status_code), message)),
            Err(BollardError::DockerStreamError { error }) => return Err(failed(None, error)),
            Err(other) => return Err(EngineError::Unavailable(other.to_string())),
        }
    }
    // A pull stream can end "successfully" without the image (daemon quirks): check.
    match inspect_image(engine, image).await {
        Ok(found) if names_image(image, &found) => {
            tracing::info!(image, credentials = %source, "image pulled");
            Ok(found)
        }
        Ok(_) => Err(EngineError::ImageUnavailable {
            image: image.to_string(),
            failure: PullFailure::Missing,
            reason: "the pulled image does not carry this name".into(),
        }),
        Err(e) => Err(EngineError::ImageUnavailable {
            image: image.to_string(),
            failure: PullFailure::Missing,
            reason: e.to_string(),
        }),
    }
}

pub(super) async fn image_id(engine: &DockerEngine, image: &str) -> Result<String, EngineError> {
    let found = engine.docker.inspect_image(image).await.map_err(map_err)?;
    found
        .id
        .ok_or_else(|| EngineError::Unavailable(format!("image {image} has no id")))
}

pub(super) async fn inspect_image(
    engine: &DockerEngine,
    reference: &str,
) -> Result<ImageInfo, EngineError> {
    let i = engine
        .docker
        .inspect_image(reference)
        .await
        .map_err(map_err)?;
    let config = i.config.unwrap_or_default();
    Ok(ImageInfo {
        id: i.id.unwrap_or_default(),
        tags: i.repo_tags.unwrap_or_default(),
        digests: i.repo_digests.unwrap_or_default(),
        labels: config.labels.unwrap_or_default(),
        size: i.size.unwrap_or_default(),
        created: i.created.as_deref().and_then(unix_seconds),
        env: config.env.unwrap_or_default(),
        parent: None,
    })
}

pub(super) async fn list_images(
    engine: &DockerEngine,
    labels: &[(&str, &str)],
) -> Result<Vec<ImageInfo>, EngineError> {
    let found = engine
        .docker
        .list_images(Some(bollard::query_parameters::ListImagesOptions {
            all: false,
            filters: Some(managed_filter(labels)),
            ..Default::default()
        }))
        .await
        .map_err(map_err)?;
    Ok(found
        .into_iter()
        .map(|i| ImageInfo {
            id: i.id,
            tags: i
                .repo_tags
                .into_iter()
                .filter(|t| t != "<none>:<none>")
                .collect(),
            digests: i.repo_digests,
            labels: i.labels,
            size: i.size,
            created: Some(i.created),
            env: Vec::new(),
            parent: (!i.parent_id.is_empty()).then_some(i.parent_id),
        })
        .collect())
}

pub(super) async fn image_tags(
    engine: &DockerEngine,
    repository: &str,
) -> Result<Vec<String>, EngineError> {
    let found = engine
        .docker
        .list_images(Some(bollard::query_parameters::ListImagesOptions {
            all: false,
            filters: Some(std::collections::HashMap::from([(
                "reference".to_string(),
                vec![repository.to_string()],
            )])),
            ..Default::default()
        }))
        .await
        .map_err(map_err)?;
    let prefix = format!("{repository}:");
    Ok(found
        .into_iter()
        .flat_map(|i| i.repo_tags)
        .filter(|t| t.starts_with(&prefix))
        .collect())
}

pub(super) async fn remove_image(
    engine: &DockerEngine,
    reference: &str,
) -> Result<(), EngineError> {
    engine
        .docker
        .remove_image(
            reference,
            Some(bollard::query_parameters::RemoveImageOptions {
                force: false,
                noprune: false,
                ..Default::default()
            }),
            None,
        )
        .await
        .map(drop)
        .map_err(map_err)
}

pub(super) async fn commit(
    engine: &DockerEngine,
    id: &str,
    spec: &CommitSpec,
) -> Result<String, EngineError> {
    let (repo, tag) = spec
        .reference
        .rsplit_once(':')
        .unwrap_or((spec.reference.as_str(), "latest"));
    let config = bollard::models::ContainerConfig {
        env: Some(env_list(&spec.env)),
        labels: Some(spec.labels.clone()),
        entrypoint: Some(spec.entrypoint.clone()),
        cmd: Some(spec.cmd.clone()),
        user: Some(spec.user.clone()),
        ..Default::default()
    };
    let made = engine
        .docker
        .commit_container(
            bollard::query_parameters::CommitContainerOptions {
                container: Some(id.to_string()),
                repo: Some(repo.to_string()),
                tag: Some(tag.to_string()),
                pause: false,
                ..Default::default()
            },
            config,
        )
        .await
        .map_err(map_err)?;
    Ok(made.id)
}

pub(super) async fn tag_image(
    engine: &DockerEngine,
    source: &str,
    reference: &str,
) -> Result<(), EngineError> {
    let (repo, tag) = reference.rsplit_once(':').unwrap_or((reference, "latest"));
    engine
        .docker
        .tag_image(
            source,
            Some(bollard::query_parameters::TagImageOptions {
                repo: Some(repo.to_string()),
                tag: Some(tag.to_string()),
            }),
        )
        .await
        .map_err(map_err)
}

/// The credentials to pull `image` with, in bollard's form, and where they came from (for
/// the log). A lookup that fails is logged (never a value) and the pull goes anonymous: a
/// public image still pulls, a private one is refused as unauthenticated.
async fn pull_credentials(
    engine: &DockerEngine,
    image: &str,
    registry: &Registry,
) -> (Option<bollard::auth::DockerCredentials>, String) {
    match engine.credentials.lookup(registry).await {
        Ok(Some(c)) => {
            let source = c.source.to_string();
            (Some(docker_credentials(c)), source)
        }
        Ok(None) => (None, "none".to_string()),
        Err(e) => {
            tracing::warn!(image, registry = registry.server(), error = %e, "registry credentials unavailable; pulling without");
            (None, "none (lookup failed)".to_string())
        }
    }
}
