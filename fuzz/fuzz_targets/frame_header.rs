//! FRAME headers and whole frames on a group stream, with the running timestamp.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_core::model::frame::{Frame, Header, MAX_HEADER_LEN};
use skiff_core::wire::{DecodeError, Reader, Writer};

fuzz_target!(|data: &[u8]| {
    if data.len() < 10 {
        return;
    }
    let (head, body) = data.split_at(10);
    let mut prev = u64::from_le_bytes(head[..8].try_into().unwrap());
    let max_payload = usize::from(u16::from_le_bytes([head[8], head[9]]));

    // Headers alone.
    let mut r = Reader::new(body);
    if let Ok(h) = Header::decode(&mut r, prev, max_payload) {
        assert!(h.len <= max_payload);
        assert!(r.position() <= MAX_HEADER_LEN);
        let mut out = [0u8; MAX_HEADER_LEN];
        let n = h
            .encode(prev, &mut Writer::new(&mut out))
            .expect("re-encode header");
        assert_eq!(Ok(n), h.encoded_len(prev));
        assert_eq!(
            Header::decode(&mut Reader::new(&out[..n]), prev, max_payload),
            Ok(h),
            "header round trip"
        );
    }

    // A group stream: frames one after another until the input ends or fails.
    let mut r = Reader::new(body);
    while !r.is_empty() {
        let before = r.position();
        match Frame::decode(&mut r, prev, max_payload) {
            Ok(f) => {
                assert!(f.payload.len() <= max_payload);
                let len = f.encoded_len(prev).expect("encoded_len");
                assert!(len <= r.position() - before);
                let mut out = vec![0u8; len];
                assert_eq!(f.encode(prev, &mut Writer::new(&mut out)), Ok(len));
                let again = Frame::decode(&mut Reader::new(&out), prev, max_payload);
                assert_eq!(again, Ok(f), "frame round trip");
                prev = f.timestamp;
            }
            Err(e) => {
                assert_eq!(r.position(), before, "a failed decode consumed input");
                assert!(matches!(
                    e,
                    DecodeError::Incomplete | DecodeError::TooLarge | DecodeError::InvalidValue
                ));
                break;
            }
        }
    }
});
