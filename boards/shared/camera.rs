//! The application: once DHCP has configured the stack, publish the board's camera as a
//! hang broadcast (docs/protocol.md §10) to a relay with the skiff publisher
//! (`skiff-embassy`), which moq-dev's player, a browser's included, plays.
//!
//! The broadcast (its name ends in `.hang`) holds two tracks: `catalog.json`, one group
//! kept open with the catalog, and [`TRACK`], H.264 of skiff-core's test card ([`CARD`]: a
//! moving pattern with the frame number drawn in), written without an encoder as I_PCM
//! pictures (docs/protocol.md §10.4): every [`CARD`] frame period one IDR picture, in a
//! group of its own, so a subscriber that joins late starts at the next frame. The
//! publisher dials the relay at [`RELAY_ADDR`]:[`RELAY_PORT`] and redials with backoff
//! whenever the connection drops; frames keep being produced meanwhile and the track's
//! ring and pool drop the oldest.
//!
//! This file is shared, byte for byte, by every real-board firmware under `boards/`.

use defmt::{info, unwrap, warn};
use embassy_executor::Spawner;
use embassy_net::{IpEndpoint, Ipv4Address, Stack};
use embassy_time::{Duration, Ticker, Timer};
use skiff_core::hang::{self, testcard::TestCard};
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
/// Name of the video track.
const TRACK: &str = "video";
/// The camera: a 96×64 test card at 15 fps, about 9.3 KiB per frame (1.1 Mbit/s).
const CARD: TestCard = match TestCard::new(96, 64, 15) {
    Ok(card) => card,
    Err(_) => panic!("96x64 at 15 fps is a valid test card"),
};
/// Bytes of the frame buffer: the largest frame [`CARD`] can write.
const FRAME_LEN: usize = CARD.max_frame_len();
/// Groups the video track keeps (the latest frames, for subscribers that join).
const TRACK_GROUPS: usize = 4;
/// Groups the catalog track keeps (it holds one, kept open).
const CATALOG_GROUPS: usize = 2;
/// The video track's cache budget: three frames, inside the pool, so older groups are
/// evicted before the pool runs dry.
const CACHE_BYTES: u64 = 30 * 1024;
/// Pool blocks and their size: 40 KiB of media, room for four frames and the catalog.
const POOL_BLOCKS: usize = 80;
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

    // The media: one broadcast with two tracks over a pool, all in statics.
    static POOL_STORAGE: StaticCell<PoolStorage<POOL_BLOCKS, POOL_BLOCK_SIZE>> = StaticCell::new();
    static POOL: StaticCell<Pool<'static>> = StaticCell::new();
    static TRACK_STATE: StaticCell<track::State<'static, TRACK_GROUPS>> = StaticCell::new();
    static CATALOG_STATE: StaticCell<track::State<'static, CATALOG_GROUPS>> = StaticCell::new();
    static BROADCAST_STATE: StaticCell<broadcast::State<'static, 'static, 2>> = StaticCell::new();
    static ORIGIN: StaticCell<origin::State<'static, 'static, 1, 2>> = StaticCell::new();
    static RESOURCES: StaticCell<Resources> = StaticCell::new();

    let pool: &'static Pool<'static> =
        POOL.init(Pool::new(POOL_STORAGE.init_with(PoolStorage::new)));
    let track_info = unwrap!(hang::video_info(TRACK).ok());
    let limits = track::Limits {
        group_bytes: CACHE_BYTES,
        cache_bytes: CACHE_BYTES,
    };
    let track: &'static _ =
        TRACK_STATE.init_with(|| track::State::with_limits(pool, track_info, limits));
    let catalog: &'static _ =
        CATALOG_STATE.init_with(|| track::State::new(pool, hang::catalog_info()));
    let path = unwrap!(Path::new(broadcast).ok());
    let bcast: &'static _ = BROADCAST_STATE.init(unwrap!(broadcast::State::new(path).ok()));
    let tracks = unwrap!(bcast.producer().ok());
    unwrap!(tracks.add(catalog.handle()).ok());
    unwrap!(tracks.add(track.handle()).ok());
    let origin: &'static _ = ORIGIN.init(origin::State::new());
    unwrap!(origin.handle().announce(bcast.handle()).ok());

    let relay = IpEndpoint::new(RELAY_ADDR.into(), RELAY_PORT);
    let config = Config::new(relay, RELAY_PATH, HOP);
    let (publisher, runner) = skiff_embassy::new(
        stack,
        config,
        RESOURCES.init_with(Resources::new),
        origin.handle(),
    );
    info!(
        "publishing {} (catalog.json, {}) to {}:{}",
        broadcast, TRACK, RELAY_ADDR, RELAY_PORT
    );
    spawner.spawn(unwrap!(publisher_task(runner)));

    // The catalog's only group stays open while the broadcast lasts, so a viewer that joins
    // later still finds it (docs/protocol.md §10.2).
    let catalog = unwrap!(catalog.producer().ok());
    let mut json = [0u8; hang::testcard::CATALOG_MAX_LEN];
    let len = unwrap!(CARD.catalog(TRACK, &mut json));
    let mut catalog_group = unwrap!(catalog.create_group(0));
    unwrap!(catalog_group.write_frame(0, &json[..len]));

    // `tracks`, `catalog` and `catalog_group` live as long as this never-ending task:
    // dropping them would finish the broadcast, the catalog track or its group.
    let producer = unwrap!(track.producer().ok());
    produce(publisher, producer).await
}

/// Writes picture `n` of [`CARD`] every frame period as group `n`, paced by the publisher
/// while a subscriber reads the track.
async fn produce(
    publisher: Publisher<'static, 'static, 'static>,
    producer: track::Producer<'static, 'static>,
) -> ! {
    static FRAME: StaticCell<[u8; FRAME_LEN]> = StaticCell::new();
    let buf = FRAME.init([0; FRAME_LEN]);
    let mut ticker = Ticker::every(Duration::from_hz(u64::from(CARD.fps())));
    let mut n: u32 = 0;
    loop {
        match producer.create_group(u64::from(n)) {
            Ok(mut group) => {
                let pts = CARD.pts_us(u64::from(n));
                let frame = unwrap!(CARD.frame(n, pts, buf));
                publisher.paced(&group).await;
                if let Err(e) = write(&mut group, pts, frame).await {
                    warn!("frame {}: {}", n, e);
                }
                // Finished, not dropped: a dropped producer would abort the group.
                if let Err(e) = group.finish() {
                    warn!("group end: {}", e);
                }
            }
            Err(e) => warn!("group {}: {}", n, e),
        }
        n = n.wrapping_add(1);
        ticker.next().await;
    }
}

/// Writes one frame, waiting out a full pool (the session is still sending older blocks)
/// for up to a frame period.
async fn write(
    group: &mut track::GroupProducer<'static, 'static>,
    timestamp: u64,
    frame: &[u8],
) -> Result<(), group::WriteError> {
    let mut tries = 0;
    loop {
        match group.write_frame(timestamp, frame) {
            Err(group::WriteError::PoolExhausted) if tries < 60 => {
                tries += 1;
                Timer::after_millis(1).await;
            }
            other => return other,
        }
    }
}
