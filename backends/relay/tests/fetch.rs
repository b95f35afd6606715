//! FETCH through a `skiff-relay` process (docs/protocol.md §3.10): the SDK
//! fetches a past group the relay holds in its cache and reads the bytes and
//! timestamps the publisher wrote, in the publisher's timescale; a group,
//! track or broadcast the relay does not have is refused as not found.

mod common;
mod peers;

use peers::start_relay;
use skiff_monoio::driver::{self, DriverKind};
use skiff_testkit::watched::Watched;

/// The payload of frame `i` of group `g`.
fn payload(g: u64, i: u64) -> Vec<u8> {
    let mut p = format!("group {g} frame {i} ").into_bytes();
    p.resize(300 + (i as usize * 37) % 500, b'a' + (g as u8 % 26));
    p
}

/// What the fetches saw: group 1's frames, then the outcomes of the misses.
type Seen = (
    std::num::NonZeroU64,
    Vec<(u64, Vec<u8>)>,
    Vec<Result<(), String>>,
);

#[test]
fn a_cached_group_is_fetched_through_the_relay() {
    let relay = start_relay(&[]);
    let url = format!("tcp://{}/", relay.addr);
    let (timescale, frames, misses): Seen =
        driver::block_on(DriverKind::Legacy, move |_| async move {
            // A live viewer keeps the track at the relay, which caches its
            // groups; it reads each as it is written, so the relay holds all
            // three whole.
            let mut watched = Watched::video(&url, "camera", "video").await;
            for g in 0..3u64 {
                let frames = (0..10u64).map(|i| ((g * 10 + i) * 33_333, payload(g, i)));
                watched.write_read(g, frames).await;
            }
            let (fetcher, runner) =
                skiff_monoio::connect(&url, skiff_monoio::Config::default()).unwrap();
            monoio::spawn(runner.run());
            let mut group = fetcher.fetch("camera", "video", 1).await.expect("fetch");
            assert_eq!(group.sequence(), 1);
            let timescale = group.info().timescale;
            let mut frames = Vec::new();
            while let Some(f) = group.read_frame().await.expect("read") {
                frames.push((f.timestamp, f.payload.to_vec()));
            }
            drop(group);
            let mut misses = Vec::new();
            for (path, name, seq) in [
                ("camera", "video", 40),
                ("camera", "audio", 1),
                ("nobody", "video", 1),
            ] {
                let outcome = match fetcher.fetch(path, name, seq).await {
                    Ok(_) => Ok(()),
                    Err(skiff_monoio::Error::NotFound) => Err("not found".to_owned()),
                    Err(e) => Err(e.to_string()),
                };
                misses.push(outcome);
            }
            fetcher.close().await;
            watched.close().await;
            (timescale, frames, misses)
        })
        .expect("runtime");
    assert_eq!(timescale, skiff_core::hang::TIMESCALE);
    let want: Vec<(u64, Vec<u8>)> = (0..10u64)
        .map(|i| ((10 + i) * 33_333, payload(1, i)))
        .collect();
    assert_eq!(frames, want);
    let not_found = Err("not found".to_owned());
    assert_eq!(misses, [not_found.clone(), not_found.clone(), not_found]);
}
