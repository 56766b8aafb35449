//! Image references as a client gives them, held against what the engine resolved them to.
//!
//! Docker resolves an image name it does not hold by name as an image id, or as any prefix of
//! one unique on the engine: three hex digits named another deployment's snapshot. A client's
//! `base_image` is therefore a repository reference only, and what the engine answers counts
//! only when the reference is among the image's own tags or digests.

use crate::ImageInfo;

/// Is `reference` an image id rather than a repository reference (`sha256:…`, or the 64 hex
/// digits Docker itself refuses as a repository name)?
pub fn is_image_id(reference: &str) -> bool {
    let hex = |s: &str| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
    reference
        .get(..7)
        .is_some_and(|p| p.eq_ignore_ascii_case("sha256:"))
        || hex(reference)
}

/// Does `reference` (`[registry/]repo[:tag][@digest]`) name `image` by one of its tags or
/// digests? An untagged reference means `:latest`, as the CLI reads it; Docker Hub's
/// `docker.io/` and `library/` are its familiar form's.
pub fn names_image(reference: &str, image: &ImageInfo) -> bool {
    let (name, tag, digest) = split(reference);
    let name = familiar(name);
    match digest {
        Some(d) => image.digests.iter().any(|r| {
            let (n, _, rd) = split(r);
            familiar(n) == name && rd == Some(d)
        }),
        None => {
            let tag = tag.unwrap_or("latest");
            image.tags.iter().any(|t| {
                let (n, tt, _) = split(t);
                familiar(n) == name && tt == Some(tag)
            })
        }
    }
}

/// The repository of a reference in its familiar form (`busybox` for `docker.io/library/busybox:1`).
pub fn repository(reference: &str) -> &str {
    familiar(split(reference).0)
}

/// (repository, tag, digest) of a reference.
fn split(reference: &str) -> (&str, Option<&str>, Option<&str>) {
    let (rest, digest) = match reference.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (reference, None),
    };
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    match rest[last_slash..].rfind(':') {
        Some(i) => (
            &rest[..last_slash + i],
            Some(&rest[last_slash + i + 1..]),
            digest,
        ),
        None => (rest, None, digest),
    }
}

/// A Docker Hub repository in the form the engine lists it (`busybox`, `org/repo`).
fn familiar(name: &str) -> &str {
    let name = name
        .strip_prefix("docker.io/")
        .or_else(|| name.strip_prefix("index.docker.io/"))
        .unwrap_or(name);
    match name.strip_prefix("library/") {
        Some(official) if !official.contains('/') => official,
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(tags: &[&str], digests: &[&str]) -> ImageInfo {
        ImageInfo {
            id: "sha256:abc123".into(),
            tags: tags.iter().map(|s| s.to_string()).collect(),
            digests: digests.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_reference_names_an_image_by_its_tags_in_every_familiar_form() {
        let i = image(
            &["busybox:latest", "localhost:5000/team/tool:1.2"],
            &["busybox@sha256:feed"],
        );
        for r in [
            "busybox",
            "busybox:latest",
            "docker.io/busybox",
            "docker.io/library/busybox:latest",
            "index.docker.io/library/busybox",
            "localhost:5000/team/tool:1.2",
            "busybox@sha256:feed",
            "docker.io/library/busybox:whatever@sha256:feed",
        ] {
            assert!(names_image(r, &i), "{r}");
        }
    }

    #[test]
    fn an_id_a_prefix_of_one_or_another_tag_names_nothing() {
        let i = image(&["daiv-sandbox-snapshot:0123abcd", "busybox:1"], &[]);
        for r in [
            "abc",
            "abc123",
            "sha256:abc123",
            "busybox",
            "busybox:2",
            "daiv-sandbox-snapshot",
            "localhost:5000/team/tool:1.2",
            "busybox@sha256:feed",
            "library/team/busybox:1",
        ] {
            assert!(!names_image(r, &i), "{r}");
        }
    }

    #[test]
    fn the_repository_is_read_in_its_familiar_form() {
        assert_eq!(
            repository("docker.io/library/busybox:1@sha256:x"),
            "busybox"
        );
        assert_eq!(
            repository("daiv-sandbox-snapshot:0123"),
            "daiv-sandbox-snapshot"
        );
        assert_eq!(repository("localhost:5000/a/b"), "localhost:5000/a/b");
    }

    #[test]
    fn ids_are_told_from_repository_references() {
        let full = "a".repeat(64);
        assert!(is_image_id(&full));
        assert!(is_image_id("sha256:abc"));
        assert!(is_image_id("SHA256:abc"));
        assert!(!is_image_id("abc"));
        assert!(!is_image_id("busybox:latest"));
        assert!(!is_image_id(&"a".repeat(63)));
    }
}
