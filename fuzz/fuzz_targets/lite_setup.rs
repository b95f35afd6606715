//! moq-lite SETUP: parameter count, duplicate IDs, known values, accessors, round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_core::wire::DecodeError;
use skiff_core::wire::lite::{
    MAX_SETUP_BODY, MAX_SETUP_PARAMS, Param, Setup, decode_message, encode_message, message_len,
};

fuzz_target!(|data: &[u8]| {
    match decode_message::<Setup<'_>>(data) {
        Ok((s, used)) => {
            assert!(used <= data.len() && used <= MAX_SETUP_BODY + 8);
            assert!(s.len() <= MAX_SETUP_PARAMS);
            // Every parameter reads back, IDs are unique, accessors never fail.
            let mut ids = Vec::new();
            for p in s.params() {
                assert!(!ids.contains(&p.id()), "duplicate ID {} accepted", p.id());
                ids.push(p.id());
                if let Param::Path(path) = p {
                    assert!(path.len() <= data.len());
                }
            }
            assert_eq!(ids.len(), s.len(), "params() stopped early");
            let _ = (s.probe(), s.path(), s.role(), s.cost(), s.hop());
            // Round trip, verbatim and through a rebuilt parameter list.
            let len = message_len(&s).expect("message_len");
            let mut out = vec![0u8; len];
            assert_eq!(encode_message(&s, &mut out), Ok(len));
            let (again, used2) = decode_message::<Setup<'_>>(&out).expect("decode our own SETUP");
            assert_eq!((again, used2), (s, len), "round trip");
            let list: Vec<Param<'_>> = s.params().collect();
            let rebuilt = Setup::new(&list);
            let len = message_len(&rebuilt).expect("message_len of a rebuilt SETUP");
            let mut out = vec![0u8; len];
            assert_eq!(encode_message(&rebuilt, &mut out), Ok(len));
            let (again, _) = decode_message::<Setup<'_>>(&out).expect("decode rebuilt SETUP");
            assert_eq!(again, s, "rebuilt round trip");
            assert_eq!(again.path(), s.path());
            assert_eq!(again.hop(), s.hop());
            for cut in [0, used / 2, used - 1] {
                assert_eq!(
                    decode_message::<Setup<'_>>(&data[..cut]).map(|_| ()),
                    Err(DecodeError::Incomplete)
                );
            }
        }
        Err(e) => assert_ne!(e, DecodeError::UnknownType(0), "SETUP has no type field"),
    }
});
