//! Seeding end to end on both images: formats, the sanitiser's rules on real Docker, one-shot,
//! limits, failures that leave the session unseeded, a clean `git status`, a large archive.

use anyhow::Result;
use e2e::workspace::{Member, bzip2, gzip, seed, tar_of, xz, zstd};
use e2e::{BUSYBOX, ControlPlane, DEBIAN, require_image};

fn sample() -> Result<Vec<u8>> {
    tar_of(&[
        Member::Dir("./", 0o755),
        Member::Dir("./src/", 0o700),
        Member::File("./src/main.py", b"print('hi')\n", 0o600),
        Member::File("./run.sh", b"#!/bin/sh\necho run\n", 0o700),
        Member::Symlink("./link", "src/main.py"),
    ])
}

async fn formats_ownership_and_one_shot(image: &str) -> Result<()> {
    require_image(image);
    let cp = ControlPlane::start().await?;
    let plain = sample()?;
    let variants = [
        ("plain", plain.clone()),
        ("gzip", gzip(&plain)?),
        ("bzip2", bzip2(&plain)?),
        ("xz", xz(&plain)?),
        ("zstd", zstd(&plain)?),
    ];
    for (kind, bytes) in variants {
        let s = cp.session_of(image).await?;
        let r = seed(
            &cp,
            &s,
            vec![("repo_archive", bytes.clone()), ("skills_archive", bytes)],
        )
        .await?;
        assert_eq!(r.status, 204, "{kind}: {:?}", r.body);
        assert_eq!(r.skipped, Some(0), "{kind}");
        let (code, out) = cp
            .sh(
                &s,
                "cd /workspace && stat -c '%u:%g %a %n' repo repo/src repo/src/main.py repo/run.sh skills/run.sh && cat repo/link && echo \"$(id -u):$(id -g)\"",
            )
            .await?;
        assert_eq!(code, 0, "{kind}: {out}");
        let owner = out.lines().last().unwrap_or_default().trim().to_string();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], format!("{owner} 755 repo"), "{kind}: {out}");
        assert_eq!(lines[1], format!("{owner} 755 repo/src"), "{kind}: {out}");
        assert_eq!(
            lines[2],
            format!("{owner} 644 repo/src/main.py"),
            "{kind}: {out}"
        );
        assert_eq!(
            lines[3],
            format!("{owner} 755 repo/run.sh"),
            "{kind}: {out}"
        );
        assert_eq!(
            lines[4],
            format!("{owner} 755 skills/run.sh"),
            "{kind}: {out}"
        );
        assert!(out.contains("print('hi')"), "{kind}: {out}");
        // One-shot: the second seed is refused, and commands cannot forge or remove the marker.
        let again = seed(&cp, &s, vec![("repo_archive", plain.clone())]).await?;
        assert_eq!(again.status, 409, "{kind}");
        let (code, _) = cp.sh(&s, "rm -f /.daiv-sandbox/seeded").await?;
        assert_ne!(
            code, 0,
            "the marker must not be removable by the sandbox user"
        );
    }
    Ok(())
}

#[tokio::test]
async fn formats_ownership_and_one_shot_busybox() -> Result<()> {
    formats_ownership_and_one_shot(BUSYBOX).await
}

#[tokio::test]
async fn formats_ownership_and_one_shot_debian() -> Result<()> {
    formats_ownership_and_one_shot(DEBIAN).await
}

