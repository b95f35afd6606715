//! A moq-lite server and client session serving nothing fed a script derived from the
//! input: received bytes in arbitrary chunks, time passing, announce requests,
//! GOAWAY and close. Bit 6 of the first byte starts from a valid handshake and SETUP.
//!
//! Written against the session API as it stood when this target was added
//! (`Session::new(side, config, now, &mut storage, origin)`); the session module was
//! still changing then, so this file is the one to adapt if it stops building.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_core::session::{self, DefaultStorage, Session};
use skiff_core::time::Instant;
use skiff_core::wire::qmux::Side;
use skiff_fuzz::{MAX_CALLS, SLOTS, Script, check_records, handshake_record};

/// The peer's SETUP stream as one record: an empty SETUP on the peer's first uni
/// stream (client uni 2 when we are the server, server uni 3 when we are the client), with FIN.
fn peer_setup_record(us: Side) -> Vec<u8> {
    let id = match us {
        Side::Server => 2,
        Side::Client => 3,
    };
    // STREAM LEN|FIN, stream id, length 3: Stream Type Setup (0x01), SETUP `01 00`.
    vec![0x06, 0x0b, id, 0x03, 0x01, 0x01, 0x00]
}

/// Runs the fuzz script against a server and a client moq-lite [`Session`] serving no local broadcasts (`origin: None`).
///
/// The first byte holds flags; with bit 6 set the peer's valid parameters record and
/// SETUP arrive first, so the script starts on a set-up session and reaches the
/// control-stream parsers.
fn drive_session(data: &[u8]) {
    let Some((&flags, script)) = data.split_first() else {
        return;
    };
    for side in [Side::Server, Side::Client] {
        // `Session::new` borrows the storage for its own lifetime parameter, so a
        // storage with drop glue cannot be dropped at the end of this scope; its
        // tables hold no heap memory, so not dropping it leaks nothing.
        let mut storage = std::mem::ManuallyDrop::new(DefaultStorage::new());
        let mut config = session::Config::new();
        config.conn.keep_alive = flags & 0x04 == 0;
        if flags & 0x02 != 0 {
            config.conn.max_data = 4096;
            config.conn.max_stream_data_bidi_local = 1024;
            config.conn.max_stream_data_bidi_remote = 1024;
            config.conn.max_stream_data_uni = 1024;
        }
        if flags & 0x01 != 0 {
            config.hop = 0x1111;
        }
        let mut now = Instant::from_micros(1_000_000);
        let mut s = Session::<SLOTS>::new(side, config, now, &mut storage, None)
            .expect("fuzz session config is valid");
        let mut out = vec![0u8; 16_400];
        let mut inbox = Vec::new();
        if flags & 0x40 != 0 {
            inbox.extend_from_slice(&handshake_record());
            inbox.extend_from_slice(&peer_setup_record(side));
        }
        let mut sc = Script(script);
        // Step 0 feeds the prefix; then one operation per step.
        let mut first = true;
        loop {
            if !first {
                let Some(op) = sc.byte() else { break };
                match op & 0x07 {
                    0..=3 => {
                        let n = usize::from(sc.byte().unwrap_or(0))
                            * if op & 0x04 != 0 { 64 } else { 1 }
                            + 1;
                        inbox.extend_from_slice(sc.take(n));
                    }
                    4 => {
                        let b = u64::from(sc.byte().unwrap_or(0));
                        now = Instant::from_micros(now.as_micros() + b * b * 1_000);
                        s.handle_timeout(now);
                    }
                    5 => {
                        let _ = s.announce_request(if op & 0x08 != 0 { "room" } else { "" });
                    }
                    6 => {
                        let _ = s.goaway("");
                    }
                    _ => s.close(
                        skiff_core::wire::lite::SessionCode::from_code(u64::from(op >> 3)),
                        "fuzz",
                    ),
                }
            }
            first = false;
            // Feed until the session takes nothing more and has nothing to report.
            for calls in 0.. {
                assert!(calls < MAX_CALLS, "session input did not settle");
                let consumed = match s.handle_input(now, &inbox) {
                    Ok(n) => {
                        assert!(n <= inbox.len(), "consumed past the input");
                        n
                    }
                    Err(e) => {
                        assert_eq!(e, session::Error::Closed, "handle_input error");
                        assert!(s.is_closed());
                        inbox.len()
                    }
                };
                inbox.drain(..consumed);
                let mut events = 0;
                while let Some(ev) = s.poll_event() {
                    events += 1;
                    assert!(events < MAX_CALLS, "poll_event did not settle");
                    let _ = format!("{ev:?}");
                }
                let mut sent = 0;
                loop {
                    let n = s.poll_transmit(now, &mut out);
                    assert!(n <= out.len());
                    if n == 0 {
                        break;
                    }
                    check_records(&out[..n]);
                    sent += 1;
                    assert!(sent < MAX_CALLS, "poll_transmit did not settle");
                }
                if consumed == 0 && events == 0 {
                    break;
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    drive_session(data);
});
