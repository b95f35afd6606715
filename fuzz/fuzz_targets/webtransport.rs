//! What a WebTransport peer sends on the streams HTTP/3 keeps for itself
//! (docs/protocol.md §12), as skiff-quic reads it: byte 0 picks the reader
//! (a stream header, uni or bidi; the control stream; the CONNECT stream as
//! a server or as a client) and the chunk size the rest is fed in.
//! Never a panic; the bounds hold; a chunked feed ends as a whole one does.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_quic::webtransport::{
    CAPSULES_MAX, CONTROL_MAX, ConnectStream, ControlStream, FRAME_MAX, StreamHeader,
    decode_request, decode_response,
};

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(pick >> 3).max(1);
    match pick & 0x7 {
        0 | 1 => {
            let bidi = pick & 1 == 1;
            let mut h = StreamHeader::default();
            let mut at = 0;
            while h.need(bidi) > 0 && at < rest.len() {
                let n = h.need(bidi).min(rest.len() - at);
                h.push(&rest[at..at + n]);
                at += n;
            }
            // The header never takes more than two varints.
            assert!(at <= 16);
            if h.need(bidi) == 0 {
                assert!(h.kind(bidi).is_some());
            }
        }
        2 => {
            let mut whole = ControlStream::default();
            let all = whole.feed(rest);
            let mut parts = ControlStream::default();
            let mut chunked = Ok(());
            for c in rest.chunks(chunk) {
                chunked = parts.feed(c);
                if chunked.is_err() {
                    break;
                }
            }
            if rest.len() as u64 > CONTROL_MAX {
                assert!(all.is_err());
            }
            assert_eq!(all.is_ok(), chunked.is_ok());
            assert_eq!(whole.settings(), parts.settings());
        }
        _ => {
            let server = pick & 1 == 0;
            let mut c = ConnectStream::default();
            let mut failed = false;
            for part in rest.chunks(chunk) {
                if c.feed(part).is_err() {
                    failed = true;
                    break;
                }
            }
            if let Some(h) = c.headers() {
                assert!(h.len() <= FRAME_MAX + 16);
                if server {
                    if let Ok(r) = decode_request(h) {
                        assert!(r.target.starts_with('/'));
                    }
                } else {
                    let _ = decode_response(h);
                }
            }
            if !failed && let Some((_, reason)) = c.close() {
                assert!(reason.len() as u64 <= CAPSULES_MAX);
            }
        }
    }
});
