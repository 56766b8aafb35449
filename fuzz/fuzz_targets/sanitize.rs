//! The seed sanitiser: a (possibly compressed) tar in, a plain tar out.
//!
//! Input: one byte `k` (low 3 bits), `k` read sizes for the input (every split of the stream is
//! tried), then the archive. Invariants, beyond "no panic":
//! - the output is a well-formed tar whose first entry is the prefix directory;
//! - every emitted name is `repo/` + relative components (no `..`, `.`, empty or absolute);
//! - only directories, regular files and symlinks; owner and modes normalised;
//! - no name twice, and every parent was emitted before, as a directory (nothing is written
//!   through or over a symlink);
//! - every symlink target is relative and resolves inside the root in the final tree;
//! - every emitted entry but the prefix is paid for by the member budget, and the output bytes
//!   are bounded by the decompressed input plus a fixed cost per entry;
//! - Rust heap use stays under a fixed bound whatever the archive claims (PAX and long-name
//!   records are refused before they are read whole).
#![no_main]

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::Read;

use sandbox_service::workspace::sanitize::{Budget, Options, PATH_MAX, PAX_MAX, sanitize};
use daiv_sandbox_fuzz::{Chunked, Counting, measure};
use libfuzzer_sys::fuzz_target;
use tar::EntryType;

#[global_allocator]
static ALLOC: Counting = Counting;

const MAX_BYTES: u64 = 8 << 20;
const MAX_MEMBERS: u64 = 4096;
const UID: u64 = 1000;
const GID: u64 = 1001;
/// A header, and a GNU long-name and long-link record of at most `PATH_MAX` each.
const ENTRY_COST: u64 = 3 * 512 + 2 * (PATH_MAX + 511);
/// Decoder state, a tar header or two, a PAX record, a long name: far below this.
const HEAP_BOUND: usize = 4 << 20;

thread_local! {
    /// Reserved once, outside the measurement, so the output does not count as sanitiser memory.
    static OUT: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(64 << 20));
}

fuzz_target!(|data: &[u8]| {
    let Some((&k, rest)) = data.split_first() else {
        return;
    };
    let k = usize::from(k & 7).min(rest.len());
    let (sizes, archive) = rest.split_at(k);
    OUT.with_borrow_mut(|out| {
        out.clear();
        check(archive, sizes, out);
    });
});

