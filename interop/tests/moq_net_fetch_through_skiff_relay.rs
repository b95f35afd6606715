//! moq-net 0.3.18's FETCH (docs/protocol.md §3.10) through `skiff-relay`: a
//! skiff SDK publisher writes three groups in hang's microsecond timescale
//! while a skiff viewer keeps the track at the relay, then a moq-net client
//! dials the relay and fetches group 1 with `track::Consumer::fetch_group`
//! (moq-net sends TRACK, then FETCH): every payload and timestamp is what
//! was published, and a group the relay does not hold is not found.

mod moq_net_live;

use std::num::NonZeroUsize;
use std::sync::mpsc;
use std::time::Duration;

use moq_net_live::{Dial, WAIT};
use skiff_monoio::driver::{self, DriverKind};
use skiff_relay::config::RelayConfig;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;
use skiff_testkit::watched::Watched;

const BROADCAST: &str = "camera";
const TRACK: &str = "video";
const PATH: &str = "/anon";

/// The payload of frame `i` of group `g`.
fn payload(g: u64, i: u64) -> Vec<u8> {
    let mut p = format!("group {g} frame {i} ").into_bytes();
    p.resize(
        200 + usize::try_from((g * 131 + i * 37) % 700).unwrap(),
        b'a' + u8::try_from(g).unwrap(),
    );
    p
}

/// The timestamp (µs) of frame `i` of group `g`.
fn timestamp(g: u64, i: u64) -> u64 {
    (g * 10 + i) * 33_333
}

/// Publishes three groups with a skiff viewer reading them (so the relay
/// holds them whole), then waits on `done` before leaving.
fn spawn_skiff_side(
    url: String,
    ready: mpsc::Sender<()>,
    done: mpsc::Receiver<()>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        driver::block_on(DriverKind::Legacy, move |_| async move {
            let mut watched = Watched::video(&url, BROADCAST, TRACK).await;
            for g in 0..3u64 {
                let frames = (0..10u64).map(|i| (timestamp(g, i), payload(g, i)));
                watched.write_read(g, frames).await;
            }
            ready.send(()).unwrap();
            while done.try_recv().is_err() {
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
            watched.close().await;
        })
        .expect("runtime");
    })
}

/// Fetches `group` of the track with a moq-net client: its frames as
/// (µs timestamp, payload), or the error's text.
async fn moq_net_fetch(
    dial: &Dial,
    groups: &[u64],
) -> Result<Vec<Result<Vec<(u64, Vec<u8>)>, String>>, String> {
    let hop = moq_net::Hop::new(dial.hop).map_err(|e| format!("hop: {e}"))?;
    let origin = moq_tokio::origin::spawn_config(moq_net::origin::Config::new(hop));
    let session = moq_net_live::connect(dial, |c| c.with_subscriber(origin.clone())).await?;
    let consumer = origin.consume();
    let broadcast = tokio::time::timeout(WAIT, consumer.routed_broadcast(BROADCAST))
        .await
        .map_err(|_| "no route to the broadcast".to_owned())?
        .map_err(|e| format!("broadcast: {e}"))?;
    let track = broadcast.track(TRACK).map_err(|e| format!("track: {e}"))?;
    let mut out = Vec::new();
    for &g in groups {
        let fetched = tokio::time::timeout(WAIT, track.fetch_group(g, None))
            .await
            .map_err(|_| format!("fetch of group {g} timed out"))?;
        let mut group = match fetched {
            Ok(group) => group,
            Err(e) => {
                out.push(Err(e.to_string()));
                continue;
            }
        };
        let timescale = group.timescale();
        let mut frames = Vec::new();
        while let Some(frame) = tokio::time::timeout(WAIT, group.read_frame())
            .await
            .map_err(|_| "read timed out".to_owned())?
            .map_err(|e| format!("read: {e}"))?
        {
            let ts = frame
                .timestamp
                .convert(timescale)
                .map_err(|_| "timestamp overflow".to_owned())?
                .value();
            frames.push((ts, frame.payload.to_vec()));
        }
        out.push(Ok(frames));
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), session.close()).await;
    Ok(out)
}

#[test]
fn moq_net_fetches_a_cached_group_through_skiff_relay() {
    let config = RelayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        threads: NonZeroUsize::new(1).unwrap(),
        driver: DriverKind::Legacy,
        drain_timeout: Duration::from_secs(2),
        ..RelayConfig::default()
    };
    let relay = server::start(config, RelayHandler::factory(1).unwrap()).expect("start relay");
    let addr = relay.local_addr();
    let (ready_tx, ready) = mpsc::channel();
    let (done, done_rx) = mpsc::channel();
    let skiff = spawn_skiff_side(format!("tcp://{addr}{PATH}"), ready_tx, done_rx);
    ready.recv_timeout(WAIT).expect("the skiff side published");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dial = Dial::tcp(addr, PATH, 0x3333);
    let fetched = rt
        .block_on(async { moq_net_fetch(&dial, &[1, 40]).await })
        .expect("moq-net client");
    done.send(()).unwrap();
    skiff.join().unwrap();
    relay.shutdown().unwrap();

    let want: Vec<(u64, Vec<u8>)> = (0..10).map(|i| (timestamp(1, i), payload(1, i))).collect();
    assert_eq!(fetched[0], Ok(want));
    let missing = fetched[1].as_ref().expect_err("group 40 is not held");
    assert!(missing.contains("not found"), "{missing}");
}
