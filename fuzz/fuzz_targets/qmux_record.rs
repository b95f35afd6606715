//! QMux records and every frame in them: decode, and re-encode whatever decodes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_core::wire::DecodeError;
use skiff_core::wire::qmux::{
    DEFAULT_MAX_RECORD_SIZE, Frame, Frames, Record, TransportError, encode_record, record_len,
};
use skiff_core::wire::{Reader, Writer};

/// Re-encodes `f` as a one-frame record and checks it decodes to the same frame.
fn round_trip(f: &Frame<'_>) {
    let n = record_len(f);
    let mut out = vec![0u8; n];
    let written = encode_record(f, u64::MAX, &mut out).expect("re-encode a decoded frame");
    assert_eq!(written, n, "record_len disagrees with encode_record");
    let rec = Record::decode(&out, u64::MAX).expect("decode our own record");
    assert_eq!(rec.len, n);
    let mut frames = rec.frames();
    match f {
        // PADDING is skipped by the iterator.
        Frame::Padding => assert_eq!(frames.next(), None),
        f => assert_eq!(frames.next(), Some(Ok(*f)), "round trip"),
    }
    assert_eq!(frames.next(), None);
    // Frame::encode alone agrees with encoded_len and refuses a short buffer.
    let len = f.encoded_len();
    let mut w = Writer::new(&mut out[..len - 1]);
    assert!(f.encode(&mut w).is_err());
}

/// A decode error must map to a violation whose close frame encodes.
fn close_for(e: DecodeError) {
    let t = TransportError::from(e);
    let mut buf = [0u8; 64];
    encode_record(&t.close_frame(), DEFAULT_MAX_RECORD_SIZE, &mut buf).expect("close frame");
}

fuzz_target!(|data: &[u8]| {
    // As a stream of records with the default limit.
    let mut rest = data;
    loop {
        match Record::decode(rest, DEFAULT_MAX_RECORD_SIZE) {
            Ok(rec) => {
                assert!(rec.len <= rest.len() && rec.len > rec.body.len());
                assert!(rec.body.len() as u64 <= DEFAULT_MAX_RECORD_SIZE);
                let mut count = 0;
                for f in rec.frames() {
                    count += 1;
                    match f {
                        Ok(f) => round_trip(&f),
                        Err(e) => {
                            assert_ne!(e, DecodeError::Incomplete, "frame error inside a record");
                            close_for(e);
                        }
                    }
                }
                assert!(count <= rec.body.len());
                rest = &rest[rec.len..];
            }
            Err(e) => {
                assert!(
                    matches!(e, DecodeError::Incomplete | DecodeError::TooLarge),
                    "record error {e:?}"
                );
                break;
            }
        }
    }
    // The whole input as one record body, frame by frame through a Reader.
    let mut r = Reader::new(data);
    while !r.is_empty() {
        let before = r.position();
        match Frame::decode(&mut r) {
            Ok(f) => {
                assert!(r.position() > before, "a frame consumed nothing");
                round_trip(&f);
            }
            Err(e) => {
                assert_eq!(r.position(), before, "a failed decode consumed input");
                assert_ne!(e, DecodeError::Incomplete);
                close_for(e);
                break;
            }
        }
    }
    // Frames stops after the first error.
    let mut frames = Frames::new(data);
    while let Some(f) = frames.next() {
        if f.is_err() {
            assert_eq!(frames.next(), None);
            break;
        }
    }
});
