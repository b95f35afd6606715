//! An SDK publisher and an SDK viewer streaming one track (`video` of the
//! broadcast `camera`) through a relay, shared by the tests that check every
//! frame arrives intact, in order and with its timestamp: the publisher
//! writes numbered frames in groups, and the viewer checks each frame as it
//! reads it and returns the indices it read.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use skiff_core::model::track::Info;
use skiff_monoio::sdk::{BroadcastProducer, GroupProducer, Request, TrackProducer};
use skiff_monoio::{Client, Config, connect};

/// How long the publisher waits for a subscription to reach its track.
const SUBSCRIBER_WAIT: Duration = Duration::from_secs(20);

/// Frame `i`'s payload: `len` bytes of the pattern `k * step + i` (byte
/// `k`, truncated), then its first eight bytes replaced by `i`
/// (little-endian).
pub fn pattern(i: u64, step: u64, len: usize) -> Vec<u8> {
    let mut p: Vec<u8> = (0..len as u64).map(|k| (k * step + i) as u8).collect();
    p[..8].copy_from_slice(&i.to_le_bytes());
    p
}

/// Frame `i`'s payload in [`PACED`]: 1200 bytes of a pattern, except that
/// every seventh frame is 300 KiB, more than one stream window.
pub fn windowed_payload(i: u64) -> Vec<u8> {
    let len = if i % 7 == 3 { 300 * 1024 } else { 1200 };
    pattern(i, 31, len)
}

/// Ten frames a group, frame `i` stamped `i * 1000` and its timestamp
/// checked, the viewer's `max_latency` 10 s; the publisher writes without
/// pause but starts a group only once the viewer has the one before, so no
/// group is left behind by the live edge (a relay's upstream subscription
/// wants the newest group).
pub const PACED: Stream = Stream {
    payload: windowed_payload,
    tick: 1000,
    check_timestamps: true,
    max_latency_secs: 10,
    per_group: 10,
    frame_gap: Duration::ZERO,
    paced: true,
    failover_resets: false,
};

/// The frames of a stream and how they are written and read.
#[derive(Clone, Copy)]
pub struct Stream {
    /// Frame `i`'s payload; its first eight bytes are `i` (little-endian),
    /// which is how the viewer knows which frame it read.
    pub payload: fn(u64) -> Vec<u8>,
    /// Frame `i`'s timestamp is `i * tick`.
    pub tick: u64,
    /// Whether the viewer checks each frame's timestamp.
    pub check_timestamps: bool,
    /// The viewer's `max_latency`, in seconds.
    pub max_latency_secs: u64,
    /// Frames in a group.
    pub per_group: u64,
    /// The pause after each frame written (zero: none).
    pub frame_gap: Duration,
    /// Whether a group starts only once the viewer has read every frame
    /// before it: the viewer follows the live edge, and a newer group
    /// arriving first (after a stall) would make it leave an older one.
    pub paced: bool,
    /// Whether a group may be reset while the viewer reads it (its source
    /// died and the relay moved the track to another route): the viewer
    /// then goes on at the next group, as a player would, and the frames
    /// it missed show as a gap. Otherwise a reset fails the test.
    pub failover_resets: bool,
}

/// How long the viewer reads.
#[derive(Clone, Copy)]
pub enum Until {
    /// Until it has read this many frames or the track ends; a frame read
    /// that fails ends its group.
    Frames(u64),
    /// Until the track ends; a frame read that fails fails the test.
    TrackEnds,
}

impl Stream {
    /// Subscribes `viewer` and reads groups and frames until `until`,
    /// asserting each frame's payload (and timestamp, if checked) and
    /// counting it in `read`; returns the frame indices in the order read.
    pub async fn view(self, viewer: Client, until: Until, read: Arc<AtomicU64>) -> Vec<u64> {
        let request = Request {
            max_latency: skiff_core::time::Duration::from_secs(self.max_latency_secs),
            ..Request::LIVE
        };
        let mut track = viewer.subscribe("camera", "video", request).await.unwrap();
        let limit = match until {
            Until::Frames(n) => n,
            Until::TrackEnds => u64::MAX,
        };
        let mut seen = Vec::new();
        while (seen.len() as u64) < limit {
            let Some(mut group) = track.next_group().await.unwrap() else {
                break;
            };
            loop {
                let frame = match (group.read_frame().await, until) {
                    (Ok(Some(frame)), _) => frame,
                    (Ok(None), _) | (Err(_), Until::Frames(_)) => break,
                    (Err(_), Until::TrackEnds) if self.failover_resets => break,
                    (Err(e), Until::TrackEnds) => panic!("reading a frame: {e:?}"),
                };
                let bytes = frame.payload.to_vec();
                let i = u64::from_le_bytes(bytes[..8].try_into().unwrap());
                assert_eq!(bytes, (self.payload)(i), "frame {i} damaged");
                if self.check_timestamps {
                    assert_eq!(frame.timestamp, i * self.tick, "frame {i}'s timestamp");
                }
                seen.push(i);
                read.fetch_add(1, Ordering::SeqCst);
            }
        }
        seen
    }

    /// Publishes the track on `publisher` and waits until a subscription
    /// reaches it (failing the test after 20 s); the broadcast must be held
    /// as long as the track is written.
    pub async fn publish(&self, publisher: &Client) -> (BroadcastProducer, TrackProducer) {
        let broadcast = publisher.publish("camera").unwrap();
        let track = broadcast.create_track(Info::new("video").unwrap()).unwrap();
        let deadline = Instant::now() + SUBSCRIBER_WAIT;
        while track.subscribers() == 0 {
            assert!(
                Instant::now() < deadline,
                "no subscription reached the publisher"
            );
            monoio::time::sleep(Duration::from_millis(5)).await;
        }
        (broadcast, track)
    }

