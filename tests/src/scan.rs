//! Scanning what the engine keeps for a string: `docker save` of an image (its config and every
//! layer, decompressed), or every file under a directory of this host. Tests use it to prove a
//! secret or a caller's value reached none of a snapshot's parts, with a marker proving the scan
//! read content.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, ensure};

/// Marks which of `needles` occur in what `r` yields (streamed; a needle may straddle reads).
pub fn scan(mut r: impl Read, needles: &[&str], found: &mut [bool]) -> Result<()> {
    let keep = needles.iter().map(|n| n.len()).max().unwrap_or(1) - 1;
    let mut buf = vec![0u8; 1 << 20];
    let mut window: Vec<u8> = Vec::with_capacity(buf.len() + keep);
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        window.extend_from_slice(&buf[..n]);
        for (i, needle) in needles.iter().enumerate() {
            if !found[i] && contains(&window, needle.as_bytes()) {
                found[i] = true;
            }
        }
        let cut = window.len().saturating_sub(keep);
        window.drain(..cut);
    }
}

pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    let Some(&first) = needle.first() else {
        return true;
    };
    let mut from = 0;
    while let Some(p) = hay[from..].iter().position(|b| *b == first) {
        let at = from + p;
        if hay[at..].starts_with(needle) {
            return true;
        }
        from = at + 1;
    }
    false
}

/// Like [`scan`], decompressing first when `r` starts as gzip or zstd does.
pub fn scan_maybe_compressed(r: impl Read, needles: &[&str], found: &mut [bool]) -> Result<()> {
    let mut br = BufReader::with_capacity(1 << 16, r);
    let head = br.fill_buf()?.to_vec();
    if head.starts_with(&[0x1f, 0x8b]) {
        scan(flate2::read::MultiGzDecoder::new(br), needles, found)
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        scan(
            zstd::stream::read::Decoder::with_buffer(br)?,
            needles,
            found,
        )
    } else {
        scan(br, needles, found)
    }
}

/// Which of `needles` occur in `docker save` of `image`: its config and every layer (each
/// decompressed if it is compressed), base layers included.
pub fn saved_image_contains(image: &str, needles: &[&str]) -> Result<Vec<bool>> {
    let mut child = Command::new("docker")
        .args(["save", image])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("docker save")?;
    let stdout = child.stdout.take().context("docker save stdout")?;
    let mut found = vec![false; needles.len()];
    let mut archive = tar::Archive::new(stdout);
    let mut entries = 0;
    for entry in archive.entries()? {
        let entry = entry?;
        entries += 1;
        scan_maybe_compressed(entry, needles, &mut found)?;
    }
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "docker save {image}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(entries > 0, "docker save {image} wrote nothing");
    Ok(found)
}

/// Which of `needles` occur in any file under `dir` on this host (symlinks not followed; each
/// file decompressed if it is compressed); also how many files were read.
pub fn dir_contains(dir: &Path, needles: &[&str]) -> Result<(Vec<bool>, usize)> {
    let mut found = vec![false; needles.len()];
    let mut files = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("read {}", d.display()))? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                files += 1;
                let f = std::fs::File::open(entry.path())?;
                scan_maybe_compressed(f, needles, &mut found)?;
            }
        }
    }
    Ok((found, files))
}

/// Which of `needles` occur in snapshot `id`'s payload: `docker save` of its image (the base
/// image by another name where it committed nothing) and the data volume of every layer of its
/// stack (its own, then those its `daiv.sandbox.snapshot.lowers` label names).
pub fn snapshot_contains(id: &str, needles: &[&str]) -> Result<Vec<bool>> {
    let image = format!("daiv-sandbox-snapshot:{id}");
    let tagged = Command::new("docker")
        .args(["image", "inspect", &image])
        .stdin(Stdio::null())
        .output()
        .context("docker image inspect")?
        .status
        .success();
    // A fork's snapshot that committed nothing loses its name once its forks hold its layers
    // (they run from the base image it named); a commit stays while they use it.
    let mut found = match tagged {
        true => saved_image_contains(&image, needles)?,
        false => vec![false; needles.len()],
    };
    let mut layers = vec![id.to_string()];
    let mut top = true;
    while let Some(layer) = layers.pop() {
        let name = format!("daiv-snapshot-{layer}-data");
        let out = Command::new("docker")
            .args(["volume", "inspect", "--format", "{{json .}}", &name])
            .stdin(Stdio::null())
            .output()
            .context("docker volume inspect")?;
        ensure!(out.status.success(), "no layer {name}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        if top {
            ensure!(
                tagged || v["Labels"]["daiv.sandbox.snapshot.layout"] == "state",
                "{image} is gone while its layer says it was a commit"
            );
            top = false;
        }
        let dir = v["Mountpoint"].as_str().context("mountpoint")?;
        let (in_layer, _) = dir_contains(Path::new(dir), needles)?;
        for (f, l) in found.iter_mut().zip(in_layer) {
            *f |= l;
        }
        if let Some(lowers) = v["Labels"]["daiv.sandbox.snapshot.lowers"].as_str() {
            layers.extend(
                lowers
                    .split(',')
                    .filter(|l| !l.is_empty())
                    .map(String::from),
            );
        }
    }
    Ok(found)
}
