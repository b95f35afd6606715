//! `viewer`: subscribes to a track through a moq-lite relay and checks every frame, from
//! the mps2-an386 firmware's test pattern or from the host `camera` node.
//!
//! ```text
//! viewer --url tcp://127.0.0.1:14443/anon --broadcast mps2/cam --track video --frames 100 --timeout 60
//! ```
//!
//! The host camera (`camera --broadcast host/cam`) is viewed with `--broadcast host/cam`;
//! its frames (magic `SKC1`) are decoded (key frames, XOR deltas against the previous
//! frame) and the picture compared with the pattern of its frame number. A firmware frame
//! must pass [`pattern::check`] (magic, checksum, the picture byte for byte). Each frame
//! must sit at the group and index the reader found it at, carry the timestamp of its
//! frame number, and come after the previous one. Groups skipped at the live edge are allowed; a
//! hole inside a group is not. Exits 0 once `--frames` intact frames arrived, 1 on a
//! corrupt frame, an ended track or session, a connection error, or the timeout.

use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use skiff_examples::camera;
use skiff_monoio::client::{self, ClientCtx, FrameReader, ReadState, Subscriber};
use skiff_monoio::driver::{self, DriverKind};

// The frame rule, shared by source with the firmware (which is `no_std`).
#[allow(dead_code)]
#[path = "../../../boards/qemu-mps2-an386/src/pattern.rs"]
mod pattern;

/// Command-line options.
#[derive(Parser, Debug)]
#[command(about = "Subscribe through a relay and verify a camera's frames (mps2-an386 or host)")]
struct Args {
    /// The relay, `tcp://HOST:PORT/PATH`.
    #[arg(long, default_value = "tcp://127.0.0.1:14443/anon")]
    url: String,
    /// The broadcast path.
    #[arg(long, default_value = "mps2/cam")]
    broadcast: String,
    /// The track name.
    #[arg(long, default_value = "video")]
    track: String,
    /// Intact frames to receive before exiting 0.
    #[arg(long, default_value_t = 100)]
    frames: u64,
    /// Seconds to wait for them (from start) before exiting 1.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
}

/// Where a checked frame belongs, whichever camera made it.
#[derive(Debug, Clone, Copy)]
struct Placed {
    /// Frame number.
    n: u64,
    /// Group sequence it belongs in.
    group: u64,
    /// Index within that group.
    index: u64,
    /// Its timestamp (milliseconds).
    timestamp: u64,
    /// Which camera made it.
    kind: &'static str,
}

/// Checks one payload: a host camera frame (`SKC1`: decoded with `decoder`, the
/// picture compared with the pattern) or an mps2-an386 firmware frame (`SKF1`).
fn place(decoder: &mut camera::Decoder, payload: &[u8]) -> Result<Placed, String> {
    if payload.starts_with(&camera::MAGIC) {
        let h = camera::check(decoder, payload).map_err(|e| e.to_string())?;
        Ok(Placed {
            n: h.n,
            group: h.format.group(h.n),
            index: h.format.index(h.n),
            timestamp: h.format.timestamp_ms(h.n),
            kind: "host camera",
        })
    } else {
        let p = pattern::check(payload).map_err(|e| e.to_string())?;
        Ok(Placed {
            n: p.n.into(),
            group: p.group.into(),
            index: p.index.into(),
            timestamp: p.timestamp_ms(),
            kind: "mps2-an386 pattern",
        })
    }
}

/// Prints `msg` and exits 1.
fn fail(msg: &str) -> ! {
    eprintln!("viewer: FAIL: {msg}");
    std::process::exit(1)
}

fn main() {
    let args = Args::parse();
    let started = Instant::now();
    let intact = Arc::new(AtomicU64::new(0));
    {
        let (intact, timeout, want) = (intact.clone(), args.timeout, args.frames);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(timeout));
            fail(&format!(
                "timeout after {timeout} s: {} of {want} frames intact",
                intact.load(Ordering::Relaxed)
            ));
        });
    }
    let result = driver::block_on(DriverKind::Auto, move |_| view(args, intact, started));
    match result {
        Ok(Err(msg)) => fail(&msg),
        Err(e) => fail(&format!("runtime: {e}")),
        Ok(Ok(())) => std::process::exit(0),
    }
}