async fn hostile_members_are_dropped(image: &str) -> Result<()> {
    require_image(image);
    let cp = ControlPlane::start().await?;
    let s = cp.session_of(image).await?;
    let archive = tar_of(&[
        Member::File("ok.txt", b"fine\n", 0o644),
        Member::File("suid", b"x", 0o4755),
        Member::Dir("sticky/", 0o1777),
        Member::Hardlink("hard", "ok.txt"),
        Member::Fifo("fifo"),
        Member::CharDevice("null"),
        Member::Symlink("abs", "/etc/passwd"),
        Member::Symlink("up", "../../etc"),
        Member::Symlink("dir", "sticky"),
        Member::File("dir/through.txt", b"through a symlink\n", 0o644),
        Member::File("ok.txt", b"second copy\n", 0o644),
    ])?;
    let r = seed(&cp, &s, vec![("repo_archive", gzip(&archive)?)]).await?;
    assert_eq!(r.status, 204, "{:?}", r.body);
    assert_eq!(r.skipped, Some(7));
    let (code, out) = cp
        .sh(
            &s,
            "cd /workspace/repo && ls -A | sort | tr '\\n' ' ' && stat -c '%a' suid sticky && cat ok.txt",
        )
        .await?;
    assert_eq!(code, 0, "{out}");
    // Special bits cleared; permissions otherwise kept (a+rX,u+w only adds).
    assert_eq!(out, "dir ok.txt sticky suid 755\n777\nfine\n");
    Ok(())
}

#[tokio::test]
async fn hostile_members_are_dropped_busybox() -> Result<()> {
    hostile_members_are_dropped(BUSYBOX).await
}

#[tokio::test]
async fn hostile_members_are_dropped_debian() -> Result<()> {
    hostile_members_are_dropped(DEBIAN).await
}

