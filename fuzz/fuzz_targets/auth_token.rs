//! The relay's access-control decoders on untrusted text: the dialed path
//! and its `jwt` query, claims JSON and their scope at a path, JWK text, and
//! a token verified with a fixed HS256 key (docs/protocol.md §4.10).
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_relay::auth::{Claims, Key, path};

/// A fixed HS256 key (a 32-byte secret).
const JWK: &str =
    r#"{"kty":"oct","alg":"HS256","k":"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY"}"#;

fuzz_target!(|data: &[u8]| {
    if let Ok(claims) = Claims::from_json(data) {
        let _ = claims.validate();
        let _ = claims.authorize("room/a");
        let _ = claims.authorize("");
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (dialed, jwt) = path::split_dialed(text);
    if let Ok(claims) =
        Claims::from_json(br#"{"root":"room","publish":["a/**"],"subscribe":["**"]}"#)
    {
        let _ = claims.authorize(dialed);
    }
    let _ = Key::parse(text);
    if let Ok(key) = Key::parse(JWK) {
        let _ = key.verify(jwt.unwrap_or(text), std::time::SystemTime::UNIX_EPOCH);
    }
});
