//! FETCH through a `skiff-relay` process (docs/protocol.md §3.10): the SDK
//! fetches a past group the relay holds in its cache and reads the bytes and
//! timestamps the publisher wrote, in the publisher's timescale; a group,
//! track or broadcast the relay does not have is refused as not found.

mod common;
mod peers;

use std::time::Duration;

use peers::start_relay;
use skiff_monoio::driver::{self, DriverKind};

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
            let config = skiff_monoio::Config::default;
            let (publisher, runner) = skiff_monoio::connect(&url, config()).unwrap();
            monoio::spawn(runner.run());
            let broadcast = publisher.publish("camera").unwrap();
            let video = skiff_core::hang::video_info("video").unwrap();
            let mut track = broadcast.create_track(video).unwrap();

            // A live viewer keeps the track at the relay, which caches its groups.
            let (viewer, runner) = skiff_monoio::connect(&url, config()).unwrap();
            monoio::spawn(runner.run());
            let request = skiff_monoio::sdk::Request {
                max_latency: skiff_core::hang::MAX_AGE,
                ..skiff_monoio::sdk::Request::LIVE
            };
            let mut sub = viewer.subscribe("camera", "video", request).await.unwrap();
            while track.subscribers() == 0 {
                monoio::time::sleep(Duration::from_millis(5)).await;
            }
            // The viewer reads each group as it is written: the relay then
            // holds all three whole.
            for g in 0..3u64 {
                let mut group = track.create_group(g).unwrap();
                for i in 0..10u64 {
                    let ts = (g * 10 + i) * 33_333;
                    group.write_frame(ts, &payload(g, i)).await.unwrap();
                }
                group.finish().unwrap();
                loop {
                    let mut read = sub.next_group().await.unwrap().expect("a group");
                    while read.read_frame().await.unwrap().is_some() {}
                    if read.sequence() >= g {
                        break;
                    }
                }
            }
            let (fetcher, runner) = skiff_monoio::connect(&url, config()).unwrap();
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
            drop(sub);
            viewer.close().await;
            drop(track);
            drop(broadcast);
            publisher.close().await;
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
