//! The first bytes of a connection from a `--proxy-protocol-from` load
//! balancer: `skiff_relay::proxy_protocol::decode` (PROXY protocol v1 and v2).
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_relay::proxy_protocol::{Header, HeaderError, MAX_HEADER_BYTES, decode};

fuzz_target!(|data: &[u8]| {
    match decode(data) {
        Ok(Header::Complete { len, client }) => {
            // The header lies inside the input and the relay's bound, and
            // decodes the same on its own.
            assert!(len > 0 && len <= data.len() && len <= MAX_HEADER_BYTES);
            assert_eq!(decode(&data[..len]), Ok(Header::Complete { len, client }));
        }
        // More is read only while the bound leaves room.
        Ok(Header::Incomplete) => assert!(data.len() < MAX_HEADER_BYTES),
        Err(HeaderError::V1(_) | HeaderError::V2(_) | HeaderError::TooLong) => {}
        Err(HeaderError::Missing) => assert!(!data.is_empty()),
        Err(e) => panic!("unexpected error {e}"),
    }
});
