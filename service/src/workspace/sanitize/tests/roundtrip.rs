use super::*;
use proptest::prelude::*;

/// Hands out the input in the chunk sizes given, round and round.
struct Chunked<'a> {
    data: &'a [u8],
    sizes: Vec<usize>,
    i: usize,
}

impl Read for Chunked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = self.sizes[self.i % self.sizes.len()];
        self.i += 1;
        let n = want.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// How a generated member is written.
#[derive(Debug, Clone, Copy)]
enum Style {
    /// The Builder's own way: a GNU `L` record when the name is long.
    Plain,
    /// After a PAX record with a comment and a matching `size`.
    PaxComment,
    /// Header size 0, the real size in a PAX record only.
    PaxSizeOnly,
    /// The name in a PAX `path` record (header name short).
    PaxPath,
}

fn style() -> impl Strategy<Value = Style> {
    prop_oneof![
        Just(Style::Plain),
        Just(Style::PaxComment),
        Just(Style::PaxSizeOnly),
        Just(Style::PaxPath),
    ]
}

type Want = (String, EntryType, String, Option<String>);

/// An archive of generated members (name length, data length, style, plus a symlink to
/// it), and the sanitised members it calls for.
fn build(members: &[(usize, usize, Style, bool)]) -> io::Result<(Vec<u8>, Vec<Want>)> {
    let mut b = Builder::new(Vec::new());
    let mut want: Vec<Want> = vec![("repo".into(), D, String::new(), None)];
    for (i, (name_len, data_len, style, link)) in members.iter().enumerate() {
        let name = format!("{i}-{}", "n".repeat(*name_len));
        let data: String = (0..*data_len)
            .map(|j| (b'a' + ((i + j) % 26) as u8) as char)
            .collect();
        let mut h = Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        let size = data.len().to_string();
        let mut records: Vec<(&str, &[u8])> = vec![("size", size.as_bytes())];
        match style {
            Style::Plain => records.clear(),
            Style::PaxComment => records.push(("comment", &b"generated"[..])),
            Style::PaxSizeOnly => h.set_size(0),
            Style::PaxPath => records.push(("path", name.as_bytes())),
        }
        if !records.is_empty() {
            b.append_pax_extensions(records)?;
        }
        if matches!(style, Style::PaxPath) {
            h.set_path("short")?;
            h.set_cksum();
            b.append(&h, data.as_bytes())?;
        } else {
            b.append_data(&mut h, &name, data.as_bytes())?;
        }
        want.push((format!("repo/{name}"), F, data, None));
        if *link {
            let mut h = Header::new_gnu();
            h.set_entry_type(L);
            h.set_mode(0o777);
            h.set_size(0);
            let link_name = format!("l{i}");
            b.append_link(&mut h, &link_name, &name)?;
            want.push((format!("repo/{link_name}"), L, String::new(), Some(name)));
        }
    }
    Ok((b.into_inner()?, want))
}

fn fail(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn normal_archives_sanitise_as_before(
        members in proptest::collection::vec(
            (1usize..4000, 0usize..1500, style(), any::<bool>()),
            1..6,
        ),
        sizes in proptest::collection::vec(1usize..1300, 1..5),
    ) {
        let (input, want) = build(&members).map_err(fail)?;
        // The guard passes every byte on, unchanged, and refuses nothing.
        let refused = Cell::new(None);
        let mut through = Vec::new();
        let chunked = Chunked { data: &input, sizes: sizes.clone(), i: 0 };
        TarGuard::new(chunked, &refused).read_to_end(&mut through).map_err(fail)?;
        prop_assert!(through == input);
        prop_assert!(refused.take().is_none());
        // And the sanitised archive is what the members call for.
        let (out, stats) = run_from(Chunked { data: &input, sizes, i: 0 }).map_err(fail)?;
        prop_assert_eq!(stats.skipped, 0);
        let got: Vec<Want> =
            out.into_iter().map(|o| (o.name, o.kind, o.data, o.link)).collect();
        prop_assert_eq!(got, want);
    }
}
