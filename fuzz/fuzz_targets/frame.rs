//! The helper channel's frame codec: `FrameDecoder` (the control plane's reader of the helper)
//! and `read_frame` (the helper's reader of the control plane), and the JSON messages inside.
//!
//! Input: one byte `k` (low 3 bits), `k` push sizes, then the byte stream. Invariants, beyond
//! "no panic":
//! - both decoders agree frame by frame, and on where and why the stream is refused;
//! - re-encoding the decoded frames gives back the bytes they were decoded from;
//! - no allocation is larger than the largest frame, and memory does not grow past one frame
//!   plus what was pushed;
//! - a message that parses re-encodes to one that parses to the same value.
#![no_main]

use daiv_sandbox_fuzz::{Counting, measure};
use libfuzzer_sys::fuzz_target;
use sandbox_protocol::frame::{
    self, Frame, FrameDecoder, HEADER_LEN, MAX_PAYLOAD, ProtocolError, kind,
};
use sandbox_protocol::message::{Event, ExtractStats, ProcEvents, Request, Response};

#[global_allocator]
static ALLOC: Counting = Counting;

#[derive(Debug, PartialEq)]
enum End {
    Clean,
    Short,
    Oversize,
    Truncated,
}

fn class(e: &ProtocolError) -> End {
    match e {
        ProtocolError::ShortFrame(_) => End::Short,
        ProtocolError::Oversize(_) => End::Oversize,
        ProtocolError::Truncated => End::Truncated,
        ProtocolError::Io(e) => panic!("I/O error from a slice: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&k, rest)) = data.split_first() else {
        return;
    };
    let k = usize::from(k & 7).min(rest.len());
    let (sizes, stream) = rest.split_at(k);
    let sizes: Vec<usize> = if sizes.is_empty() {
        vec![stream.len().max(1)]
    } else {
        sizes.iter().map(|s| usize::from(*s).max(1)).collect()
    };

    // The incremental decoder, fed in the chunk sizes given.
    let ((pushed, pushed_end), mem) = measure(|| {
        let mut d = FrameDecoder::new();
        let mut frames = Vec::new();
        let mut pos = 0;
        let mut i = 0;
        let end = 'feed: loop {
            loop {
                match d.next_frame() {
                    Ok(Some(f)) => frames.push(f),
                    Ok(None) => break,
                    Err(e) => break 'feed class(&e),
                }
            }
            if pos == stream.len() {
                break if d.pending() == 0 {
                    End::Clean
                } else {
                    End::Truncated
                };
            }
            let n = sizes[i % sizes.len()].min(stream.len() - pos);
            i += 1;
            d.push(&stream[pos..pos + n]);
            pos += n;
        };
        (frames, end)
    });
    let bound = HEADER_LEN + MAX_PAYLOAD;
    assert!(
        mem.largest <= 2 * (bound + stream.len()),
        "largest allocation {}",
        mem.largest
    );
    assert!(
        mem.peak <= 8 * stream.len().min(bound) + 64 * 1024,
        "peak {}",
        mem.peak
    );

    // The blocking reader over the same bytes.
    let ((read, read_end), mem) = measure(|| {
        let mut r = stream;
        let mut frames = Vec::new();
        let end = loop {
            match frame::read_frame(&mut r) {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => break End::Clean,
                Err(e) => break class(&e),
            }
        };
        (frames, end)
    });
    assert!(
        mem.largest <= bound,
        "read_frame allocated {} bytes",
        mem.largest
    );
    assert_eq!(pushed, read, "decoders disagree on frames");
    // `read_frame` sees a short or oversize length as soon as its 4 bytes are in; so does the
    // decoder. A stream cut inside a frame is truncated for both.
    assert_eq!(pushed_end, read_end, "decoders disagree on the end");

    // Round trip: the frames re-encode to exactly the bytes they came from.
    let mut encoded = Vec::new();
    for f in &pushed {
        frame::encode(f.id, f.kind, &f.payload, &mut encoded);
    }
    assert_eq!(&encoded[..], &stream[..encoded.len()]);
    if pushed_end == End::Clean {
        assert_eq!(encoded.len(), stream.len());
    }

    for f in &pushed {
        messages(f);
    }
});

/// Messages: a payload that parses re-encodes (as the peer would send it) to the same value.
fn messages(f: &Frame) {
    match f.kind {
        kind::REQUEST => {
            if let Ok(req) = serde_json::from_slice::<Request>(&f.payload) {
                let mut out = Vec::new();
                frame::encode_json(f.id, kind::REQUEST, &req, &mut out);
                let back = frame::read_frame(&mut &out[..])
                    .expect("frame")
                    .expect("one");
                let again: Request = serde_json::from_slice(&back.payload).expect("reparse");
                assert_eq!(again, req);
            }
        }
        kind::EVENT => {
            if let Ok(ev) = serde_json::from_slice::<Event>(&f.payload) {
                let text = serde_json::to_vec(&ev).expect("serialise");
                assert_eq!(serde_json::from_slice::<Event>(&text).expect("reparse"), ev);
            }
        }
        kind::RESPONSE => {
            if let Ok(resp) = serde_json::from_slice::<Response>(&f.payload) {
                let text = serde_json::to_vec(&resp).expect("serialise");
                let again: Response = serde_json::from_slice(&text).expect("reparse");
                assert_eq!(again, resp);
                let _ = resp.clone().into_result::<ExtractStats>();
                if let Ok(events) = resp.into_result::<ProcEvents>() {
                    let text = serde_json::to_vec(&events).expect("serialise");
                    let again: ProcEvents = serde_json::from_slice(&text).expect("reparse");
                    assert_eq!(again, events);
                }
            }
        }
        _ => {}
    }
}
