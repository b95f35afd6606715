//! The `viewer` binary's checks, as a library so tests can run them in
//! process: subscribes through a moq-lite relay and checks every frame, in one
//! of two modes.
//!
//! ```text
//! viewer --url tcp://127.0.0.1:4443/anon --broadcast cam.hang --frames 300 --out /tmp/frames
//! viewer --url tcp://127.0.0.1:14443/anon --broadcast mps2/cam.hang --expect-ipcm-pattern --frames 100
//! ```
//!
//! **hang** (a broadcast whose name ends in `.hang`): reads the `catalog.json`
//! track, picks its `avc1`/`avc3` video rendition (or `--track`), and decodes
//! every frame of that track with openh264. Each frame must carry the same
//! time in its FRAME timestamp and its legacy prefix, times must rise, a group
//! must start with a keyframe and lose no frame, and every frame must decode to
//! a picture of the catalog's size. When the pictures carry the camera's stamp
//! (its test pattern), the stamp must read back, its counter must rise, and the
//! glass-to-glass latency (now minus the stamped capture time) is reported.
//! With `--expect-ipcm-pattern` every picture must instead be skiff-core's
//! test card (`skiff_core::hang::testcard`, what the firmware under
//! `boards/` publishes; `boards/qemu-e2e.sh` runs this): every sample exact,
//! the drawn counter rising, the frame's time `counter / fps`. With
//! `--recoveries N` it also waits for N gaps of over a second (the relay
//! restarted, a link went down) after which frames flow again, and prints
//! each gap's length. With `--from -30s` it starts 30 s before the live edge,
//! from the relay's recording (see [`rewind`]), and plays on to live with the
//! camera's stamps rising by exactly one.
//! Prints fps, Mbit/s and latency; `--out DIR` writes each good frame as
//! `DIR/frame-NNNNNN.png`.
//!
//! **pattern** (any other name): the frames of the private run-length codec
//! (`SKC1`), checked byte for byte; see [`crate::camera`].
//!
//! In both modes groups skipped at the live edge are allowed (and in hang mode a
//! group the relay cut short as superseded, OLD); any other hole inside a
//! group is not. The client redials a relay that is not up yet or goes away.
//! [`view`] returns once `--frames` good frames arrived, or with the reason on
//! a lost or corrupt frame, an ended track, a refused subscription or an
//! invalid URL; the binary exits 0 or 1 on that, and 1 on `--timeout`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Parser;
use skiff_monoio::sdk::Request;
use skiff_monoio::{Client, Config, Error, connect};

use crate::camera;

/// The viewer's command-line options.
#[derive(Parser, Debug, Clone)]
#[command(
    about = "Subscribe through a relay and verify a camera's frames (hang H.264, or the private SKC1 codec)"
)]
pub struct Args {
    /// The relay: `tcp://HOST:PORT/PATH`, `tls://...`, `ws://...`, `wss://...`
    /// or `moql://...` (QUIC).
    #[arg(long, default_value = "tcp://127.0.0.1:4443/anon")]
    pub url: String,
    /// Trust the CA certificates of this PEM file for `tls://`, `wss://` and `moql://`
    /// instead of the system's.
    #[arg(long, value_name = "FILE")]
    pub ca: Option<std::path::PathBuf>,
    /// Accept exactly the relay certificate with this SHA-256 (64 hex
    /// digits, what a `--tls-generate` relay answers at
    /// `/certificate.sha256`) for `tls://`, `wss://` and `moql://`.
    #[arg(long, value_name = "HEX", conflicts_with = "ca")]
    pub fingerprint: Option<skiff_monoio::tls::Fingerprint>,
    /// The broadcast path; a name ending in `.hang` is read as hang.
    #[arg(long, default_value = "cam.hang")]
    pub broadcast: String,
    /// The track name [default: hang: the catalog's video rendition; pattern: `video`].
    #[arg(long)]
    pub track: Option<String>,
    /// Good frames to receive before exiting 0.
    #[arg(long, default_value_t = 100)]
    pub frames: u64,
    /// Seconds to wait for them (from start) before exiting 1.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// hang: write each good frame as a PNG file into this directory.
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
    /// hang: every picture must be skiff-core's I_PCM test card (the boards' camera),
    /// exact in every sample, its drawn counter rising.
    #[arg(long)]
    pub expect_ipcm_pattern: bool,
    /// hang: also wait for this many recoveries, frames flowing again after a gap of over
    /// a second (the relay restarted, the link came back), the last followed by 15 good
    /// frames; each gap is printed.
    #[arg(long, default_value_t = 0)]
    pub recoveries: u64,
    /// hang: start this far before the live edge (`-30s`, `-2m`, `-1500ms`) and play on to
    /// it without a gap: the past groups come from the relay's recording (its replay
    /// broadcast's timeline, then FETCH), the rest from a live subscription; the camera's
    /// stamps must rise by exactly one across the whole run.
    #[arg(long, value_name = "AGO", allow_hyphen_values = true, value_parser = parse_ago)]
    pub from: Option<std::time::Duration>,
}

