//! The memory bounds (`TarGuard`) and hostile names in messages.

use std::io::Cursor;

use super::*;

const MIB: u64 = 1 << 20;

/// A PAX record: `len key=value\n`, the length counting itself.
fn pax_record(key: &str, value: &str) -> Vec<u8> {
    let rest = format!(" {key}={value}\n");
    let mut len = rest.len() + 1;
    while format!("{len}{rest}").len() != len {
        len += 1;
    }
    format!("{len}{rest}").into_bytes()
}

/// A reader counting the bytes pulled from it.
struct Pulled<R> {
    inner: R,
    n: std::rc::Rc<Cell<u64>>,
}

impl<R: Read> Read for Pulled<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.n.set(self.n.get() + n as u64);
        Ok(n)
    }
}

/// Sanitises `head` followed by `tail` bytes of `a`, the way a 100 MiB hostile record would
/// arrive; returns the result and how many bytes were pulled from the input.
fn run_counted(head: Vec<u8>, tail: u64) -> (Result<(Vec<Out>, Stats), SanitizeError>, u64) {
    let n = std::rc::Rc::new(Cell::new(0));
    let input = Pulled {
        inner: Cursor::new(head).chain(io::repeat(b'a').take(tail)),
        n: n.clone(),
    };
    let r = run_from(input);
    (r, n.get())
}

#[test]
fn oversized_long_name_link_and_pax_records_fail_before_they_are_read() {
    for (kind, size, what) in [
        (b'L', 100 * MIB, "L"),
        (b'K', 100 * MIB, "K"),
        (b'x', 100 * MIB, "x"),
        (b'g', 100 * MIB, "g"),
        (b'L', PATH_MAX + 1, "L just over"),
        (b'x', PAX_MAX + 1, "x just over"),
    ] {
        let (r, pulled) = run_counted(block(kind, b"././@LongLink", size, false), size);
        match (kind, &r) {
            (b'L', Err(SanitizeError::NameTooLong))
            | (b'K', Err(SanitizeError::LinkTooLong))
            | (b'x' | b'g', Err(SanitizeError::PaxTooLarge { .. })) => {}
            _ => panic!("{what}: {r:?}"),
        }
        assert!(pulled < MIB, "{what}: {pulled} bytes read");
    }
    let e = run_counted(block(b'L', b"x", 100 * MIB, false), 0).0.err();
    assert_eq!(
        e.map(|e| e.to_string()).as_deref(),
        Some(
            "archive member name is longer than 4095 bytes (PATH_MAX is 4096 with the terminating NUL)"
        )
    );
}

#[test]
fn a_compressed_bomb_in_a_long_name_record_is_not_decompressed() -> Result<(), SanitizeError> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let io = |e: io::Error| SanitizeError::Corrupt(e.to_string());
    gz.write_all(&block(b'L', b"././@LongLink", 100 * MIB, false))
        .map_err(io)?;
    io::copy(&mut io::repeat(b'a').take(8 * MIB), &mut gz).map_err(io)?;
    let gz = gz.finish().map_err(io)?;
    let mut budget = Budget::new(1 << 30, 1000);
    let opts = Options {
        uid: 1,
        gid: 1,
        prefix: "repo".into(),
    };
    let r = sanitize(&gz[..], io::sink(), &opts, &mut budget);
    assert!(matches!(r, Err(SanitizeError::NameTooLong)), "{r:?}");
    assert!(
        budget.bytes_used < MIB,
        "{} bytes decompressed",
        budget.bytes_used
    );
    Ok(())
}

#[test]
fn names_and_link_targets_up_to_path_max_pass_and_longer_ones_are_refused() {
    // Through GNU L/K records, as the tar crate's Builder writes them (name + NUL).
    let long = |len: usize| "n".repeat(len);
    let build = |file: &str, link: Option<&str>| {
        let mut b = Builder::new(Vec::new());
        let mut h = Header::new_gnu();
        h.set_size(2);
        h.set_mode(0o644);
        b.append_data(&mut h, file, &b"hi"[..]).unwrap_or_default();
        if let Some(target) = link {
            let mut h = Header::new_gnu();
            h.set_entry_type(EntryType::Symlink);
            h.set_mode(0o777);
            h.set_size(0);
            b.append_link(&mut h, "link", target).unwrap_or_default();
        }
        b.into_inner().unwrap_or_default()
    };
    let ok = long(4095);
    let r = run(&build(&ok, Some(&ok)));
    let (v, s) = r.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.skipped, 0);
    assert_eq!(v.last().map(|o| o.link.as_deref()), Some(Some(ok.as_str())));
    assert!(
        v.iter()
            .any(|o| o.name == format!("repo/{ok}") && o.data == "hi")
    );
    let too_long = long(4097);
    let r = run(&build(&too_long, None));
    assert!(matches!(r, Err(SanitizeError::NameTooLong)), "{r:?}");
    let r = run(&build("f", Some(&too_long)));
    assert!(matches!(r, Err(SanitizeError::LinkTooLong)), "{r:?}");
    // Through PAX `path` / `linkpath`, which the PAX bound lets reach 64 KiB.
    let big = "a".repeat(5000);
    for (key, want_name) in [("path", true), ("linkpath", false)] {
        let rec = pax_record(key, &big);
        let mut input = block(b'x', b"pax", rec.len() as u64, false);
        input.extend(padded(&rec));
        input.extend(block(b'2', b"link", 0, false));
        input.extend(end());
        let r = run(&input);
        match r {
            Err(SanitizeError::NameTooLong) if want_name => {}
            Err(SanitizeError::LinkTooLong) if !want_name => {}
            r => panic!("{key}: {r:?}"),
        }
    }
}

