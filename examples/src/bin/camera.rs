//! `camera`: the host camera node. Captures a moving test pattern, encodes it
//! (run-length key frames, XOR-delta frames, one group per GOP) and publishes
//! it through a moq-lite relay, paced to `--fps`, with a progress line a second.
//!
//! ```text
//! skiff-relay serve --listen 127.0.0.1:4443 &
//! camera --url tcp://127.0.0.1:4443/anon --broadcast host/cam --track video
//! viewer --url tcp://127.0.0.1:4443/anon --broadcast host/cam --track video --frames 300
//! ```
//!
//! Runs until Ctrl-C, or until `--frames` frames are published (then exits 0).
//! The relay may come and go: the publisher redials with backoff. See
//! `skiff_examples::camera` for the payload format.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Parser;
use skiff_examples::camera::Format;
use skiff_examples::node::{self, NodeOptions};
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::signals::SignalWatcher;

/// Command-line options.
#[derive(Parser, Debug)]
#[command(about = "Publish a synthetic, encoded camera track through a moq-lite relay")]
struct Args {
    /// The relay, `tcp://HOST:PORT/PATH`.
    #[arg(long, default_value = "tcp://127.0.0.1:4443/anon")]
    url: String,
    /// The broadcast path.
    #[arg(long, default_value = "host/cam")]
    broadcast: String,
    /// The track name.
    #[arg(long, default_value = "video")]
    track: String,
    /// Picture width in pixels.
    #[arg(long, default_value_t = Format::DEFAULT.width)]
    width: u16,
    /// Picture height in pixels.
    #[arg(long, default_value_t = Format::DEFAULT.height)]
    height: u16,
    /// Frames per second.
    #[arg(long, default_value_t = Format::DEFAULT.fps)]
    fps: u16,
    /// Frames per group (GOP); each group starts with a key frame.
    #[arg(long, default_value_t = Format::DEFAULT.gop)]
    gop: u16,
    /// Stop after this many frames [default: run until interrupted].
    #[arg(long)]
    frames: Option<u64>,
}

fn main() {
    let args = Args::parse();
    let format = match Format::new(args.width, args.height, args.fps, args.gop) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("camera: {e}");
            std::process::exit(2);
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    // Ctrl-C / SIGTERM: end the track and close the session cleanly (a second one exits).
    let _signals = {
        let stop = stop.clone();
        SignalWatcher::install()
            .and_then(|w| w.on_signal(move || stop.store(true, Ordering::Relaxed)))
            .map_err(|e| eprintln!("camera: no signal handling ({e}); Ctrl-C kills"))
            .ok()
    };
    println!(
        "camera: publishing {}/{} to {} ({}x{} grey, {} fps, {} frames per group)",
        args.broadcast, args.track, args.url, format.width, format.height, format.fps, format.gop
    );
    let opts = NodeOptions {
        url: args.url,
        broadcast: args.broadcast,
        track: args.track,
        format,
        frames: args.frames,
    };
    let result = driver::block_on(DriverKind::Auto, move |_| {
        node::run(opts, stop, |p| println!("camera: {p}"))
    });
    match result {
        Ok(p) => println!("camera: done: {p}"),
        Err(e) => {
            eprintln!("camera: runtime: {e}");
            std::process::exit(1);
        }
    }
}
