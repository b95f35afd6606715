//! skiff-embassy: publish moq-lite tracks from a microcontroller over embassy-net TCP.
//!
//! A publisher client: it dials a relay (moq-relay, or any moq-lite-05 server over
//! QMux on TCP), announces the broadcasts of an [`origin`],
//! answers the relay's subscriptions and sends groups within the relay's stream
//! credit, and redials with exponential backoff when the connection drops. The
//! protocol lives in `skiff-core`'s sans-IO [`Session`](skiff_core::session::Session);
//! this crate only moves bytes and time.
//!
//! # Memory
//!
//! Nothing here allocates. Every buffer and table of the publisher is in one
//! [`PublisherResources`], sized by const generics and provided by the caller (a
//! `static`, like embassy-net's `StackResources`); the media lives in the
//! application's own pool, tracks, broadcasts and origin. The runner's future holds
//! the session state itself (the QMux stream table, the event queue), about 4.5 KiB
//! on a Cortex-M. Measured on `thumbv7em-none-eabihf` (release): [`Resources`] is
//! 32.1 KiB of which 8 KiB are the socket buffers, [`SmallResources`] 18.1 KiB; with
//! the runner's future, the publisher takes 28.7 KiB (14.7 KiB with
//! `SmallResources`) besides the network stack's buffers.
//!
//! # Use
//!
//! ```ignore
//! // `StaticCell`, not `ConstStaticCell`: the resources are `!Send` (they hold
//! // handles on the `!Sync` media model).
//! static RESOURCES: StaticCell<skiff_embassy::Resources<'static, 'static>> = StaticCell::new();
//! let resources = RESOURCES.init_with(skiff_embassy::Resources::new);
//! let config = skiff_embassy::Config::new(relay, "/anon", HOP);
//! let (publisher, runner) = skiff_embassy::new(stack, config, resources, origin.handle());
//! spawner.spawn(publisher_task(runner))?; // loops on `runner.run().await`
//! // The application writes groups to its tracks, pacing each frame:
//! let mut group = track_producer.append_group()?;
//! publisher.paced(&group).await;
//! group.write_frame(timestamp, payload)?;
//! ```
//!
//! Both tasks must run on the same executor: the publisher's shared state and the
//! core's media model are `!Sync`.
//!
//! # Features
//!
//! * `defmt`: log through defmt (this crate, skiff-core and embassy-net).
//! * `log`: log through the `log` facade. Mutually exclusive with `defmt`.
#![no_std]

// Declared first: the logging macros are used by every module below.
#[macro_use]
mod fmt;

pub mod clock;
mod config;
mod error;
mod publisher;
mod resources;
mod runner;

pub use config::Config;
pub use error::Error;
pub use publisher::{PACED_TRACKS, Publisher, State};
pub use resources::{FULL_RECORD, PublisherResources, Resources, SmallResources};
pub use runner::Runner;

use embassy_net::Stack;
use skiff_core::model::origin;

/// Splits `resources` into the application's [`Publisher`] handle and the [`Runner`]
/// that connects to `config.relay` and serves `origin`; nothing is spawned (drive
/// [`Runner::run`] in a task).
#[allow(clippy::type_complexity)]
pub fn new<
    'd,
    'r,
    'a,
    'p,
    const STREAMS: usize,
    const CONTROL: usize,
    const BUF: usize,
    const CHUNKS: usize,
    const SERVE: usize,
    const OUT: usize,
    const RX: usize,
    const TX: usize,
    const SOCK_RX: usize,
    const SOCK_TX: usize,
>(
    stack: Stack<'d>,
    config: Config<'a>,
    resources: &'r mut PublisherResources<
        'a,
        'p,
        STREAMS,
        CONTROL,
        BUF,
        CHUNKS,
        SERVE,
        OUT,
        RX,
        TX,
        SOCK_RX,
        SOCK_TX,
    >,
    origin: origin::Ref<'a, 'p>,
) -> (Publisher<'r, 'a, 'p>, Runner<'d, 'r, 'a, 'p, STREAMS>) {
    let PublisherResources {
        storage,
        shared,
        rx,
        tx,
        socket_rx,
        socket_tx,
    } = resources;
    let shared: &'r _ = shared;
    let runner = Runner {
        stack,
        config,
        origin,
        shared,
        storage,
        rx,
        tx,
        socket_rx,
        socket_tx,
        backoff: config.backoff_min,
    };
    (Publisher { shared }, runner)
}
