//! `viewer`: subscribes through a moq-lite relay and checks every frame
//! (hang H.264 decoded with openh264, or the private SKC1 codec); the checks
//! are [`skiff_examples::viewer`].
//!
//! ```text
//! viewer --url tcp://127.0.0.1:4443/anon --broadcast cam.hang --frames 300 --out /tmp/frames
//! viewer --url tcp://127.0.0.1:14443/anon --broadcast mps2/cam.hang --expect-ipcm-pattern --frames 100
//! ```
//!
//! Exits 0 once `--frames` good frames arrived, 1 on a lost or corrupt frame,
//! an ended track, a refused subscription, an invalid URL or the timeout.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use skiff_examples::viewer::{Args, view};
use skiff_monoio::driver::{self, DriverKind};

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
    let result = driver::block_on(DriverKind::Auto, move |_| async move {
        view(&args, &intact, started).await
    });
    match result {
        Ok(Err(msg)) => fail(&msg),
        Err(e) => fail(&format!("runtime: {e}")),
        Ok(Ok(())) => std::process::exit(0),
    }
}
