//! Stream error codes a QUIC peer sends (RESET_STREAM, STOP_SENDING), as
//! skiff-quic reads them (docs/protocol.md §11.6): any 62-bit value, mapped
//! back from the HTTP/3 range or taken as it is; never a panic, and a code
//! that came from a moq-lite code maps back to it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_quic::transport::{code_from_wire, code_to_wire};

fuzz_target!(|data: &[u8]| {
    let mut raw = [0u8; 8];
    let n = data.len().min(8);
    raw[..n].copy_from_slice(&data[..n]);
    let wire = u64::from_le_bytes(raw) & ((1 << 62) - 1);
    if let Some(code) = code_from_wire(wire)
        && let Ok(small) = u32::try_from(code)
        && (0x52e4_a40f_a8db..=0x52e5_ac98_3162).contains(&wire)
    {
        // A mapped code maps back to the same wire value.
        assert_eq!(code_to_wire(small), wire);
    }
    let code = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
    assert_eq!(code_from_wire(code_to_wire(code)), Some(u64::from(code)));
});
