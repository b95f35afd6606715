//! A moq-lite server and client session (empty catalog) fed a script derived from the
//! input: received bytes in arbitrary chunks, time passing, announce requests,
//! GOAWAY and close. Bit 6 of the first byte starts from a valid handshake and SETUP.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    skiff_core_fuzz::drive_session(data);
});
