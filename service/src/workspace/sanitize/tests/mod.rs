//! The sanitiser's tests, through [`sanitize`] on archives built here: the member rules in this
//! file, the memory bounds in `bounds`, and the property tests in `roundtrip` and `prop`.

use super::*;

use super::decode::{DECODER_MEMORY, xz_decoder};
use tar::Header;

mod bounds;
mod prop;
mod roundtrip;

type Member = (&'static str, EntryType, &'static str, u32);

fn archive(members: &[Member]) -> Vec<u8> {
    let mut b = Builder::new(Vec::new());
    for (name, kind, data_or_target, mode) in members {
        let mut h = Header::new_ustar();
        h.set_entry_type(*kind);
        h.set_mode(*mode);
        h.set_uid(0);
        h.set_gid(0);
        // Write names raw: the tar crate's setters refuse `..` and absolute names, which is
        // exactly what a hostile archive carries.
        let raw = name.as_bytes();
        h.as_old_mut().name[..raw.len()].copy_from_slice(raw);
        if *kind == EntryType::Symlink || *kind == EntryType::Link {
            let t = data_or_target.as_bytes();
            h.as_old_mut().linkname[..t.len()].copy_from_slice(t);
            h.set_size(0);
            h.set_cksum();
            b.append(&h, io::empty()).unwrap_or_default();
        } else {
            h.set_size(data_or_target.len() as u64);
            h.set_cksum();
            b.append(&h, data_or_target.as_bytes()).unwrap_or_default();
        }
    }
    b.into_inner().unwrap_or_default()
}

#[derive(Debug, PartialEq)]
struct Out {
    name: String,
    kind: EntryType,
    mode: u32,
    uid: u64,
    gid: u64,
    link: Option<String>,
    data: String,
}

fn run(input: &[u8]) -> Result<(Vec<Out>, Stats), SanitizeError> {
    run_from(input)
}

fn run_from(input: impl Read) -> Result<(Vec<Out>, Stats), SanitizeError> {
    let mut out = Vec::new();
    let mut budget = Budget::new(1 << 30, 1000);
    let opts = Options {
        uid: 1000,
        gid: 1001,
        prefix: "repo".into(),
    };
    let stats = sanitize(input, &mut out, &opts, &mut budget)?;
    let mut a = tar::Archive::new(&out[..]);
    let mut v = Vec::new();
    for e in a
        .entries()
        .map_err(|e| SanitizeError::Corrupt(e.to_string()))?
    {
        let mut e = e.map_err(|e| SanitizeError::Corrupt(e.to_string()))?;
        let mut data = String::new();
        e.read_to_string(&mut data).unwrap_or_default();
        let h = e.header();
        v.push(Out {
            name: String::from_utf8_lossy(&e.path_bytes())
                .trim_end_matches('/')
                .to_string(),
            kind: h.entry_type(),
            mode: h.mode().unwrap_or(0),
            uid: h.uid().unwrap_or(0),
            gid: h.gid().unwrap_or(0),
            link: e
                .link_name_bytes()
                .map(|l| String::from_utf8_lossy(&l).into_owned()),
            data,
        });
    }
    Ok((v, stats))
}

fn names(v: &[Out]) -> Vec<&str> {
    v.iter().map(|o| o.name.as_str()).collect()
}

const F: EntryType = EntryType::Regular;
const D: EntryType = EntryType::Directory;
const L: EntryType = EntryType::Symlink;

#[test]
fn absolute_names_reject_the_archive() {
    let r = run(&archive(&[("/etc/passwd", F, "x", 0o644)]));
    assert!(matches!(r, Err(SanitizeError::Absolute(_))), "{r:?}");
}

#[test]
fn dotdot_rejects_the_archive() {
    for name in ["../evil", "a/../../evil", "a/.."] {
        let r = run(&archive(&[(name, F, "x", 0o644)]));
        assert!(
            matches!(r, Err(SanitizeError::Traversal(_))),
            "{name}: {r:?}"
        );
    }
}