    /// Writes frame `i` into `group`.
    pub async fn write_frame(&self, group: &mut GroupProducer, i: u64) {
        group
            .write_frame(i * self.tick, &(self.payload)(i))
            .await
            .unwrap();
    }

    /// Writes group `g` with the frames from `first` on (once the viewer has
    /// read `first` frames, if paced); returns the index of the next frame.
    pub async fn write_group(
        &self,
        track: &mut TrackProducer,
        g: u64,
        first: u64,
        read: &AtomicU64,
    ) -> u64 {
        if self.paced {
            while read.load(Ordering::SeqCst) < first {
                monoio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        let mut group = track.create_group(g).unwrap();
        for i in first..first + self.per_group {
            self.write_frame(&mut group, i).await;
            if !self.frame_gap.is_zero() {
                monoio::time::sleep(self.frame_gap).await;
            }
        }
        group.finish().unwrap();
        first + self.per_group
    }

    /// Writes groups `0..groups`; returns how many frames were written.
    pub async fn write_groups(
        &self,
        track: &mut TrackProducer,
        groups: u64,
        read: &AtomicU64,
    ) -> u64 {
        let mut next = 0;
        for g in 0..groups {
            next = self.write_group(track, g, next, read).await;
        }
        next
    }

    /// A viewer on `viewer_url` (with `viewer_config`) and a publisher on
    /// `publisher_url` (with `publisher_config`): `subscribed` runs once a
    /// subscription reaches the publisher, which then writes groups
    /// `0..groups`. Returns the indices the viewer read, failing the test if
    /// it has not read every frame within 20 s of the last one written.
    pub async fn view_groups(
        self,
        (viewer_url, viewer_config): (String, Config),
        (publisher_url, publisher_config): (String, Config),
        groups: u64,
        subscribed: impl FnOnce(),
    ) -> Vec<u64> {
        let (viewer, runner) = connect(&viewer_url, viewer_config).unwrap();
        monoio::spawn(runner.run());
        let read = Arc::new(AtomicU64::new(0));
        let watching = monoio::spawn(self.view(
            viewer.clone(),
            Until::Frames(groups * self.per_group),
            read.clone(),
        ));
        let (publisher, runner) = connect(&publisher_url, publisher_config).unwrap();
        monoio::spawn(runner.run());
        let (_broadcast, mut track) = self.publish(&publisher).await;
        subscribed();
        self.write_groups(&mut track, groups, &read).await;
        let seen = monoio::time::timeout(Duration::from_secs(20), watching)
            .await
            .expect("the viewer got every frame in time");
        publisher.close().await;
        viewer.close().await;
        seen
    }

    /// A viewer on `viewer_url` and a publisher on `publisher_url` (both
    /// with `config`): the publisher writes groups until `stop` is set
    /// (after the group it is writing), then ends the track; the viewer
    /// reads to the track's end, counting frames in `seen`. Returns how
    /// many frames were published and the indices the viewer read, failing
    /// the test if the viewer does not see the end within `wait`.
    pub async fn until_stopped(
        self,
        viewer_url: String,
        publisher_url: String,
        config: Config,
        stop: Arc<AtomicBool>,
        seen: Arc<AtomicU64>,
        wait: Duration,
    ) -> (u64, Vec<u64>) {
        let (viewer, runner) = connect(&viewer_url, config.clone()).unwrap();
        monoio::spawn(runner.run());
        let watching = monoio::spawn({
            let seen = seen.clone();
            async move {
                let got = self.view(viewer.clone(), Until::TrackEnds, seen).await;
                viewer.close().await;
                got
            }
        });
        let (publisher, runner) = connect(&publisher_url, config).unwrap();
        monoio::spawn(runner.run());
        let (_broadcast, mut track) = self.publish(&publisher).await;
        let mut i = 0u64;
        for g in 0.. {
            i = self.write_group(&mut track, g, i, &seen).await;
            if stop.load(Ordering::SeqCst) {
                break;
            }
        }
        track.finish();
        publisher.flushed().await;
        let got = monoio::time::timeout(wait, watching)
            .await
            .expect("the viewer saw the track end");
        publisher.close().await;
        (i, got)
    }
}

/// [`PACED`] written without pacing, a frame every 10 ms, a reset group
/// skipped: a viewer that keeps watching while the cluster moves its track
/// to another route.
pub const FAILOVER: Stream = Stream {
    paced: false,
    frame_gap: Duration::from_millis(10),
    failover_resets: true,
    ..PACED
};

/// [`FAILOVER`] streaming on its own thread from `publisher_url` to
/// `viewer_url` (each with the default [`Config`]) until [`Self::stop`].
pub struct Running {
    stop: Arc<AtomicBool>,
    seen: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<(u64, Vec<u64>)>,
}

impl Running {
    /// Starts the stream; the viewer must see the track end within 30 s of
    /// the stop.
    pub fn start(viewer_url: String, publisher_url: String) -> Running {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(AtomicU64::new(0));
        let (stop2, seen2) = (stop.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            skiff_monoio::driver::block_on(skiff_monoio::driver::DriverKind::Legacy, move |_| {
                FAILOVER.until_stopped(
                    viewer_url,
                    publisher_url,
                    Config::default(),
                    stop2,
                    seen2,
                    Duration::from_secs(30),
                )
            })
            .expect("runtime")
        });
        Running { stop, seen, thread }
    }

    /// The frames the viewer has read so far.
    pub fn seen(&self) -> u64 {
        self.seen.load(Ordering::SeqCst)
    }

    /// Stops the publisher and returns how many frames it wrote and the
    /// indices the viewer read.
    pub fn stop(self) -> (u64, Vec<u64>) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap()
    }
}
