//! QX_TRANSPORT_PARAMETERS blocks: decode, validate, re-encode.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_core::wire::qmux::{
    DEFAULT_MAX_RECORD_SIZE, Frame, Protocols, TransportParams, select_protocol,
};
use skiff_core::wire::{DecodeError, Writer};

const OURS: &[&str] = &["moq-lite-05", "moq-lite-04"];

fuzz_target!(|data: &[u8]| {
    match TransportParams::decode(data) {
        Ok(p) => {
            assert!(p.record_size_limit() >= DEFAULT_MAX_RECORD_SIZE);
            if let Some(list) = p.application_protocols {
                assert!(!list.is_empty());
                let names = list.iter().count();
                assert!(names <= data.len());
                let _ = select_protocol(Protocols::from_list(OURS), list);
                let _ = select_protocol(list, Protocols::from_list(OURS));
            }
            // Re-encode and decode again: the same values.
            let n = p.encoded_len();
            let mut out = vec![0u8; n];
            let mut w = Writer::new(&mut out);
            p.encode(&mut w).expect("re-encode decoded parameters");
            assert_eq!(w.position(), n, "encoded_len disagrees with encode");
            let again = TransportParams::decode(&out).expect("decode our own parameters");
            assert_eq!(again, p, "parameters round trip");
            // And as a whole frame.
            let f = Frame::TransportParameters(p);
            let mut buf = vec![0u8; f.encoded_len()];
            f.encode(&mut Writer::new(&mut buf)).expect("frame encode");
        }
        Err(e) => assert!(
            !matches!(e, DecodeError::Incomplete | DecodeError::UnknownType(_)),
            "parameter error {e:?}"
        ),
    }
    if let Ok(list) = Protocols::decode(data) {
        for name in list.iter() {
            assert!(name.len() <= data.len());
        }
    }
});
