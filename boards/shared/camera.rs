//! The application: once DHCP has configured the stack, publish a synthetic camera track
//! to a relay with the skiff publisher (`skiff-embassy`).
//!
//! One broadcast ([`BROADCAST`]) with one track ([`TRACK`]): every [`FRAME_INTERVAL`] a
//! [`WIDTH`]×[`HEIGHT`] 8-bit grayscale test pattern (a diagonal gradient with a bright
//! bar sweeping across it), one group per second ([`FRAMES_PER_GROUP`] frames), so a
//! subscriber that joins late starts at the next second. Timestamps are milliseconds
//! since boot (the track's default timescale). The publisher dials the relay at
//! [`RELAY_ADDR`]:[`RELAY_PORT`] and redials with backoff whenever the connection drops;
//! frames keep being produced meanwhile and the track's ring and pool drop the oldest.
//!
//! This file is shared, byte for byte, by every real-board firmware under `boards/`.

use defmt::{info, unwrap, warn};
use embassy_executor::Spawner;
use embassy_net::{IpEndpoint, Ipv4Address, Stack};
use embassy_time::{Duration, Instant, Ticker};
use skiff_core::model::path::Path;
use skiff_core::model::{broadcast, group, origin, track};
use skiff_core::pool::{Pool, PoolStorage};
use skiff_embassy::{Config, Publisher};
use static_cell::StaticCell;

/// The relay's address: a placeholder for the LAN this board is on (see boards/README.md).
pub const RELAY_ADDR: Ipv4Address = Ipv4Address::new(192, 168, 1, 10);
/// The relay's TCP port (moq-relay's QMux-over-TCP listener).
pub const RELAY_PORT: u16 = 4443;
/// The relay path the session is set up on (moq-relay's anonymous publish prefix).
const RELAY_PATH: &str = "/anon";
/// Hop identifier of this publisher, for the relay's loop detection.
const HOP: u64 = 0x5e1f_0b0a_4d00_0001;
/// Name of the track.
const TRACK: &str = "camera";
/// Frame width in pixels.
const WIDTH: usize = 32;
/// Frame height in pixels.
const HEIGHT: usize = 24;
/// Bytes per frame (8-bit grayscale).
const FRAME_LEN: usize = WIDTH * HEIGHT;
/// Time between frames: 10 frames per second.
const FRAME_INTERVAL: Duration = Duration::from_millis(100);
/// Frames per group: a group per second.
const FRAMES_PER_GROUP: u32 = 10;
/// Groups the track keeps (the latest ones, for subscribers that join).
const TRACK_GROUPS: usize = 4;
/// Pool blocks and their size: 24 KiB of media, room for two seconds of frames.
const POOL_BLOCKS: usize = 48;
/// See [`POOL_BLOCKS`].
const POOL_BLOCK_SIZE: usize = 512;

/// The publisher's memory (capacities: see `skiff_embassy::PublisherResources`).
pub type Resources = crate::PublisherResources;
/// The runner of [`Resources`].
type Runner = skiff_embassy::Runner<'static, 'static, 'static, 'static, 16>;

#[embassy_executor::task]
async fn publisher_task(mut runner: Runner) -> ! {
    runner.run().await
}

/// Waits for DHCP, sets up the broadcast `broadcast` and its track, spawns the publisher
/// and produces frames forever.
pub async fn run(spawner: Spawner, stack: Stack<'static>, broadcast: &'static str) -> ! {
    stack.wait_config_up().await;
    if let Some(cfg) = stack.config_v4() {
        info!("dhcp: address {}, gateway {}", cfg.address, cfg.gateway);
    }

    // The media: one broadcast with one track over a pool, all in statics.
    static POOL_STORAGE: StaticCell<PoolStorage<POOL_BLOCKS, POOL_BLOCK_SIZE>> = StaticCell::new();
    static POOL: StaticCell<Pool<'static>> = StaticCell::new();
    static TRACK_STATE: StaticCell<track::State<'static, TRACK_GROUPS>> = StaticCell::new();
    static BROADCAST_STATE: StaticCell<broadcast::State<'static, 'static, 1>> = StaticCell::new();
    static ORIGIN: StaticCell<origin::State<'static, 'static, 1, 2>> = StaticCell::new();
    static RESOURCES: StaticCell<Resources> = StaticCell::new();

    let pool: &'static Pool<'static> = POOL.init(Pool::new(POOL_STORAGE.init(PoolStorage::new())));
    let track_info = unwrap!(track::Info::new(TRACK).ok()).with_priority(1);
    let track: &'static _ = TRACK_STATE.init(track::State::new(pool, track_info));
    let path = unwrap!(Path::new(broadcast).ok());
    let bcast: &'static _ = BROADCAST_STATE.init(unwrap!(broadcast::State::new(path).ok()));
    unwrap!(unwrap!(bcast.producer().ok()).add(track.handle()).ok());
    let origin: &'static _ = ORIGIN.init(origin::State::new());
    unwrap!(origin.handle().announce(bcast.handle()).ok());

    let relay = IpEndpoint::new(RELAY_ADDR.into(), RELAY_PORT);
    let config = Config::new(relay, RELAY_PATH, HOP);
    let (publisher, runner) = skiff_embassy::new(
        stack,
        config,
        RESOURCES.init(Resources::new()),
        origin.handle(),
    );
    info!(
        "publishing {}/{} to {}:{}",
        broadcast, TRACK, RELAY_ADDR, RELAY_PORT
    );
    spawner.spawn(unwrap!(publisher_task(runner)));

    produce(publisher, track.handle()).await
}

/// Writes a frame every [`FRAME_INTERVAL`], a new group every [`FRAMES_PER_GROUP`]
/// frames, paced by the publisher while a subscriber reads the track.
async fn produce(
    publisher: Publisher<'static, 'static, 'static>,
    track: track::Ref<'static, 'static>,
) -> ! {
    let producer = unwrap!(track.producer().ok());
    let mut frame = [0u8; FRAME_LEN];
    let mut ticker = Ticker::every(FRAME_INTERVAL);
    let mut n: u32 = 0;
    loop {
        let mut group = match producer.append_group() {
            Ok(group) => group,
            Err(e) => {
                warn!("new group: {}", e);
                ticker.next().await;
                continue;
            }
        };
        for _ in 0..FRAMES_PER_GROUP {
            ticker.next().await;
            draw(&mut frame, n);
            n = n.wrapping_add(1);
            publisher.paced(&group).await;
            match group.write_frame(Instant::now().as_millis(), &frame) {
                Ok(()) => {}
                // No room right now (nobody drained the track yet): drop this frame.
                Err(group::WriteError::PoolExhausted) => warn!("pool full, frame dropped"),
                Err(e) => {
                    warn!("frame: {}", e);
                    break;
                }
            }
        }
        if let Err(e) = group.finish() {
            warn!("group end: {}", e);
        }
    }
}

/// Frame `n` of the test pattern: a diagonal gradient scrolling by one pixel per frame,
/// with a white vertical bar sweeping left to right.
fn draw(frame: &mut [u8; FRAME_LEN], n: u32) {
    let bar = (n as usize) % WIDTH;
    for (y, row) in frame.chunks_exact_mut(WIDTH).enumerate() {
        for (x, px) in row.iter_mut().enumerate() {
            *px = if x == bar {
                0xff
            } else {
                (((x + y + n as usize) % 64) * 3) as u8
            };
        }
    }
}
