//! The session tables of the relay's connections, by kind: a client's
//! session (its media tables taken at the peer's SETUP, by the role it
//! declares), a trunk between two workers, and a leaf's session to its
//! upstream.
//!
//! A client's session starts on a [`ServerStorage`] (control streams only)
//! and takes a [`PublisherSide`] and/or a [`SubscriberSide`] from the
//! worker's [`SidePools`] once its peer says what it does
//! ([`SideTables::attach`], called by the session driver through
//! [`SetupTables`]). Trunk and upstream sessions own larger fixed tables
//! ([`TrunkStorage`], [`UpstreamStorage`]).

use std::rc::Rc;

use skiff_core::session::{PublisherTables, Session, Storage, SubscriberTables};
use skiff_core::transport::Transport;
use skiff_core::wire::lite::Role;
use skiff_monoio::session_driver::{CLIENT_SUBSCRIPTIONS, SetupTables, StoragePool};

/// Stream slots of a client's session on the relay: the session driver's
/// [`MoqSession`](skiff_monoio::session_driver::MoqSession) size, a quarter
/// each advertised to the peer as its bidi and uni stream limits.
pub const STREAMS: usize = skiff_monoio::session_driver::STREAMS;

/// Stream slots of a trunk session: a link between two workers or a leaf's
/// session to its upstream, which carries every track crossing it (a
/// quarter each are advertised to the peer, as for [`STREAMS`]).
pub const TRUNK_STREAMS: usize = 512;

/// The tables of a trunk session: 256 control streams of 512-byte buffers
/// (a control message holds at most a 128-byte path and a 128-byte name),
/// 128 subscriptions each way, 128 group streams each way: 370 KiB, twice
/// a client's. Every worker has one per other worker, so it stays small.
pub type TrunkStorage = Storage<'static, 'static, 256, 512, 128, 128, 128, 128, 512>;

/// The tables of a leaf's session to its upstream: a trunk's, with 2 KiB
/// control buffers, since its SETUP carries the upstream URL's path and
/// query (an access token can be long). One per worker.
pub type UpstreamStorage = Storage<'static, 'static, 256, 2048, 128, 128, 128, 128, 512>;

/// A trunk session (see [`TRUNK_STREAMS`]).
pub type TrunkSession<'s> = Session<'s, 'static, 'static, TRUNK_STREAMS>;

/// The tables of a server's session before its peer's SETUP: the control
/// streams and buffers of the SDK's [`SessionStorage`](skiff_monoio::session_driver::SessionStorage), and no media table but the
/// slot of the peer's SETUP stream. [`SideTables`] adds the media tables the
/// peer's Role asks for, so a viewer holds none for media it never sends.
pub type ServerStorage = Storage<'static, 'static, 24, 1024, 0, 0, 0, 1, 8>;

/// The media a server's session sends: 16 subscriptions the peer holds and
/// 16 group streams out, as in the SDK's [`SessionStorage`](skiff_monoio::session_driver::SessionStorage).
pub type PublisherSide = PublisherTables<'static, 'static, 16, 16>;

/// The media a server's session receives: [`CLIENT_SUBSCRIPTIONS`]
/// subscriptions on the peer's tracks and 16 group streams in, as in the SDK's
/// [`SessionStorage`](skiff_monoio::session_driver::SessionStorage).
pub type SubscriberSide = SubscriberTables<'static, 'static, CLIENT_SUBSCRIPTIONS, 16>;

/// A thread's free lists of [`PublisherSide`] and [`SubscriberSide`] tables.
#[derive(Debug, Default)]
pub struct SidePools {
    publisher: StoragePool<PublisherSide>,
    subscriber: StoragePool<SubscriberSide>,
}

impl SidePools {
    /// Empty free lists.
    pub fn new() -> Self {
        Self::default()
    }
}

/// The media tables one server session takes at its peer's SETUP (see
/// [`ServerStorage`]); they go back to their pools when this is dropped,
/// which the session's borrow puts after the session.
pub struct SideTables {
    publisher: Option<Box<PublisherSide>>,
    subscriber: Option<Box<SubscriberSide>>,
    pools: Rc<SidePools>,
}

impl SideTables {
    /// No tables yet; they come from `pools`.
    pub fn new(pools: Rc<SidePools>) -> Self {
        SideTables {
            publisher: None,
            subscriber: None,
            pools,
        }
    }

    /// Gives `session` the tables a peer of `role` needs: a subscriber's
    /// session sends media only, a publisher's receives only, and one that
    /// does both gets both (docs/protocol.md §4.1).
    pub fn attach<'s, const N: usize, X: Transport>(
        &'s mut self,
        session: &mut Session<'s, 'static, 'static, N, X>,
        role: Role,
    ) {
        let SideTables {
            publisher,
            subscriber,
            pools,
        } = self;
        // A session built on a bare storage uses no entry yet, so the
        // tables always take what it holds.
        if role != Role::Publisher {
            let tables = publisher.insert(pools.publisher.take());
            if session.attach_publisher_tables(tables).is_err() {
                tracing::warn!("publisher tables smaller than the session's own");
            }
        }
        if role != Role::Subscriber {
            let tables = subscriber.insert(pools.subscriber.take());
            if session.attach_subscriber_tables(tables).is_err() {
                tracing::warn!("subscriber tables smaller than the session's own");
            }
        }
    }
}

impl std::fmt::Debug for SideTables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SideTables")
            .field("publisher", &self.publisher.is_some())
            .field("subscriber", &self.subscriber.is_some())
            .finish()
    }
}

impl Drop for SideTables {
    fn drop(&mut self) {
        if let Some(t) = self.publisher.take() {
            self.pools.publisher.give(t);
        }
        if let Some(t) = self.subscriber.take() {
            self.pools.subscriber.give(t);
        }
    }
}

impl<'s, const N: usize> SetupTables<'s, N> for &'s mut SideTables {
    fn attach<X: Transport>(self, session: &mut Session<'s, 'static, 'static, N, X>, role: Role) {
        SideTables::attach(self, session, role);
    }
}
