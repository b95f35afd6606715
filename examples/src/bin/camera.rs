//! `camera`: the host camera node. Publishes H.264 in moq-dev's hang format
//! (a `catalog.json` track and a `video` track) through a moq-lite relay,
//! paced to `--fps`, with a progress line a second.
//!
//! ```text
//! skiff-relay serve --listen 127.0.0.1:4443 &
//! camera --url tcp://127.0.0.1:4443/anon --broadcast cam.hang
//! viewer --url tcp://127.0.0.1:4443/anon --broadcast cam.hang --frames 300 --out /tmp/frames
//! ffmpeg -f v4l2 -i /dev/video0 -pix_fmt yuv420p -f yuv4mpegpipe - | camera --input y4m
//! ffmpeg -f v4l2 -i /dev/video0 -c:v libx264 -tune zerolatency -g 30 -bsf:v h264_mp4toannexb -f h264 - | camera --input h264 --fps 30
//! # Over TLS (a relay started with --tls-cert/--tls-key), trusting a private CA:
//! camera --url tls://relay.example:4443/anon --ca ca.pem
//! viewer --url wss://relay.example:4443/anon --ca ca.pem --frames 300
//! # Over QUIC (UDP at the relay's port) to a relay started with
//! # --tls-generate relay.example, pinning the certificate its plain TCP port
//! # answers at /certificate.sha256:
//! camera --url moql://relay.example:4443/anon --fingerprint "$(curl -s http://relay.example:4443/certificate.sha256)"
//! ```
//!
//! Sources (`--input`): `pattern` (default; moving colour bars with a
//! burned-in frame counter and wall-clock time), `y4m` (raw pictures on
//! stdin, encoded with openh264) and `h264` (an Annex-B stream on stdin,
//! published without re-encoding, a group per IDR, timestamps from `--fps`).
//! Runs until Ctrl-C, the end of the input, or `--frames` frames (then exits 0).
//! The relay may come and go: the client redials with backoff. Exits 2 for
//! invalid options or an unusable input, 1 for an input that breaks mid-way.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use clap::{Parser, ValueEnum};
use signal_hook::consts::{SIGINT, SIGTERM};
use skiff_media::node::{self, Input, NodeError, NodeOptions};
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::tls::Fingerprint;

/// Where the pictures come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Source {
    /// The synthetic, stamped test pattern.
    Pattern,
    /// A raw YUV4MPEG2 stream on stdin (8-bit 4:2:0).
    Y4m,
    /// An H.264 Annex-B stream on stdin, published as it is.
    H264,
}

/// Command-line options.
#[derive(Parser, Debug)]
#[command(about = "Publish H.264 video in moq-dev's hang format through a moq-lite relay")]
struct Args {
    /// The relay: `tcp://HOST:PORT/PATH`, `tls://...`, `ws://...`, `wss://...`
    /// or `moql://...` (QUIC).
    #[arg(long, default_value = "tcp://127.0.0.1:4443/anon")]
    url: String,
    /// Trust the CA certificates of this PEM file for `tls://`, `wss://` and `moql://`
    /// instead of the system's.
    #[arg(long, value_name = "FILE")]
    ca: Option<std::path::PathBuf>,
    /// Accept exactly the relay certificate with this SHA-256 (64 hex
    /// digits, what a `--tls-generate` relay answers at
    /// `/certificate.sha256`) for `tls://`, `wss://` and `moql://`.
    #[arg(long, value_name = "HEX", conflicts_with = "ca")]
    fingerprint: Option<Fingerprint>,
    /// The broadcast path (hang broadcasts end in `.hang`).
    #[arg(long, default_value = "cam.hang")]
    broadcast: String,
    /// The video track's name.
    #[arg(long, default_value = "video")]
    track: String,
    /// The source.
    #[arg(long, value_enum, default_value_t = Source::Pattern)]
    input: Source,
    /// Picture width of the pattern, pixels (even, at least 128).
    #[arg(long, default_value_t = 320)]
    width: usize,
    /// Picture height of the pattern, pixels (even, at least 96).
    #[arg(long, default_value_t = 240)]
    height: usize,
    /// Frames per second [default: 30; a Y4M header's rate when given].
    #[arg(long)]
    fps: Option<f64>,
    /// Frames per group: a keyframe every this many frames (encoded sources).
    #[arg(long, default_value_t = 30)]
    gop: u32,
    /// Encoder target, bits per second.
    #[arg(long, default_value_t = 1_000_000)]
    bitrate: u32,
    /// Stop after this many frames [default: run until interrupted or the input ends].
    #[arg(long)]
    frames: Option<u64>,
}

fn main() {
    let args = Args::parse();
    let stop = Arc::new(AtomicBool::new(false));
    // Ctrl-C / SIGTERM: end the tracks and close the session cleanly (a second one exits).
    for signal in [SIGINT, SIGTERM] {
        // Registered first, so it sees `stop` before this signal sets it: a
        // signal after the first exits at once.
        let installed = signal_hook::flag::register_conditional_shutdown(signal, 130, stop.clone())
            .and_then(|_| signal_hook::flag::register(signal, stop.clone()));
        if let Err(e) = installed {
            eprintln!("camera: no signal handling ({e}); Ctrl-C kills");
        }
    }
    let input = match args.input {
        Source::Pattern => Input::Pattern,
        Source::Y4m => Input::Y4m(Box::new(std::io::stdin())),
        Source::H264 => Input::H264(Box::new(std::io::stdin())),
    };
    println!(
        "camera: publishing {} ({}, {:?} source) to {}",
        args.broadcast, args.track, args.input, args.url
    );
    let tls_roots = match &args.ca {
        Some(file) => match skiff_monoio::tls::roots_from_pem_file(file) {
            Ok(roots) => Some(Arc::new(roots)),
            Err(e) => {
                eprintln!("camera: --ca: {e}");
                std::process::exit(2);
            }
        },
        None => None,
    };
    let opts = NodeOptions {
        url: args.url,
        broadcast: args.broadcast,
        track: args.track,
        input,
        width: args.width,
        height: args.height,
        fps: args.fps.unwrap_or(30.0),
        fps_forced: args.fps.is_some(),
        gop: args.gop,
        bitrate: args.bitrate,
        frames: args.frames,
        tls_roots,
        tls_fingerprint: args.fingerprint,
    };
    let result = driver::block_on(DriverKind::Auto, move |_| {
        node::run(opts, stop, |p| println!("camera: {p}"))
    });
    match result {
        Ok(Ok(p)) => println!("camera: done: {p}"),
        Ok(Err(e @ (NodeError::Input(_) | NodeError::Encoder(_)))) => {
            eprintln!("camera: {e}");
            std::process::exit(1);
        }
        Ok(Err(e)) => {
            eprintln!("camera: {e}");
            std::process::exit(2);
        }
        Err(e) => {
            eprintln!("camera: runtime: {e}");
            std::process::exit(1);
        }
    }
}