async fn refused_archives_leave_the_session_unseeded(image: &str) -> Result<()> {
    require_image(image);
    let cp = ControlPlane::start_with(&[("SEED_MAX_MEMBERS", "50"), ("SEED_MAX_BYTES", "200000")])
        .await?;
    let s = cp.session_of(image).await?;
    // `..` rejects the whole archive, after a member already landed: cleaned up, not seeded.
    let evil = tar_of(&[
        Member::File("first.txt", b"landed\n", 0o644),
        Member::File("../escape.txt", b"x", 0o644),
    ])?;
    let r = seed(&cp, &s, vec![("repo_archive", evil)]).await?;
    assert_eq!(r.status, 422, "{:?}", r.body);
    assert!(
        r.body["detail"].as_str().unwrap_or_default().contains(".."),
        "{:?}",
        r.body
    );
    let abs = tar_of(&[Member::File("/abs.txt", b"x", 0o644)])?;
    assert_eq!(
        seed(&cp, &s, vec![("repo_archive", abs)]).await?.status,
        422
    );
    let corrupt = gzip(b"definitely not a tar archive, but long enough to look like one........")?;
    assert_eq!(
        seed(&cp, &s, vec![("repo_archive", corrupt)]).await?.status,
        422
    );
    let truncated = gzip(&sample()?)?;
    let truncated = truncated[..truncated.len() / 2].to_vec();
    assert_eq!(
        seed(&cp, &s, vec![("repo_archive", truncated)])
            .await?
            .status,
        422
    );
    // Limits: members, then decompressed bytes.
    let names: Vec<String> = (0..60).map(|i| format!("f{i}")).collect();
    let many: Vec<Member<'_>> = names.iter().map(|n| Member::File(n, b"", 0o644)).collect();
    let r = seed(&cp, &s, vec![("repo_archive", gzip(&tar_of(&many)?)?)]).await?;
    assert_eq!(r.status, 413, "{:?}", r.body);
    assert!(
        r.body["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("SEED_MAX_MEMBERS")
    );
    let big = vec![b'a'; 300_000];
    let r = seed(
        &cp,
        &s,
        vec![(
            "repo_archive",
            gzip(&tar_of(&[Member::File("big", &big, 0o644)])?)?,
        )],
    )
    .await?;
    assert_eq!(r.status, 413, "{:?}", r.body);
    assert!(
        r.body["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("SEED_MAX_BYTES")
    );
    // Neither field (an unknown one is ignored) -> 422.
    let r = seed(&cp, &s, vec![("other", sample()?)]).await?;
    assert_eq!(r.status, 422, "{:?}", r.body);
    let (_, out) = cp.sh(&s, "ls -A /workspace/repo | wc -l").await?;
    assert_eq!(out.trim(), "0", "a failed seed left files behind");
    // Still unseeded: a good archive now succeeds.
    let r = seed(
        &cp,
        &s,
        vec![("repo_archive", sample()?), ("dockerfile", b"x".to_vec())],
    )
    .await?;
    assert_eq!(r.status, 204, "{:?}", r.body);
    // Unknown sessions are 404.
    let ghost = e2e::Session { id: "0".repeat(64) };
    assert_eq!(
        seed(&cp, &ghost, vec![("repo_archive", sample()?)])
            .await?
            .status,
        404
    );
    std::mem::forget(ghost);
    Ok(())
}

#[tokio::test]
async fn refused_archives_leave_the_session_unseeded_busybox() -> Result<()> {
    refused_archives_leave_the_session_unseeded(BUSYBOX).await
}

#[tokio::test]
async fn refused_archives_leave_the_session_unseeded_debian() -> Result<()> {
    refused_archives_leave_the_session_unseeded(DEBIAN).await
}

/// A repository built with the host's git, archived with the tar crate, seeded into Debian
/// (which has git): nothing is lost or altered, so the tree is clean.
#[tokio::test]
async fn seeded_git_repository_is_clean() -> Result<()> {
    require_image(DEBIAN);
    let dir = std::env::temp_dir().join(format!("daiv-seed-git-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("pkg"))?;
    std::fs::write(dir.join("README.md"), "hello\n")?;
    std::fs::write(dir.join("pkg/mod.py"), "x = 1\n")?;
    std::fs::write(dir.join("tool.sh"), "#!/bin/sh\n")?;
    std::os::unix::fs::symlink("pkg/mod.py", dir.join("alias.py"))?;
    let git = |args: &[&str]| -> Result<()> {
        let st = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t", "-C"])
            .arg(&dir)
            .args(args)
            .status()?;
        anyhow::ensure!(st.success(), "git {args:?}");
        Ok(())
    };
    git(&["init", "-q"])?;
    git(&["update-index", "--add", "--chmod=+x", "tool.sh"]).ok();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(dir.join("tool.sh"))
        .status()?;
    git(&["add", "-A"])?;
    git(&["commit", "-qm", "init"])?;
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.append_dir_all(".", &dir)?;
    let archive = b.into_inner()?;
    let _ = std::fs::remove_dir_all(&dir);

    let cp = ControlPlane::start().await?;
    let s = cp.session_of(DEBIAN).await?;
    let r = seed(&cp, &s, vec![("repo_archive", gzip(&archive)?)]).await?;
    assert_eq!(r.status, 204, "{:?}", r.body);
    let (code, out) = cp.sh(&s, "git status --porcelain && echo CLEAN").await?;
    assert_eq!((code, out.trim()), (0, "CLEAN"), "{out}");
    Ok(())
}

async fn large_archive(image: &str) -> Result<()> {
    require_image(image);
    let cp = ControlPlane::start().await?;
    let s = cp.session_of(image).await?;
    // 64 MiB in 64 files of incompressible-ish data, plain tar.
    let mut b = tar::Builder::new(Vec::new());
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..64 {
        let data: Vec<u8> = (0..1024 * 1024)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, format!("blobs/{i}.bin"), &data[..])?;
    }
    let archive = b.into_inner()?;
    let r = seed(&cp, &s, vec![("repo_archive", archive)]).await?;
    assert_eq!(r.status, 204, "{:?}", r.body);
    let (code, out) = cp.sh(&s, "cat /workspace/repo/blobs/*.bin | wc -c").await?;
    assert_eq!((code, out.trim()), (0, "67108864"));
    Ok(())
}

#[tokio::test]
async fn large_archive_busybox() -> Result<()> {
    large_archive(BUSYBOX).await
}

#[tokio::test]
async fn large_archive_debian() -> Result<()> {
    large_archive(DEBIAN).await
}
