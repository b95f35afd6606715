//! As `conn_input`, but the peer's valid QX_TRANSPORT_PARAMETERS record always
//! arrives first, so every input exercises streams and flow control.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    skiff_fuzz::drive_conn(data, true);
});