/// Subscribes and reads until `args.frames` intact frames arrived (`Ok`) or a rule broke.
async fn view(args: Args, intact: Arc<AtomicU64>, started: Instant) -> Result<(), String> {
    let ctx = Rc::new(ClientCtx::new(16 << 20));
    let notify = ctx.notify().clone();
    let local = ctx.track(&args.track);
    let app = Subscriber::new(&args.broadcast, local);
    let state = app.state.clone();
    let session_error: Rc<std::cell::RefCell<Option<String>>> = Rc::default();
    {
        let (ctx, url, session_error, notify) = (
            ctx.clone(),
            args.url.clone(),
            session_error.clone(),
            notify.clone(),
        );
        monoio::spawn(async move {
            let mut app = app;
            let end = client::run(&url, None, &mut app, &ctx).await;
            *session_error.borrow_mut() = Some(match end {
                Ok(ended) => format!("session ended: {ended:?}"),
                Err(e) => format!("session failed: {e}"),
            });
            notify.bump();
        });
    }
    println!(
        "viewer: subscribing to {}/{} at {}",
        args.broadcast, args.track, args.url
    );

    let mut reader = FrameReader::new(local);
    let waiter = notify.waiter();
    let mut last: Option<Placed> = None;
    let mut decoder = camera::Decoder::new();
    let mut kind = None;
    let mut first_group = None;
    let mut count = 0u64;
    let mut said_started = false;
    loop {
        let seen = notify.generation();
        if !said_started && let Some(g) = state.started.get() {
            said_started = true;
            println!(
                "viewer: subscribed, first group {g} ({:.1} s)",
                started.elapsed().as_secs_f64()
            );
        }
        let mut corrupt: Option<String> = None;
        let st = reader.poll(|f| {
            if corrupt.is_some() || count >= args.frames {
                return;
            }
            let pos = match place(&mut decoder, f.payload) {
                Ok(pos) => pos,
                Err(e) => {
                    corrupt = Some(format!(
                        "frame {} of group {} ({} bytes): {e}",
                        f.index,
                        f.group,
                        f.payload.len()
                    ));
                    return;
                }
            };
            let placed = pos.group == f.group && pos.index == f.index;
            let ordered = last.is_none_or(|l| pos.n > l.n);
            if !placed || !ordered || f.timestamp != pos.timestamp {
                corrupt = Some(format!(
                    "frame n={} (group {}, index {}, ts {}) arrived as frame {} of group {} with ts {} after n={:?}",
                    pos.n,
                    pos.group,
                    pos.index,
                    pos.timestamp,
                    f.index,
                    f.group,
                    f.timestamp,
                    last.map(|l| l.n)
                ));
                return;
            }
            first_group.get_or_insert(pos.group);
            kind.get_or_insert(pos.kind);
            last = Some(pos);
            count += 1;
            intact.store(count, Ordering::Relaxed);
            if count.is_multiple_of(25) {
                println!(
                    "viewer: {count} frames intact (group {}, n={}, {:.1} s)",
                    pos.group,
                    pos.n,
                    started.elapsed().as_secs_f64()
                );
            }
        });
        if let Some(msg) = corrupt {
            return Err(format!("corrupt frame: {msg}"));
        }
        if count >= args.frames {
            println!(
                "viewer: PASS: {count} frames intact ({}), groups {}..={}, {} groups skipped at the live edge, {:.1} s",
                kind.unwrap_or("-"),
                first_group.unwrap_or(0),
                last.map_or(0, |l| l.group),
                reader.lagged,
                started.elapsed().as_secs_f64()
            );
            ctx.close_all();
            return Ok(());
        }
        match st {
            ReadState::Finished => return Err(format!("track finished after {count} frames")),
            ReadState::Aborted(code) => {
                return Err(format!(
                    "track aborted (code {code:#x}) after {count} frames"
                ));
            }
            ReadState::Pending => {}
        }
        if let Some(code) = state.closed.get() {
            return Err(format!(
                "subscription closed ({code:?}) after {count} frames"
            ));
        }
        if let Some(msg) = session_error.borrow().as_ref() {
            return Err(format!("{msg} after {count} frames"));
        }
        waiter.changed(seen).await;
    }
}

#[cfg(test)]
mod tests {
    use super::pattern::{self, Corrupt, FRAME_LEN, Position};

    // ---- the shared frame rule ----

    #[test]
    fn filled_frames_check_out() {
        let mut frame = [0u8; FRAME_LEN];
        for n in [0, 1, 29, 30, 31, 12_345, u32::MAX] {
            pattern::fill(&mut frame, n);
            assert_eq!(pattern::check(&frame), Ok(Position::of(n)));
        }
        assert_eq!(Position::of(61).group, 2);
        assert_eq!(Position::of(61).index, 1);
        assert_eq!(Position::of(30).timestamp_ms(), 1000);
    }

    #[test]
    fn every_flipped_byte_is_caught() {
        let mut frame = [0u8; FRAME_LEN];
        pattern::fill(&mut frame, 77);
        for i in 0..FRAME_LEN {
            let mut bad = frame;
            bad[i] ^= 0x01;
            assert!(pattern::check(&bad).is_err(), "flip at byte {i} passed");
        }
    }

    #[test]
    fn wrong_lengths_and_magic_are_named() {
        let mut frame = [0u8; FRAME_LEN];
        pattern::fill(&mut frame, 5);
        assert_eq!(
            pattern::check(&frame[..FRAME_LEN - 1]),
            Err(Corrupt::Length)
        );
        assert_eq!(pattern::check(&[]), Err(Corrupt::Length));
        frame[0] = b'X';
        assert_eq!(pattern::check(&frame), Err(Corrupt::Magic));
    }

    #[test]
    fn the_picture_moves() {
        let (mut a, mut b) = ([0u8; FRAME_LEN], [0u8; FRAME_LEN]);
        pattern::fill(&mut a, 3);
        pattern::fill(&mut b, 4);
        assert_ne!(a[16..508], b[16..508]);
    }
}