fn check(archive: &[u8], sizes: &[u8], out: &mut Vec<u8>) {
    let opts = Options {
        uid: UID,
        gid: GID,
        prefix: "repo".into(),
    };
    let mut budget = Budget::new(MAX_BYTES, MAX_MEMBERS);
    let (result, mem) =
        measure(|| sanitize(Chunked::new(archive, sizes), &mut *out, &opts, &mut budget));
    assert!(
        mem.peak <= HEAP_BOUND + PAX_MAX as usize,
        "sanitiser heap peak {} bytes",
        mem.peak
    );
    let Ok(stats) = result else {
        return;
    };
    assert!(stats.members <= MAX_MEMBERS);

    let mut emitted: HashMap<String, (EntryType, String)> = HashMap::new();
    let mut order = Vec::new();
    let mut file_bytes = 0u64;
    let mut a = tar::Archive::new(&out[..]);
    let entries = a.entries().expect("output is a tar");
    for (i, e) in entries.enumerate() {
        let mut e = e.expect("output entry reads");
        let raw = e.path_bytes().into_owned();
        let name = String::from_utf8_lossy(&raw).into_owned();
        let h = e.header().clone();
        let kind = h.entry_type();
        assert!(
            matches!(
                kind,
                EntryType::Directory | EntryType::Regular | EntryType::Symlink
            ),
            "{name}: type {kind:?}"
        );
        assert_eq!(h.uid().ok(), Some(UID), "{name}");
        assert_eq!(h.gid().ok(), Some(GID), "{name}");
        let mode = h.mode().expect("mode");
        if kind != EntryType::Symlink {
            assert_eq!(mode & 0o7000, 0, "{name}: special bits {mode:o}");
            assert_eq!(mode & 0o644, 0o644, "{name}: mode {mode:o}");
            if kind == EntryType::Directory {
                assert_eq!(mode & 0o755, 0o755, "{name}: mode {mode:o}");
            }
        }
        let trimmed = name.trim_end_matches('/');
        if i == 0 {
            assert_eq!((trimmed, kind), ("repo", EntryType::Directory));
            continue;
        }
        let rel = trimmed
            .strip_prefix("repo/")
            .unwrap_or_else(|| panic!("{name:?} is outside the prefix"));
        assert!((rel.len() as u64) < PATH_MAX, "{name:?} too long");
        let comps: Vec<&str> = rel.split('/').collect();
        assert!(
            comps
                .iter()
                .all(|c| !c.is_empty() && *c != "." && *c != ".."),
            "{name:?} is not a clean relative name"
        );
        // Every parent was emitted earlier, as a directory.
        for j in 1..comps.len() {
            let parent = comps[..j].join("/");
            match emitted.get(&parent) {
                Some((EntryType::Directory, _)) => {}
                other => panic!("{name:?} written under {parent:?}, which is {other:?}"),
            }
        }
        let link = match kind {
            EntryType::Symlink => {
                let t = e
                    .link_name_bytes()
                    .expect("symlink has a target")
                    .into_owned();
                assert!(!t.is_empty() && !t.starts_with(b"/"), "{name:?} -> {t:?}");
                assert!((t.len() as u64) < PATH_MAX, "{name:?}: target too long");
                String::from_utf8_lossy(&t).into_owned()
            }
            EntryType::Regular => {
                let mut n = 0u64;
                let mut buf = [0u8; 8192];
                loop {
                    let got = e.read(&mut buf).expect("file data reads");
                    if got == 0 {
                        break;
                    }
                    n += got as u64;
                }
                assert_eq!(n, h.size().expect("size"));
                file_bytes += n;
                String::new()
            }
            _ => String::new(),
        };
        let previous = emitted.insert(rel.to_string(), (kind, link));
        assert!(previous.is_none(), "{name:?} emitted twice");
        order.push(rel.to_string());
    }
    assert!(!order.is_empty() || out.len() >= 1024 + 512);
    // Bounded output: the data came from the input, each entry has a fixed cost, and every entry
    // was counted against the member budget.
    let entries = order.len() as u64;
    assert!(file_bytes <= budget.bytes_used);
    assert!(
        entries <= budget.members_used,
        "{entries} entries emitted for {} members counted",
        budget.members_used
    );
    assert!(out.len() as u64 <= budget.bytes_used + (entries + 1) * ENTRY_COST + 1024);
    // Every symlink resolves inside the root (a loop is harmless: nothing is written through it).
    for rel in &order {
        if emitted[rel].0 == EntryType::Symlink {
            let comps: Vec<String> = rel.split('/').map(String::from).collect();
            assert!(
                resolve(&emitted, &comps, 0) != Ok(None),
                "{rel} escapes the root"
            );
        }
    }
}

/// Resolves `path` through the emitted tree like the kernel: `Ok(None)` when it leaves the root,
/// `Err(())` for a loop.
fn resolve(
    tree: &HashMap<String, (EntryType, String)>,
    path: &[String],
    depth: u32,
) -> Result<Option<Vec<String>>, ()> {
    if depth > 40 {
        return Err(());
    }
    let mut cur: Vec<String> = Vec::new();
    for comp in path {
        if comp == ".." {
            if cur.pop().is_none() {
                return Ok(None);
            }
            continue;
        }
        cur.push(comp.clone());
        if let Some((EntryType::Symlink, target)) = tree.get(&cur.join("/")) {
            if target.starts_with('/') {
                return Ok(None);
            }
            let mut next: Vec<String> = cur[..cur.len() - 1].to_vec();
            next.extend(
                target
                    .split('/')
                    .filter(|c| !c.is_empty() && *c != ".")
                    .map(String::from),
            );
            match resolve(tree, &next, depth + 1)? {
                Some(resolved) => cur = resolved,
                None => return Ok(None),
            }
        }
    }
    Ok(Some(cur))
}