#[test]
fn leading_dot_slash_is_stripped_and_root_entries_ignored() -> Result<(), SanitizeError> {
    let (v, s) = run(&archive(&[
        ("./", D, "", 0o755),
        ("./a.txt", F, "hi", 0o644),
    ]))?;
    assert_eq!(names(&v), ["repo", "repo/a.txt"]);
    assert_eq!(v[1].data, "hi");
    assert_eq!(s.skipped, 0);
    Ok(())
}

#[test]
fn ownership_is_the_sandbox_user() -> Result<(), SanitizeError> {
    let (v, _) = run(&archive(&[("d/", D, "", 0o700), ("d/f", F, "x", 0o600)]))?;
    assert!(v.iter().all(|o| o.uid == 1000 && o.gid == 1001), "{v:?}");
    Ok(())
}

#[test]
fn modes_are_normalised_like_chmod_a_plus_r_big_x_u_plus_w() -> Result<(), SanitizeError> {
    let (v, _) = run(&archive(&[
        ("d/", D, "", 0o700),
        ("d/plain", F, "x", 0o400),
        ("d/exec", F, "x", 0o700),
    ]))?;
    let mode = |n: &str| v.iter().find(|o| o.name == n).map(|o| o.mode);
    assert_eq!(mode("repo/d"), Some(0o755));
    assert_eq!(mode("repo/d/plain"), Some(0o644));
    assert_eq!(mode("repo/d/exec"), Some(0o755));
    Ok(())
}

#[test]
fn setuid_setgid_sticky_are_cleared() -> Result<(), SanitizeError> {
    let (v, _) = run(&archive(&[("s", F, "x", 0o6755), ("t/", D, "", 0o1777)]))?;
    assert!(v.iter().all(|o| o.mode & 0o7000 == 0), "{v:?}");
    Ok(())
}

#[test]
fn hardlinks_devices_fifos_are_dropped_and_counted() -> Result<(), SanitizeError> {
    let (v, s) = run(&archive(&[
        ("f", F, "x", 0o644),
        ("hard", EntryType::Link, "f", 0o644),
        ("dev", EntryType::Char, "", 0o644),
        ("blk", EntryType::Block, "", 0o644),
        ("fifo", EntryType::Fifo, "", 0o644),
    ]))?;
    assert_eq!(names(&v), ["repo", "repo/f"]);
    assert_eq!(s.skipped, 4);
    Ok(())
}

#[test]
fn missing_parents_are_synthesised_with_sandbox_ownership() -> Result<(), SanitizeError> {
    let (v, _) = run(&archive(&[("a/b/c.txt", F, "x", 0o644)]))?;
    assert_eq!(names(&v), ["repo", "repo/a", "repo/a/b", "repo/a/b/c.txt"]);
    assert!(v[1].kind == D && v[1].mode == 0o755 && v[1].uid == 1000);
    Ok(())
}

#[test]
fn duplicate_names_first_wins() -> Result<(), SanitizeError> {
    let (v, s) = run(&archive(&[
        ("f", F, "first", 0o644),
        ("f", F, "second", 0o644),
        ("f", D, "", 0o755),
    ]))?;
    assert_eq!(names(&v), ["repo", "repo/f"]);
    assert_eq!(v[1].data, "first");
    assert_eq!(s.skipped, 2);
    Ok(())
}

#[test]
fn relative_inside_symlinks_are_kept() -> Result<(), SanitizeError> {
    let (v, s) = run(&archive(&[
        ("docs/readme", F, "x", 0o644),
        ("docs/link", L, "readme", 0o777),
        ("top", L, "docs/../docs/readme", 0o777),
    ]))?;
    assert_eq!(s.skipped, 0);
    assert_eq!(v.iter().filter(|o| o.kind == L).count(), 2);
    Ok(())
}

#[test]
fn absolute_and_escaping_symlinks_are_dropped() -> Result<(), SanitizeError> {
    let (v, s) = run(&archive(&[
        ("abs", L, "/etc/passwd", 0o777),
        ("up", L, "../outside", 0o777),
        ("a/deep", L, "../../outside", 0o777),
        ("empty", L, "", 0o777),
    ]))?;
    assert_eq!(names(&v), ["repo"]);
    assert_eq!(s.skipped, 4);
    Ok(())
}

