//! The caller's environment file ([`layout::ENV_FILE`](sandbox_protocol::layout::ENV_FILE)): a
//! JSON list of `[name, value]` pairs the session's create (its skeleton) or its warm-pool claim
//! (an exec) wrote, which commands (read by `serve` for every run) and background processes (read
//! by the supervisor at every start) get on top of the container's environment. It is read each
//! time because a pool member's helpers start before the member is claimed. It lives on the
//! session's own volume, never in the container's environment or layer: a snapshot keeps none
//! of it.

use std::io;
use std::path::Path;

/// The caller's environment from `path`; none when the file is absent (a container made by an
/// older build that was not claimed from a pool). An unreadable or malformed file is reported and counts as empty, and
/// names or values the kernel cannot take are dropped.
pub fn claimed_env(path: &Path) -> Vec<(String, String)> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            eprintln!("daiv-sandbox-helper: cannot read {}: {e}", path.display());
            return Vec::new();
        }
    };
    match serde_json::from_slice::<Vec<(String, String)>>(&bytes) {
        Ok(env) => env
            .into_iter()
            .filter(|(k, v)| !k.is_empty() && !k.contains(['=', '\0']) && !v.contains('\0'))
            .collect(),
        Err(e) => {
            eprintln!("daiv-sandbox-helper: {} is malformed: {e}", path.display());
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::claimed_env;

    #[test]
    fn an_absent_or_malformed_file_is_no_environment_and_bad_names_are_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("environment");
        assert!(claimed_env(&file).is_empty());
        std::fs::write(&file, b"not json").expect("write");
        assert!(claimed_env(&file).is_empty());
        std::fs::write(
            &file,
            br#"[["A","1"],["bad=name","x"],["","x"],["B","nul\u0000"],["C","3"]]"#,
        )
        .expect("write");
        assert_eq!(
            claimed_env(&file),
            vec![("A".into(), "1".into()), ("C".into(), "3".into())]
        );
    }
}
