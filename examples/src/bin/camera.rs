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
//! The relay may come and go: the client redials with backoff. Exits 2 for
//! invalid options (format, URL, names). See
//! `skiff_examples::camera` for the payload format.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use clap::Parser;
use signal_hook::consts::{SIGINT, SIGTERM};
use skiff_examples::camera::Format;
use skiff_examples::node::{self, NodeOptions};
use skiff_monoio::driver::{self, DriverKind};

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
    for signal in [SIGINT, SIGTERM] {
        // Registered first, so it sees `stop` before this signal sets it: a
        // signal after the first exits at once.
        let installed = signal_hook::flag::register_conditional_shutdown(signal, 130, stop.clone())
            .and_then(|_| signal_hook::flag::register(signal, stop.clone()));
        if let Err(e) = installed {
            eprintln!("camera: no signal handling ({e}); Ctrl-C kills");
        }
    }
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
        Ok(Ok(p)) => println!("camera: done: {p}"),
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