#[test]
fn symlink_chains_through_earlier_symlinks_are_refused() -> Result<(), SanitizeError> {
    // a/b -> .. is inside, but c -> a/b/../z would really resolve through it, above the root.
    let (v, s) = run(&archive(&[
        ("a/b", L, "..", 0o777),
        ("c", L, "a/b/../z", 0o777),
    ]))?;
    assert_eq!(names(&v), ["repo", "repo/a", "repo/a/b"]);
    assert_eq!(s.skipped, 1);
    // The same pair in the other order: the later symlink is refused instead.
    let (v, s) = run(&archive(&[
        ("c", L, "a/b/../z", 0o777),
        ("a/b", L, "..", 0o777),
    ]))?;
    assert_eq!(names(&v), ["repo", "repo/c"]);
    assert_eq!(s.skipped, 1);
    Ok(())
}

#[test]
fn no_write_through_or_over_a_symlink() -> Result<(), SanitizeError> {
    let (v, s) = run(&archive(&[
        ("d/", D, "", 0o755),
        ("link", L, "d", 0o777),
        ("link/f", F, "through", 0o644),
        ("link", F, "over", 0o644),
        ("d", L, "x", 0o777),
    ]))?;
    assert_eq!(names(&v), ["repo", "repo/d", "repo/link"]);
    assert_eq!(s.skipped, 3);
    Ok(())
}

#[test]
fn a_file_is_never_a_parent() -> Result<(), SanitizeError> {
    let (v, s) = run(&archive(&[("f", F, "x", 0o644), ("f/g", F, "y", 0o644)]))?;
    assert_eq!(names(&v), ["repo", "repo/f"]);
    assert_eq!(s.skipped, 1);
    Ok(())
}

#[test]
fn limits_are_enforced() {
    let big = "x".repeat(10_000);
    let input = archive(&[("a", F, Box::leak(big.into_boxed_str()), 0o644)]);
    let opts = Options {
        uid: 1,
        gid: 1,
        prefix: "repo".into(),
    };
    let mut budget = Budget::new(4096, 100);
    let r = sanitize(&input[..], io::sink(), &opts, &mut budget);
    assert!(
        matches!(r, Err(SanitizeError::TooLarge { limit: 4096 })),
        "{r:?}"
    );
    let input = archive(&[
        ("a", F, "", 0o644),
        ("b", F, "", 0o644),
        ("c", F, "", 0o644),
    ]);
    let mut budget = Budget::new(1 << 20, 2);
    let r = sanitize(&input[..], io::sink(), &opts, &mut budget);
    assert!(
        matches!(r, Err(SanitizeError::TooManyMembers { limit: 2 })),
        "{r:?}"
    );
}

#[test]
fn synthesised_parents_count_as_members() {
    // Found by fuzz/fuzz_targets/sanitize.rs (fuzz/regressions/sanitize/): one member with a
    // deep name emitted a directory per component, none of them counted, so 200,000 members
    // could create hundreds of millions of directories.
    let opts = Options {
        uid: 1,
        gid: 1,
        prefix: "repo".into(),
    };
    let input = archive(&[("a/b/c/d.txt", F, "x", 0o644)]);
    let mut budget = Budget::new(1 << 20, 3);
    let r = sanitize(&input[..], io::sink(), &opts, &mut budget);
    assert!(
        matches!(r, Err(SanitizeError::TooManyMembers { limit: 3 })),
        "{r:?}"
    );
    let mut budget = Budget::new(1 << 20, 4);
    let stats = sanitize(&input[..], io::sink(), &opts, &mut budget);
    assert!(matches!(stats, Ok(Stats { members: 1, .. })), "{stats:?}");
    assert_eq!(budget.members_used, 4);
    // A 4000-byte name of 2000 components, in a GNU long-name record.
    let mut rec = "a/".repeat(1999).into_bytes();
    rec.extend_from_slice(b"f\0");
    let mut input = block(b'L', b"././@LongLink", rec.len() as u64, false);
    input.extend(padded(&rec));
    input.extend(block(b'0', b"short", 0, false));
    input.extend(end());
    let mut out = Vec::new();
    let mut budget = Budget::new(1 << 30, 1000);
    let r = sanitize(&input[..], &mut out, &opts, &mut budget);
    assert!(
        matches!(r, Err(SanitizeError::TooManyMembers { limit: 1000 })),
        "{r:?}"
    );
    assert!(out.len() < 4 << 20, "{} bytes emitted", out.len());
}

