//! Client-supplied text made safe to show.

/// At most 200 characters of a client-supplied string, for an error message or a log field:
/// a hostile name must not make either grow with it.
pub fn shown(s: &str) -> String {
    const MAX: usize = 200;
    if s.chars().count() <= MAX {
        return s.to_string();
    }
    let cut: String = s.chars().take(MAX).collect();
    format!("{cut}…({} bytes)", s.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_cuts_long_strings() {
        assert_eq!(shown("short"), "short");
        let long = "x".repeat(5000);
        let s = shown(&long);
        assert!(s.len() < 260 && s.ends_with("(5000 bytes)"), "{s}");
    }
}
