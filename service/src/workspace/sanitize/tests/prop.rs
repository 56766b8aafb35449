use std::collections::HashMap;

use super::*;
use proptest::prelude::*;

/// Resolves `path` (components under the root) through the emitted tree, following
/// symlinks like the kernel: `Ok(None)` when it leaves the root, `Err(())` for a loop
/// (ELOOP: harmless, nothing is written).
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
        let key = cur.join("/");
        if let Some((L, target)) = tree.get(&key).map(|(k, t)| (*k, t)) {
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

fn member() -> impl Strategy<Value = (String, u8, String)> {
    let comp = prop_oneof![
        Just("a".to_string()),
        Just("b".to_string()),
        Just("..".to_string()),
        Just(".".to_string()),
        Just("c".to_string()),
    ];
    (
        proptest::collection::vec(comp.clone(), 1..4).prop_map(|v| v.join("/")),
        0u8..4,
        proptest::collection::vec(comp, 1..4).prop_map(|v| v.join("/")),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn no_member_lands_outside_the_root(members in proptest::collection::vec(member(), 1..8)) {
        let mut b = Builder::new(Vec::new());
        for (name, kind, target) in &members {
            let mut h = Header::new_ustar();
            let kind = match kind { 0 => F, 1 => D, _ => L };
            h.set_entry_type(kind);
            h.set_mode(0o644);
            h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            if kind == L {
                h.as_old_mut().linkname[..target.len()].copy_from_slice(target.as_bytes());
            }
            h.set_size(0);
            h.set_cksum();
            b.append(&h, io::empty()).unwrap_or_default();
        }
        let input = b.into_inner().unwrap_or_default();
        let Ok((out, _)) = run(&input) else { return Ok(()); };
        let mut tree = HashMap::new();
        for o in &out {
            let rel = o.name.strip_prefix("repo").unwrap_or("").trim_start_matches('/');
            prop_assert!(o.name == "repo" || o.name.starts_with("repo/"));
            if !rel.is_empty() {
                tree.insert(rel.to_string(), (o.kind, o.link.clone().unwrap_or_default()));
            }
        }
        // Extraction in order: each member's parent must resolve inside the root at the
        // time it is written, and every symlink must resolve inside it at the end.
        let mut so_far: HashMap<String, (EntryType, String)> = HashMap::new();
        for o in &out {
            let rel = o.name.strip_prefix("repo").unwrap_or("").trim_start_matches('/');
            if rel.is_empty() { continue; }
            let comps: Vec<String> = rel.split('/').map(String::from).collect();
            let parent = resolve(&so_far, &comps[..comps.len() - 1], 0);
            prop_assert!(parent != Ok(None), "{rel} written outside the root: {out:?}");
            so_far.insert(rel.to_string(), (o.kind, o.link.clone().unwrap_or_default()));
        }
        for (rel, (kind, _)) in &tree {
            if *kind == L {
                let comps: Vec<String> = rel.split('/').map(String::from).collect();
                prop_assert!(resolve(&tree, &comps, 0) != Ok(None), "{rel} escapes: {out:?}");
            }
        }
    }
}