#[test]
fn garbage_is_corrupt_and_compression_is_detected() -> Result<(), SanitizeError> {
    let r = run(b"this is not a tar archive at all, just some text that goes on and on .......................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................");
    assert!(matches!(r, Err(SanitizeError::Corrupt(_))), "{r:?}");
    let plain = archive(&[("a.txt", F, "hello", 0o644)]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&plain)
        .map_err(|e| SanitizeError::Corrupt(e.to_string()))?;
    let gz = gz
        .finish()
        .map_err(|e| SanitizeError::Corrupt(e.to_string()))?;
    let zst = zstd::encode_all(&plain[..], 1).map_err(|e| SanitizeError::Corrupt(e.to_string()))?;
    let mut bz = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::fast());
    bz.write_all(&plain)
        .map_err(|e| SanitizeError::Corrupt(e.to_string()))?;
    let bz = bz
        .finish()
        .map_err(|e| SanitizeError::Corrupt(e.to_string()))?;
    let mut xz = liblzma::write::XzEncoder::new(Vec::new(), 1);
    xz.write_all(&plain)
        .map_err(|e| SanitizeError::Corrupt(e.to_string()))?;
    let xz = xz
        .finish()
        .map_err(|e| SanitizeError::Corrupt(e.to_string()))?;
    for (kind, bytes) in [
        (Compression::None, &plain),
        (Compression::Gzip, &gz),
        (Compression::Zstd, &zst),
        (Compression::Bzip2, &bz),
        (Compression::Xz, &xz),
    ] {
        assert_eq!(detect(bytes), kind);
        let (v, _) = run(bytes)?;
        assert_eq!(v[1].data, "hello", "{kind:?}");
    }
    Ok(())
}

#[test]
fn an_xz_archive_needing_more_decoder_memory_than_allowed_is_refused() {
    use std::io::Write;
    // Preset 6: an 8 MiB dictionary, far over a 1 MiB limit, well under the real one.
    let mut xz = liblzma::write::XzEncoder::new(Vec::new(), 6);
    xz.write_all(&vec![b'a'; 64 * 1024]).expect("compress");
    let xz = xz.finish().expect("finish");
    let mut out = Vec::new();
    let refused = xz_decoder(&xz[..], 1024 * 1024)
        .and_then(|mut d| std::io::Read::read_to_end(&mut d, &mut out));
    assert!(
        refused.is_err(),
        "decoded {} bytes under a 1 MiB limit",
        out.len()
    );
    let mut d = xz_decoder(&xz[..], DECODER_MEMORY).expect("decoder");
    out.clear();
    std::io::Read::read_to_end(&mut d, &mut out).expect("decodes within the real limit");
    assert_eq!(out.len(), 64 * 1024);
}

// === Raw tar blocks, for archives the Builder would not write ===

/// A GNU-magic header block; `size` written octal, or base-256 when `base256`.
fn block(kind: u8, name: &[u8], size: u64, base256: bool) -> Vec<u8> {
    let mut h = Header::new_gnu();
    h.set_entry_type(EntryType::new(kind));
    h.set_mode(0o644);
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    if base256 {
        let field = &mut h.as_old_mut().size;
        field.fill(0);
        field[0] = 0x80;
        field[4..].copy_from_slice(&size.to_be_bytes());
    } else {
        h.set_size(size);
    }
    h.set_cksum();
    h.as_bytes().to_vec()
}

/// `data` padded to whole blocks.
fn padded(data: &[u8]) -> Vec<u8> {
    let mut v = data.to_vec();
    v.resize(data.len().div_ceil(512) * 512, 0);
    v
}

fn end() -> Vec<u8> {
    vec![0; 1024]
}
