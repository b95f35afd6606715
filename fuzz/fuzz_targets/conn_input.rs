//! A QMux server and client connection fed a script derived from the input:
//! arbitrary received bytes in arbitrary chunks, time passing, application calls.
//! Bit 6 of the first byte starts from a valid handshake.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let handshake = data.first().is_some_and(|f| f & 0x40 != 0);
    skiff_fuzz::drive_conn(data, handshake);
});
