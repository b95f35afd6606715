//! A server's answer to the SDK's upgrade request: `parse_response` never
//! panics, and a complete answer's head length is within the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_ws::http;

const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((n, chosen))) = http::parse_response(data, KEY, skiff_ws::SUBPROTOCOL) {
        assert!(n <= data.len() && n <= http::MAX_HEAD_BYTES);
        assert!(chosen.is_none_or(|p| p == skiff_ws::SUBPROTOCOL));
    }
});
