//! WebSocket frames to QMux records (docs/protocol.md §9.4): the decoder as
//! a server (masked frames) and as a client, fed whole and in pieces.
//!
//! Byte 0: bit 0 picks the role, the rest a chunk size; the rest is the
//! peer's bytes. Checks: never a panic; the records out are the same however
//! the input is cut, and so is the error; every complete record's `Size`
//! matches its bytes and stays within the message limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_core::wire::varint;
use skiff_ws::frame::{Decoder, FrameError, Role};

const LIMIT: usize = 16382;

/// Feeds `data` in `step`-byte pieces: the records out and the first error.
fn run(role: Role, data: &[u8], step: usize) -> (Vec<u8>, Option<FrameError>, Option<Option<u16>>) {
    let mut d = Decoder::new(role, LIMIT, 1024);
    let mut out = Vec::new();
    for chunk in data.chunks(step.max(1)) {
        let res = d.feed(chunk);
        out.extend_from_slice(d.records());
        d.consume(d.records().len());
        assert!(d.buffered() <= LIMIT + 8 + chunk.len());
        if let Err(e) = res {
            return (out, Some(e), d.closed());
        }
    }
    (out, None, d.closed())
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let role = if first & 1 == 0 {
        Role::Server
    } else {
        Role::Client
    };
    let step = usize::from(first >> 1) + 1;
    let whole = run(role, rest, rest.len());
    let cut = run(role, rest, step);
    assert_eq!(whole, cut, "the decoder depends on how its input is cut");
    // Records: Size then that many bytes, the last possibly still arriving.
    let mut records = whole.0.as_slice();
    while !records.is_empty() {
        let Ok((size, n)) = varint::decode(records) else {
            break;
        };
        assert!(size as usize <= LIMIT, "a record over the limit");
        let end = (n + size as usize).min(records.len());
        records = &records[end..];
    }
});
