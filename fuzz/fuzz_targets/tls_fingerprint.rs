//! Certificate-pinning text on untrusted input: a `--fingerprint` value
//! (`Fingerprint::from_str`) and a `--tls-generate` host
//! (`cert::check_host`), as flags and TOML values give them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_monoio::tls::{Fingerprint, FingerprintError};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let trimmed = text.trim();
    match text.parse::<Fingerprint>() {
        // Accepted: 64 hex digits, printed back as their lowercase.
        Ok(f) => assert_eq!(f.to_string(), trimmed.to_ascii_lowercase()),
        Err(FingerprintError::Length(n)) => {
            assert_eq!(n, trimmed.chars().count());
            assert_ne!(n, 64);
        }
        Err(FingerprintError::NotHex(i)) => {
            assert_eq!(trimmed.chars().count(), 64);
            let c = trimmed.chars().nth(i).expect("the index is inside");
            assert!(!c.is_ascii_hexdigit());
            assert!(trimmed.chars().take(i).all(|c| c.is_ascii_hexdigit()));
        }
        Err(e) => panic!("unexpected error {e}"),
    }
    // A host is an IP address or a DNS name; never a panic.
    if skiff_relay::cert::check_host(text).is_ok() {
        assert!(!text.is_empty());
        assert!(!text.contains(char::is_whitespace));
    }
});
