//! POSIX extended regular expressions (as GNU `grep -E` reads them in the C locale) translated
//! to the `regex` crate's syntax, matched on bytes with Unicode off.
//!
//! Where the two dialects differ: bracket expressions are parsed by POSIX rules (`]` first is
//! literal, `\` is literal, `[:class:]`, `[=c=]`, `[.c.]`) and re-emitted with every member
//! escaped, so the crate's nested classes and `&&`/`--`/`~~` set operations never apply; `*`,
//! `+`, `?` and `{` where no atom precedes them are literals (so `(?i)` is not a flag); `{` that
//! does not start a valid interval is literal, and `{,n}` means `{0,n}`; stacked quantifiers
//! (`a**`) are grouped; GNU's `\<`, `\>`, `\b`, `\B`, `\w`, `\W`, `\s`, `\S`, `` \` ``, `\'` keep
//! their meaning and any other escaped character is literal; non-ASCII characters are matched as
//! their bytes (C locale). Back-references are refused: the crate cannot match them.

/// GNU's limit on interval counts (`RE_DUP_MAX`).
const DUP_MAX: u32 = 32767;

/// Compiles an ERE; `Err` carries why grep would refuse it (or why we cannot run it).
pub fn compile(pattern: &str) -> Result<regex::bytes::Regex, String> {
    // grep takes newline-separated patterns as alternatives.
    let parts: Result<Vec<String>, String> = pattern.split('\n').map(translate).collect();
    let parts = parts?;
    let joined = if parts.len() == 1 {
        parts.into_iter().next().unwrap_or_default()
    } else {
        parts
            .iter()
            .map(|p| format!("(?:{p})"))
            .collect::<Vec<_>>()
            .join("|")
    };
    regex::bytes::RegexBuilder::new(&joined)
        .unicode(false)
        .size_limit(64 * 1024 * 1024)
        .build()
        .map_err(|e| e.to_string())
}

/// What the previous output token was, for quantifier handling.
#[derive(Clone, Copy, PartialEq)]
enum Prev {
    /// Start of the pattern, or after `(`, `|` or `^`: a quantifier here is a literal.
    Start,
    /// An atom starting at this output offset.
    Atom(usize),
    /// A quantifier applied to the atom starting at this offset.
    Quantified(usize),
}

/// One ERE (no newlines) in the crate's syntax.
pub fn translate(p: &str) -> Result<String, String> {
    let chars: Vec<char> = p.chars().collect();
    let mut out = String::new();
    let mut prev = Prev::Start;
    let mut groups: Vec<usize> = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        match c {
            '\\' => {
                let Some(&e) = chars.get(i) else {
                    return Err("trailing backslash".into());
                };
                i += 1;
                let at = out.len();
                match e {
                    '1'..='9' => return Err("back-references are not supported".into()),
                    'w' | 'W' | 's' | 'S' => {
                        out.push('\\');
                        out.push(e);
                    }
                    'b' | 'B' => {
                        out.push('\\');
                        out.push(e);
                        prev = Prev::Start;
                        continue;
                    }
                    '<' => {
                        out.push_str(r"\b{start}");
                        prev = Prev::Start;
                        continue;
                    }
                    '>' => {
                        out.push_str(r"\b{end}");
                        prev = Prev::Start;
                        continue;
                    }
                    '`' => {
                        out.push_str(r"\A");
                        prev = Prev::Start;
                        continue;
                    }
                    '\'' => {
                        out.push_str(r"\z");
                        prev = Prev::Start;
                        continue;
                    }
                    other => push_literal(&mut out, other),
                }
                prev = Prev::Atom(at);
            }
            '[' => {
                let at = out.len();
                i = bracket(&chars, i, &mut out)?;
                prev = Prev::Atom(at);
            }
            '(' => {
                groups.push(out.len());
                out.push('(');
                prev = Prev::Start;
            }
            ')' => {
                let Some(start) = groups.pop() else {
                    return Err("unmatched ) or \\)".into());
                };
                out.push(')');
                prev = Prev::Atom(start);
            }
            '|' => {
                out.push('|');
                prev = Prev::Start;
            }
            '^' => {
                out.push('^');
                prev = Prev::Start;
            }
            '$' => {
                let at = out.len();
                out.push('$');
                prev = Prev::Atom(at);
            }
            '.' => {
                let at = out.len();
                out.push('.');
                prev = Prev::Atom(at);
            }
            '*' | '+' | '?' | '{' => {
                let quant = if c == '{' {
                    match interval(&chars, i)? {
                        Some((q, next)) => {
                            i = next;
                            Some(q)
                        }
                        None => None,
                    }
                } else {
                    Some(c.to_string())
                };
                match (prev, quant) {
                    (Prev::Start, _) | (_, None) => {
                        let at = out.len();
                        push_literal(&mut out, c);
                        prev = Prev::Atom(at);
                    }
                    (Prev::Atom(at), Some(q)) => {
                        out.push_str(&q);
                        prev = Prev::Quantified(at);
                    }
                    (Prev::Quantified(at), Some(q)) => {
                        // `a**`: quantify the quantified atom as a whole.
                        out.insert_str(at, "(?:");
                        out.push(')');
                        out.push_str(&q);
                        prev = Prev::Quantified(at);
                    }
                }
            }
            other => {
                let at = out.len();
                push_literal(&mut out, other);
                prev = Prev::Atom(at);
            }
        }
    }
    if !groups.is_empty() {
        return Err("unmatched ( or \\(".into());
    }
    Ok(out)
}

