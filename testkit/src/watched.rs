//! A hang video track published through a relay with one live viewer kept
//! on it, both skiff SDK clients: the viewer's subscription keeps the track
//! at the relay, which caches its groups (what fetch tests read back).

use std::time::Duration;

use skiff_monoio::sdk::{BroadcastProducer, Request, TrackConsumer, TrackProducer};
use skiff_monoio::{Client, Config, connect};

/// The publisher, its track, and the viewer subscribed to it.
pub struct Watched {
    /// The publishing client.
    pub publisher: Client,
    /// The published broadcast.
    pub broadcast: BroadcastProducer,
    /// Its video track.
    pub track: TrackProducer,
    /// The viewing client.
    pub viewer: Client,
    /// The viewer's subscription, wanting older groups for hang's max age.
    pub sub: TrackConsumer,
}

impl Watched {
    /// Publishes hang video track `track` of `broadcast` through the relay at
    /// `url` and subscribes a viewer to it; returns once the relay forwarded
    /// the subscription to the publisher.
    ///
    /// # Panics
    /// If a client cannot connect, publish or subscribe.
    pub async fn video(url: &str, broadcast: &str, track: &str) -> Watched {
        let (publisher, runner) = connect(url, Config::default()).unwrap();
        monoio::spawn(runner.run());
        let producer = publisher.publish(broadcast).unwrap();
        let video = skiff_core::hang::video_info(track).unwrap();
        let published = producer.create_track(video).unwrap();
        let (viewer, runner) = connect(url, Config::default()).unwrap();
        monoio::spawn(runner.run());
        let request = Request {
            max_latency: skiff_core::hang::MAX_AGE,
            ..Request::LIVE
        };
        let sub = viewer.subscribe(broadcast, track, request).await.unwrap();
        while published.subscribers() == 0 {
            monoio::time::sleep(Duration::from_millis(5)).await;
        }
        Watched {
            publisher,
            broadcast: producer,
            track: published,
            viewer,
            sub,
        }
    }

    /// Writes group `sequence` with `frames` (timestamp, payload) and
    /// finishes it, then reads through the viewer up to it: the relay then
    /// holds it whole.
    ///
    /// # Panics
    /// If writing or reading fails.
    pub async fn write_read(
        &mut self,
        sequence: u64,
        frames: impl IntoIterator<Item = (u64, Vec<u8>)>,
    ) {
        let mut group = self.track.create_group(sequence).unwrap();
        for (ts, payload) in frames {
            group.write_frame(ts, &payload).await.unwrap();
        }
        group.finish().unwrap();
        loop {
            let mut read = self.sub.next_group().await.unwrap().expect("a group");
            while read.read_frame().await.unwrap().is_some() {}
            if read.sequence() >= sequence {
                return;
            }
        }
    }

    /// Unsubscribes and closes both clients.
    pub async fn close(self) {
        drop(self.sub);
        self.viewer.close().await;
        drop(self.track);
        drop(self.broadcast);
        self.publisher.close().await;
    }
}
