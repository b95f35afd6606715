//! A timeline track's frames on untrusted bytes (`skiff_archive::window`,
//! docs/protocol.md §10.7): byte 0 picks plain or DEFLATE frames, then each
//! frame is a 2-byte header (bit 15: the frame opens a new group; the rest:
//! its length) and its payload, decoded into timeline records.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_archive::Record;
use skiff_archive::window::{Decoder, DecoderConfig, Event, MAX_INDEX};

fuzz_target!(|data: &[u8]| {
    let Some((&flags, mut rest)) = data.split_first() else {
        return;
    };
    let mut d = Decoder::<Record>::new(DecoderConfig {
        compression: flags & 1 == 1,
        max_frame_bytes: 1 << 16,
        max_records: 256,
    });
    let mut last_push = None;
    while rest.len() >= 2 {
        let head = u16::from_be_bytes([rest[0], rest[1]]);
        let len = usize::from(head & 0x7fff).min(rest.len() - 2);
        let (frame, next) = rest[2..].split_at(len);
        rest = next;
        if head & 0x8000 != 0 {
            d.start_group();
        }
        let before = d.range();
        let Ok(events) = d.decode(frame) else {
            // A refused frame leaves the window as it was.
            assert_eq!(d.range(), before);
            continue;
        };
        assert!(events.len() <= 256 + 2);
        assert!(d.range().start <= d.range().end && d.range().end <= MAX_INDEX);
        for e in events {
            match e {
                // Each record is delivered once, in index order.
                Event::Push { index, .. } => {
                    assert!(last_push.is_none_or(|l| index > l));
                    last_push = Some(index);
                }
                Event::Pop(r) | Event::Skip(r) => assert!(r.start < r.end),
            }
        }
    }
});