/// Data that is a valid, hostile `L` header: only a tracker that lost the block structure
/// takes it for one.
fn decoy(len: usize) -> Vec<u8> {
    let mut d = block(b'L', b"././@LongLink", 100 * MIB, false);
    d.resize(len, b'z');
    d
}

#[test]
fn a_pax_size_overrides_the_header_size_and_tracking_follows_it() -> Result<(), SanitizeError> {
    // The header says 0, PAX says 1024: the 1024 bytes (a decoy header) are data.
    let rec = pax_record("size", "1024");
    let mut input = block(b'x', b"pax", rec.len() as u64, false);
    input.extend(padded(&rec));
    input.extend(block(b'0', b"big", 0, false));
    input.extend(decoy(1024));
    input.extend(block(b'0', b"after", 2, false));
    input.extend(padded(b"ok"));
    input.extend(end());
    let (v, _) = run(&input)?;
    assert_eq!(names(&v), ["repo", "repo/big", "repo/after"]);
    assert_eq!(v[1].data.len(), 1024);
    assert_eq!(v[2].data, "ok");
    // The header says 1024, PAX says 0: the next block is a header, and a hostile one.
    let rec = pax_record("size", "0");
    let mut input = block(b'x', b"pax", rec.len() as u64, false);
    input.extend(padded(&rec));
    input.extend(block(b'0', b"empty", 1024, false));
    input.extend(block(b'L', b"././@LongLink", 100 * MIB, false));
    let (r, pulled) = run_counted(input, 100 * MIB);
    assert!(matches!(r, Err(SanitizeError::NameTooLong)), "{r:?}");
    assert!(pulled < MIB, "{pulled}");
    // Like the tar crate, no override from a PAX record without ustar/GNU magic (a plain
    // member to it), nor across a global header (which takes the pending record).
    let mut v7 = Header::new_old();
    v7.set_entry_type(EntryType::XHeader);
    v7.set_size(rec.len() as u64);
    v7.set_cksum();
    let global = pax_record("comment", "hi");
    for lead in [
        [v7.as_bytes().to_vec(), padded(&rec)].concat(),
        [
            block(b'x', b"pax", rec.len() as u64, false),
            padded(&rec),
            block(b'g', b"global", global.len() as u64, false),
            padded(&global),
        ]
        .concat(),
    ] {
        let mut input = lead;
        input.extend(block(b'0', b"big", 1024, false));
        input.extend(decoy(1024));
        input.extend(end());
        let (v, _) = run(&input)?;
        assert_eq!(names(&v), ["repo", "repo/big"]);
        assert_eq!(v[1].data.len(), 1024);
    }
    Ok(())
}

#[test]
fn base256_sizes_are_followed() -> Result<(), SanitizeError> {
    let mut input = block(b'0', b"b256", 600, true);
    input.extend(padded(&decoy(600)));
    input.extend(block(b'0', b"after", 2, false));
    input.extend(padded(b"ok"));
    input.extend(end());
    let (v, _) = run(&input)?;
    assert_eq!(names(&v), ["repo", "repo/b256", "repo/after"]);
    assert_eq!(v[1].data.len(), 600);
    assert_eq!(v[2].data, "ok");
    let mut input = block(b'0', b"b256", 600, true);
    input.extend(padded(&[b'x'; 600]));
    input.extend(block(b'L', b"././@LongLink", 100 * MIB, true));
    let (r, pulled) = run_counted(input, 100 * MIB);
    assert!(matches!(r, Err(SanitizeError::NameTooLong)), "{r:?}");
    assert!(pulled < MIB, "{pulled}");
    Ok(())
}

#[test]
fn gnu_sparse_members_refuse_the_archive() {
    let mut input = block(b'S', b"holes", 0, false);
    input.extend(end());
    let r = run(&input);
    match r {
        Err(e @ SanitizeError::Sparse(_)) => {
            assert!(
                e.to_string().contains("\"holes\" is a GNU sparse file"),
                "{e}"
            );
        }
        r => panic!("{r:?}"),
    }
}

#[test]
fn hostile_names_are_cut_in_messages() {
    assert_eq!(shown(b"a\"b\n"), r#""a\"b\n""#);
    let long = format!("../{}", "a".repeat(32 * 1024));
    let s = shown(long.as_bytes());
    assert_eq!(
        s.chars().count(),
        SHOWN_MAX + 2 + "…(32771 bytes)".chars().count()
    );
    assert!(s.ends_with("\"…(32771 bytes)"), "{s}");
    // Escapes count: 200 characters of output, whatever the input.
    let ctl = vec![1u8; 1000];
    assert!(shown(&ctl).len() < SHOWN_MAX + 40, "{}", shown(&ctl));
    assert!(cut(&"e".repeat(1000)).ends_with("…(1000 bytes)"));
    // A traversal with a name just under PATH_MAX: the message stays short.
    let name = format!("../{}", "a".repeat(4000));
    // The Builder refuses `..`: write the L record by hand.
    let mut rec = name.clone().into_bytes();
    rec.push(0);
    let mut input = block(b'L', b"././@LongLink", rec.len() as u64, false);
    input.extend(padded(&rec));
    input.extend(block(b'0', b"short", 0, false));
    input.extend(end());
    let r = run(&input);
    let msg = match r {
        Err(e @ SanitizeError::Traversal(_)) => e.to_string(),
        r => panic!("{r:?}"),
    };
    assert!(msg.len() < 300, "{} bytes: {msg}", msg.len());
    assert!(msg.ends_with("…(4003 bytes)"), "{msg}");
}
