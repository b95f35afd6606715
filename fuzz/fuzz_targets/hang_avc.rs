//! H.264 framing a viewer reads from the network: length-prefixed access units,
//! avcC records from a catalog, and Annex-B splitting.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_core::hang::avc::{self, AnnexB, LengthPrefixed};

fuzz_target!(|data: &[u8]| {
    // An access unit: every NAL lies inside the input; after an error, nothing.
    let mut total = 0;
    let mut failed = false;
    for nal in LengthPrefixed::new(data) {
        assert!(!failed, "a NAL after an error");
        match nal {
            Ok(n) => {
                assert!(!n.is_empty() && n[0] & 0x80 == 0);
                total += avc::LENGTH_SIZE + n.len();
            }
            Err(_) => failed = true,
        }
    }
    assert!(total <= data.len());

    // An avcC record: what it yields re-encodes to a record that parses the same.
    if let Ok((sps, pps, size)) = avc::parse_avcc(data) {
        assert!((1..=4).contains(&size));
        let mut out = vec![0u8; sps.len() + pps.len() + 16];
        if let Ok(n) = avc::write_avcc(sps, pps, &mut out) {
            assert_eq!(avc::parse_avcc(&out[..n]), Ok((sps, pps, 4)));
            assert!(avc::codec_string(sps).is_ok());
        }
    }

    // Annex-B: NALs are non-empty, do not end in a zero byte and hold no start code.
    for nal in AnnexB::new(data) {
        assert!(!nal.is_empty() && nal[nal.len() - 1] != 0);
        assert!(avc::find_start(nal).is_none());
        let _ = avc::starts_picture(nal);
    }
});
