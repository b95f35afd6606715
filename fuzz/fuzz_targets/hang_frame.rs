//! hang legacy frames: `varint(pts_us)` + codec bytes, as a viewer reads them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_core::hang::frame::{self, FrameError, MAX_PREFIX_LEN, MAX_TIMESTAMP};

fuzz_target!(|data: &[u8]| {
    match frame::decode(data) {
        Ok((pts, codec)) => {
            assert!(pts <= MAX_TIMESTAMP);
            let used = data.len() - codec.len();
            assert!((1..=MAX_PREFIX_LEN).contains(&used));
            // Re-encoded in the shortest form, the frame decodes to the same parts.
            let mut out = vec![0u8; MAX_PREFIX_LEN + codec.len()];
            let n = frame::encode_prefix(pts, &mut out).expect("re-encode prefix");
            assert!(n <= used);
            assert_eq!(n, frame::prefix_len(pts));
            out.truncate(n);
            out.extend_from_slice(codec);
            assert_eq!(frame::decode(&out), Ok((pts, codec)), "frame round trip");
        }
        Err(e) => assert!(matches!(
            e,
            FrameError::Truncated | FrameError::TimestampTooLarge
        )),
    }
});
