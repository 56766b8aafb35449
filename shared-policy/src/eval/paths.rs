//! A rule's path globs, and the paths no path-restricted rule may match.

use globset::{GlobBuilder, GlobMatcher};

/// A path glob: starts with `/`, no whitespace, no `#` (fragment) or characters globset would
/// read differently from fnmatch; `*` stays within a segment, `**` spans segments.
pub(super) fn compile_path_glob(glob: &str) -> Result<GlobMatcher, String> {
    if !glob.starts_with('/') {
        return Err(format!("{glob:?} must start with \"/\""));
    }
    if glob.chars().any(char::is_whitespace) {
        return Err(format!("{glob:?} must not contain whitespace"));
    }
    if let Some(c) = glob.chars().find(|c| matches!(c, '{' | '}' | '\\' | '#')) {
        return Err(format!("{glob:?} must not contain {c:?}"));
    }
    GlobBuilder::new(glob)
        .literal_separator(true)
        .backslash_escape(false)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| format!("{glob:?} is not a valid glob: {}", e.kind()))
}

/// A request path that origins may read as another path than a glob sees: dot segments (also
/// percent-encoded, or before a `;` parameter, as Tomcat reads `..;`), encoded slashes or
/// backslashes, literal backslashes, empty segments. No path-restricted rule matches such a path.
pub fn path_is_ambiguous(path: &str) -> bool {
    if !path.starts_with('/') || path.contains('\\') || path.contains("//") {
        return true;
    }
    let lower = path.to_ascii_lowercase();
    if lower.contains("%2f") || lower.contains("%5c") || lower.contains("%00") {
        return true;
    }
    lower.split('/').any(|segment| {
        let segment = segment.split(';').next().unwrap_or_default();
        let decoded = segment.replace("%2e", ".");
        decoded == "." || decoded == ".."
    })
}