/// A literal character: ASCII alphanumerics as is, other ASCII as a hex escape, non-ASCII as
/// its UTF-8 bytes (the C locale sees bytes).
fn push_literal(out: &mut String, c: char) {
    if c.is_ascii_alphanumeric() || c == ' ' || c == '_' {
        out.push(c);
        return;
    }
    let mut buf = [0u8; 4];
    for b in c.encode_utf8(&mut buf).bytes() {
        out.push_str(&format!("\\x{b:02X}"));
    }
}

/// Parses `{m}`, `{m,}`, `{m,n}`, `{,n}` after a `{` at `i`; `None` if this is no interval
/// (the `{` is then a literal, as GNU grep takes it).
fn interval(chars: &[char], i: usize) -> Result<Option<(String, usize)>, String> {
    let mut j = i;
    let num = |j: &mut usize| -> Option<u32> {
        let start = *j;
        while *j < chars.len() && chars[*j].is_ascii_digit() {
            *j += 1;
        }
        if *j == start {
            return None;
        }
        Some(
            chars[start..*j]
                .iter()
                .collect::<String>()
                .parse()
                .unwrap_or(u32::MAX),
        )
    };
    let min = num(&mut j);
    let (max, comma) = if chars.get(j) == Some(&',') {
        j += 1;
        (num(&mut j), true)
    } else {
        (min, false)
    };
    if chars.get(j) != Some(&'}') || (min.is_none() && max.is_none()) {
        return Ok(None);
    }
    let lo = min.unwrap_or(0);
    if lo > DUP_MAX || max.is_some_and(|m| m > DUP_MAX) {
        return Err("regular expression too big".into());
    }
    if max.is_some_and(|m| m < lo) {
        return Err("invalid content of \\{\\}".into());
    }
    let q = match (comma, max) {
        (false, _) => format!("{{{lo}}}"),
        (true, None) => format!("{{{lo},}}"),
        (true, Some(m)) => format!("{{{lo},{m}}}"),
    };
    Ok(Some((q, j + 1)))
}

const CLASSES: [&str; 12] = [
    "alpha", "digit", "alnum", "upper", "lower", "space", "blank", "punct", "print", "graph",
    "cntrl", "xdigit",
];