/// Parses `--from`: a negative duration (`-30s`, `-2m`, `-1500ms`), how far back.
fn parse_ago(text: &str) -> Result<std::time::Duration, String> {
    let bad = || format!("{text:?} is not a time before now such as -30s, -2m or -1500ms");
    let rest = text.strip_prefix('-').ok_or_else(bad)?;
    let (digits, unit) = rest.split_at(rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?);
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let ms = match unit {
        "ms" => n,
        "s" => n.checked_mul(1000).ok_or_else(bad)?,
        "m" => n.checked_mul(60_000).ok_or_else(bad)?,
        _ => return Err(bad()),
    };
    if ms == 0 {
        return Err(bad());
    }
    Ok(std::time::Duration::from_millis(ms))
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

/// Checks one payload, a host camera frame of the private codec (`SKC1`):
/// decoded with `decoder`, the picture compared with the pattern.
fn place(decoder: &mut camera::Decoder, payload: &[u8]) -> Result<Placed, String> {
    if !payload.starts_with(&camera::MAGIC) {
        return Err("not an SKC1 frame (a hang broadcast's name ends in .hang)".into());
    }
    let h = camera::check(decoder, payload).map_err(|e| e.to_string())?;
    Ok(Placed {
        n: h.n,
        group: h.format.group(h.n),
        index: h.format.index(h.n),
        timestamp: h.format.timestamp_ms(h.n),
        kind: "host camera",
    })
}

/// Subscribes and reads until `args.frames` intact frames arrived (`Ok`) or a
/// rule broke (`Err` with the reason). `intact` counts the good frames as they
/// arrive (for a watchdog); `started` is when the run began, for the progress lines.
///
/// # Errors
/// The reason the run failed: a lost or corrupt frame, an ended track, a
/// refused subscription, an invalid URL or `--ca` file.
pub async fn view(args: &Args, intact: &AtomicU64, started: Instant) -> Result<(), String> {
    let mut config = Config::default();
    if let Some(file) = &args.ca {
        let roots =
            skiff_monoio::tls::roots_from_pem_file(file).map_err(|e| format!("--ca: {e}"))?;
        config.tls_roots = Some(Arc::new(roots));
    }
    config.tls_fingerprint = args.fingerprint;
    let (client, runner) = connect(&args.url, config).map_err(|e| e.to_string())?;
    let runner = monoio::spawn(runner.run());
    println!("viewer: subscribing to {} at {}", args.broadcast, args.url);
    let done = std::rc::Rc::new(std::cell::Cell::new(false));
    let reporting = monoio::spawn(report_failures(client.clone(), done.clone()));
    let outcome = if args.broadcast.ends_with(skiff_core::hang::BROADCAST_SUFFIX) {
        hang::read(args, &client, intact, started).await
    } else {
        read(args, &client, intact, started).await
    };
    done.set(true);
    reporting.await;
    client.close().await;
    runner.await;
    outcome
}

/// Prints on stderr why a connection attempt failed (a refused certificate,
/// a relay that is not up), once per distinct reason, while the client
/// redials, until `done`.
async fn report_failures(client: Client, done: std::rc::Rc<std::cell::Cell<bool>>) {
    let mut said = String::new();
    while !done.get() {
        if let Some(e) = client.last_error() {
            let text = e.to_string();
            if text != said {
                eprintln!("viewer: connection failed: {text} (retrying)");
                said = text;
            }
        }
        monoio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Reads and checks frames until `args.frames` intact ones arrived.
async fn read(
    args: &Args,
    client: &Client,
    intact: &AtomicU64,
    started: Instant,
) -> Result<(), String> {
    let mut track = client
        .subscribe(
            &args.broadcast,
            args.track.as_deref().unwrap_or("video"),
            Request::LIVE,
        )
        .await
        .map_err(|e| format!("subscription failed: {e}"))?;
    let mut last: Option<Placed> = None;
    let mut decoder = camera::Decoder::new();
    // A frame's bytes in one piece for the checks (sized by the largest frame).
    let mut bytes = Vec::new();
    let mut kind = None;
    let mut first_group = None;
    let mut skipped = 0u64;
    let mut count = 0u64;
    loop {
        let mut group = match track.next_group().await {
            Ok(Some(g)) => g,
            Ok(None) => return Err(format!("track finished after {count} frames")),
            Err(e) => return Err(format!("{e} after {count} frames")),
        };
        let seq = group.sequence();
        if first_group.is_none() {
            println!(
                "viewer: subscribed, first group {seq} ({:.1} s)",
                started.elapsed().as_secs_f64()
            );
        } else {
            skipped += group.skipped();
        }
        let mut index = 0u64;
        loop {
            let frame = match group.read_frame().await {
                Ok(Some(f)) => f,
                Ok(None) => break,
                // Fell behind (the group left the cache) or its source cut it
                // short: read on with the next group, which starts with a key frame.
                Err(Error::Evicted) => {
                    skipped += 1;
                    break;
                }
                Err(Error::Aborted(_)) => break,
                Err(e) => return Err(format!("{e} after {count} frames")),
            };
            bytes.clear();
            for chunk in frame.payload.chunks() {
                bytes.extend_from_slice(chunk);
            }
            let pos = place(&mut decoder, &bytes).map_err(|e| {
                format!(
                    "corrupt frame: frame {index} of group {seq} ({} bytes): {e}",
                    bytes.len()
                )
            })?;
            let placed = pos.group == seq && pos.index == index;
            let ordered = last.is_none_or(|l| pos.n > l.n);
            if !placed || !ordered || frame.timestamp != pos.timestamp {
                return Err(format!(
                    "corrupt frame: frame n={} (group {}, index {}, ts {}) arrived as frame {index} of group {seq} with ts {} after n={:?}",
                    pos.n,
                    pos.group,
                    pos.index,
                    pos.timestamp,
                    frame.timestamp,
                    last.map(|l| l.n)
                ));
            }
            index += 1;
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
            if count >= args.frames {
                println!(
                    "viewer: PASS: {count} frames intact ({}), groups {}..={}, {skipped} groups skipped at the live edge, {:.1} s",
                    kind.unwrap_or("-"),
                    first_group.unwrap_or(0),
                    pos.group,
                    started.elapsed().as_secs_f64()
                );
                return Ok(());
            }
        }
    }
}

mod hang;
mod rewind;

#[cfg(test)]
mod tests {
    use super::parse_ago;
    use std::time::Duration;

    #[test]
    fn from_takes_a_time_before_now() {
        assert_eq!(parse_ago("-30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_ago("-2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_ago("-1500ms"), Ok(Duration::from_millis(1500)));
        for bad in [
            "30s",
            "-30",
            "-s",
            "-0s",
            "-3h",
            "-99999999999999999999s",
            "",
            "-1.5s",
        ] {
            assert!(parse_ago(bad).is_err(), "{bad}");
        }
    }
}
