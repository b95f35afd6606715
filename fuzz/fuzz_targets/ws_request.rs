//! An HTTP request head as a relay reads it (docs/protocol.md §9.1): the
//! first-bytes test, `parse_request` on every prefix length the input
//! suggests, the subprotocol choice and the 101 answer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_ws::http::{self, Choice, MAX_HEAD_BYTES};

fuzz_target!(|data: &[u8]| {
    let _ = http::is_http_start(data);
    // A head arriving in two reads: the first `cut` bytes, then all.
    let cut = data.first().map_or(0, |&b| usize::from(b)).min(data.len());
    for part in [&data[..cut], data] {
        match http::parse_request(part) {
            Ok(Some(req)) => {
                assert!(req.head_len <= part.len() && req.head_len <= MAX_HEAD_BYTES);
                assert!(req.target.starts_with('/'));
                assert!(req.path().len() <= req.target.len());
                if let Some(up) = &req.upgrade {
                    assert_eq!(up.key.len(), 24);
                    let chosen = match http::choose(&up.protocols) {
                        Choice::Speak(p) => Some(p),
                        Choice::NoneOffered => None,
                        Choice::NoMatch => continue,
                    };
                    // Our answer is one our own client accepts.
                    let answer = http::switching_protocols(&up.key, chosen);
                    let offered = chosen.unwrap_or(skiff_ws::SUBPROTOCOL);
                    let (n, p) = http::parse_response(&answer, &up.key, offered)
                        .expect("our 101 parses")
                        .expect("our 101 is complete");
                    assert_eq!(n, answer.len());
                    assert_eq!(p.as_deref(), chosen);
                }
            }
            Ok(None) => assert!(part.len() < MAX_HEAD_BYTES),
            Err(e) => assert!(matches!(e.status(), 400 | 426 | 431)),
        }
    }
});