/// Parses a bracket expression whose `[` precedes `i`; emits it, returns the index after `]`.
fn bracket(chars: &[char], mut i: usize, out: &mut String) -> Result<usize, String> {
    out.push('[');
    if chars.get(i) == Some(&'^') {
        out.push('^');
        i += 1;
    }
    let mut first = true;
    loop {
        let Some(&c) = chars.get(i) else {
            return Err("unmatched [, [^, [:, [., or [=".into());
        };
        if c == ']' && !first {
            out.push(']');
            return Ok(i + 1);
        }
        first = false;
        // A member: a class, a collating element / equivalence class, or a character.
        let (lo, next) = if c == '['
            && let Some(&k) = chars.get(i + 1)
            && matches!(k, ':' | '.' | '=')
        {
            let end = (i + 2..chars.len().saturating_sub(1))
                .find(|&j| chars[j] == k && chars[j + 1] == ']')
                .ok_or("unmatched [, [^, [:, [., or [=")?;
            let name: String = chars[i + 2..end].iter().collect();
            if k == ':' {
                if !CLASSES.contains(&name.as_str()) {
                    return Err("invalid character class".into());
                }
                out.push_str(&format!("[:{name}:]"));
                i = end + 2;
                continue;
            }
            let mut it = name.chars();
            match (it.next(), it.next()) {
                (Some(ch), None) => (ch, end + 2),
                _ => return Err("invalid collation character".into()),
            }
        } else {
            (c, i + 1)
        };
        i = next;
        // A range `lo-hi`, unless the `-` is the last member.
        if chars.get(i) == Some(&'-') && chars.get(i + 1).is_some_and(|&h| h != ']') {
            let mut hi = chars[i + 1];
            i += 2;
            if hi == '['
                && let Some(&k) = chars.get(i)
                && matches!(k, '.' | '=')
            {
                let end = (i + 1..chars.len().saturating_sub(1))
                    .find(|&j| chars[j] == k && chars[j + 1] == ']')
                    .ok_or("unmatched [, [^, [:, [., or [=")?;
                let name: Vec<char> = chars[i + 1..end].to_vec();
                if name.len() != 1 {
                    return Err("invalid collation character".into());
                }
                hi = name[0];
                i = end + 2;
            }
            if !lo.is_ascii() || !hi.is_ascii() {
                return Err("ranges of non-ASCII characters are not supported".into());
            }
            if hi < lo {
                return Err("invalid range end".into());
            }
            push_member(out, lo);
            out.push('-');
            push_member(out, hi);
        } else {
            push_member(out, lo);
        }
    }
}

/// A bracket member, escaped so the crate's class syntax never applies.
fn push_member(out: &mut String, c: char) {
    if c.is_ascii_alphanumeric() {
        out.push(c);
    } else {
        let mut buf = [0u8; 4];
        for b in c.encode_utf8(&mut buf).bytes() {
            out.push_str(&format!("\\x{b:02X}"));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn m(p: &str, s: &str) -> bool {
        compile(p).unwrap().is_match(s.as_bytes())
    }

    #[test]
    fn ordinary_eres_match_like_grep() {
        assert!(m("hel+o", "say hello"));
        assert!(m("^a|b$", "xxb"));
        assert!(!m("^a|b$", "xbx"));
        assert!(m("(ab){2}", "xabab"));
        assert!(!m("(ab){2}", "xab"));
        assert!(m("a{,2}b", "b"));
        assert!(m("[[:digit:]]+", "x9"));
        assert!(m("fn [a-z_]+\\(", "pub fn page_checked("));
        assert!(m("\\<word\\>", "a word here"));
        assert!(!m("\\<word\\>", "swordfish"));
        assert!(m("", "anything"));
        assert!(m("x\ny", "only y"));
    }

    #[test]
    fn posix_brackets_are_literal_where_the_crate_differs() {
        assert!(m("[]a]", "]"));
        assert!(m("[^]a]", "b"));
        assert!(!m("[^]a]", "]"));
        assert!(m("[\\]", "\\"));
        assert!(m("[a&&b]", "&"));
        assert!(m("[a[b]", "["));
        assert!(m("[a-]", "-"));
        assert!(m("[~~]", "~"));
        assert!(m("[[.-.]]", "-"));
        assert!(!m("[[:alpha:]]", "1"));
    }

    #[test]
    fn quantifiers_without_an_atom_are_literal() {
        assert!(m("*a", "x*a"));
        assert!(!m("*a", "xa"));
        assert!(m("(?i)A", "?iA"));
        assert!(!m("(?i)A", "a"));
        assert!(m("a{x", "a{x"));
        assert!(m("a**", "aaa"));
        assert!(m("a+*b", "b"));
        assert!(m("^*x", "*x"));
        assert!(m("é", "café"));
        // The C locale sees bytes: `é` is two of them.
        assert!(!m("^a.b$", "a\u{e9}b"));
        assert!(m("^a..b$", "a\u{e9}b"));
        assert!(m("a}]", "a}]"));
    }

    #[test]
    fn what_grep_rejects_is_rejected() {
        for bad in [
            "a(",
            "a)",
            "[a",
            "[[:nope:]]",
            "a{2,1}",
            "a\\",
            "[z-a]",
            "(a)\\1",
            "a{99999}",
        ] {
            assert!(compile(bad).is_err(), "{bad:?}");
        }
    }
}
