//! The application's side of the backend: [`Publisher`], a handle on the state the
//! [`Runner`](crate::Runner) shares (connection status, subscribers, pacing turns).
//!
//! The runner owns the session; the application owns its media (an origin, its
//! broadcasts and tracks over a pool). They meet only here, through `Cell`s in the
//! caller's [`PublisherResources`](crate::PublisherResources), so both must run on the
//! same executor (everything involved is `!Sync`, as the core's pool is).
//!
//! # Pacing
//!
//! The session sends a group only within the relay's stream credit and reports,
//! per group, how far its producer may run ahead of what was sent: it keeps
//! that window in the group itself
//! ([`group::Consumer::pace`](skiff_core::model::group::Consumer::pace)), and the
//! producer waits on it
//! ([`group::Producer::poll_paced`](skiff_core::model::group::Producer::poll_paced)).
//! The application waits with [`Publisher::paced`] before each write. Asking
//! registers the group (by track, one group per track at a time,
//! [`PACED_TRACKS`] tracks): right after a group is registered, the first answer
//! waits for one turn of the runner, so the session can open the group's stream
//! and report its window before the producer writes. A group the session is not
//! sending (no subscriber, a group nobody asked for, or between sessions) is not
//! paced: [`Publisher::paced`] is ready at once and the track's cache and the
//! pool bound what it holds.

use core::cell::Cell;
use core::future::poll_fn;
use core::task::{Context, Poll};

use skiff_core::model::track::{self, Wakers};

use crate::error::Error;

/// How many tracks can be paced at once through one [`Publisher`]; a group of a
/// further track is not paced (see the module docs).
pub const PACED_TRACKS: usize = 4;

/// Where the runner is in its connect / session / backoff cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum State {
    /// The runner has not started yet.
    Idle,
    /// Waiting for the network configuration, or dialing the relay.
    Connecting,
    /// TCP is up; QMux parameters and SETUP are being exchanged.
    Handshake,
    /// The relay's SETUP arrived: it may subscribe to our tracks now.
    Ready,
    /// Between connections: the last one ended (see [`Publisher::last_error`]) and
    /// the runner waits before the next attempt.
    Backoff,
}

/// A registration of one group's pacing, keyed by its track.
pub(crate) struct PaceSlot<'a, 'p> {
    pub(crate) track: Cell<Option<track::Ref<'a, 'p>>>,
    pub(crate) sequence: Cell<u64>,
    /// True once the runner passed after (track, sequence) was registered in
    /// the current session.
    pub(crate) fresh: Cell<bool>,
    pub(crate) wakers: Wakers<1>,
}

impl PaceSlot<'_, '_> {
    const fn new() -> Self {
        PaceSlot {
            track: Cell::new(None),
            sequence: Cell::new(0),
            fresh: Cell::new(false),
            wakers: Wakers::new(),
        }
    }
}

/// State shared by the [`Runner`](crate::Runner) and its [`Publisher`] handles.
pub(crate) struct Shared<'a, 'p> {
    state: Cell<State>,
    /// A session is live: pacing verdicts come from the runner.
    in_session: Cell<bool>,
    attempts: Cell<u32>,
    sessions: Cell<u32>,
    subscribers: Cell<usize>,
    last_error: Cell<Option<Error>>,
    /// Application tasks waiting for a status change.
    status_wakers: Wakers<4>,
    /// The runner, waiting for I/O: woken when a pacing registration changes.
    pub(crate) runner_wakers: Wakers<1>,
    pub(crate) pace: [PaceSlot<'a, 'p>; PACED_TRACKS],
}

impl<'a, 'p> Shared<'a, 'p> {
    pub(crate) const fn new() -> Self {
        Shared {
            state: Cell::new(State::Idle),
            in_session: Cell::new(false),
            attempts: Cell::new(0),
            sessions: Cell::new(0),
            subscribers: Cell::new(0),
            last_error: Cell::new(None),
            status_wakers: Wakers::new(),
            runner_wakers: Wakers::new(),
            pace: [const { PaceSlot::new() }; PACED_TRACKS],
        }
    }

    pub(crate) fn set_state(&self, state: State) {
        if self.state.replace(state) != state {
            self.status_wakers.wake();
        }
    }

    pub(crate) fn count_attempt(&self) {
        self.attempts.set(self.attempts.get().saturating_add(1));
        self.status_wakers.wake();
    }

    pub(crate) fn set_ready(&self) {
        self.sessions.set(self.sessions.get().saturating_add(1));
        self.set_state(State::Ready);
        self.status_wakers.wake();
    }

    pub(crate) fn set_subscribers(&self, n: usize) {
        if self.subscribers.replace(n) != n {
            self.status_wakers.wake();
        }
    }

    pub(crate) fn set_error(&self, error: Option<Error>) {
        self.last_error.set(error);
        self.status_wakers.wake();
    }

    /// A session starts (`true`) or ends (`false`): pacing turns are void either way.
    pub(crate) fn set_in_session(&self, live: bool) {
        self.in_session.set(live);
        if !live {
            self.set_subscribers(0);
        }
        for slot in &self.pace {
            slot.fresh.set(false);
            slot.wakers.wake();
        }
    }

    /// The slot pacing `track`, moved to group `sequence`; claims a free slot (or one
    /// whose track is over) if the track has none. `None` if every slot is taken.
    fn slot(&self, track: &track::Ref<'a, 'p>, sequence: u64) -> Option<&PaceSlot<'a, 'p>> {
        let found = self
            .pace
            .iter()
            .find(|s| s.track.get().is_some_and(|t| t.same_track(track)));
        let slot = match found {
            Some(slot) => slot,
            None => {
                let free = self.pace.iter().find(|s| {
                    s.track
                        .get()
                        .is_none_or(|t| t.status() != track::Status::Open)
                })?;
                free.track.set(Some(*track));
                free.fresh.set(false);
                free.sequence.set(sequence);
                self.runner_wakers.wake();
                free
            }
        };
        if slot.sequence.replace(sequence) != sequence {
            slot.fresh.set(false);
            self.runner_wakers.wake();
        }
        Some(slot)
    }
}

/// The application's handle on a running publisher: status, subscribers and pacing.
///
/// `Copy`; every copy sees the same state. The media itself is published through the
/// core model (origin, broadcast, track) the [`Runner`](crate::Runner) was given.
#[derive(Clone, Copy)]
pub struct Publisher<'r, 'a, 'p> {
    pub(crate) shared: &'r Shared<'a, 'p>,
}

impl<'r, 'a, 'p> Publisher<'r, 'a, 'p> {
    /// Where the runner is now.
    pub fn state(&self) -> State {
        self.shared.state.get()
    }

    /// True while a session is up and the relay's SETUP arrived.
    pub fn is_ready(&self) -> bool {
        self.state() == State::Ready
    }

    /// TCP connects attempted so far.
    pub fn attempts(&self) -> u32 {
        self.shared.attempts.get()
    }

    /// Sessions that reached the relay's SETUP so far (1 + the reconnects that worked).
    pub fn sessions(&self) -> u32 {
        self.shared.sessions.get()
    }

    /// Subscriptions the relay holds on our tracks right now (0 between sessions).
    pub fn subscribers(&self) -> usize {
        self.shared.subscribers.get()
    }

    /// Why the last connection ended, if one did.
    pub fn last_error(&self) -> Option<Error> {
        self.shared.last_error.get()
    }

    /// Waits until `f` holds for this handle (checked now and after every status change).
    pub async fn wait_for(&self, mut f: impl FnMut(&Self) -> bool) {
        poll_fn(|cx| {
            if f(self) {
                return Poll::Ready(());
            }
            self.shared.status_wakers.register(cx.waker());
            Poll::Pending
        })
        .await
    }

    /// Waits until a session is ready (the relay's SETUP arrived).
    pub async fn wait_ready(&self) {
        self.wait_for(Self::is_ready).await
    }

    /// Waits until the relay holds at least one subscription on our tracks.
    pub async fn wait_subscribed(&self) {
        self.wait_for(|p| p.subscribers() > 0).await
    }

    /// Ready when `group`'s producer may write (it is less than a window ahead of what
    /// the session sent, or the group is not being sent); otherwise registers the task
    /// with the runner or the group and returns `Pending`.
    ///
    /// Right after a group is registered or moved on, the first answer waits for
    /// one turn of the runner while a session is up.
    pub fn poll_paced(
        &self,
        cx: &mut Context<'_>,
        group: &track::GroupProducer<'a, 'p>,
    ) -> Poll<()> {
        let Some(slot) = self.shared.slot(&group.track(), group.sequence()) else {
            return Poll::Ready(());
        };
        if !self.shared.in_session.get() {
            return Poll::Ready(());
        }
        // Asks the group's readers to report their windows, from the next turn on.
        let paced = group.poll_paced(cx);
        if !slot.fresh.get() {
            slot.wakers.register(cx.waker());
            return Poll::Pending;
        }
        paced
    }

    /// Waits until `group`'s producer may write; see [`Publisher::poll_paced`].
    pub async fn paced(&self, group: &track::GroupProducer<'a, 'p>) {
        poll_fn(|cx| self.poll_paced(cx, group)).await
    }
}

impl core::fmt::Debug for Publisher<'_, '_, '_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Publisher")
            .field("state", &self.state())
            .field("attempts", &self.attempts())
            .field("sessions", &self.sessions())
            .field("subscribers", &self.subscribers())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use core::task::{Context, Poll, Waker};

    use skiff_core::model::track;
    use skiff_core::pool::{Pool, PoolStorage};

    use super::*;

    fn poll<'a, 'p>(p: &Publisher<'_, 'a, 'p>, g: &track::GroupProducer<'a, 'p>) -> Poll<()> {
        let mut cx = Context::from_waker(Waker::noop());
        p.poll_paced(&mut cx, g)
    }

    /// What the runner does after each exchange: marks every registered group's turn.
    fn runner_turn(shared: &Shared<'_, '_>) {
        for slot in &shared.pace {
            if slot.track.get().is_some() {
                slot.fresh.set(true);
            }
        }
    }

    // ---- pacing ----

    #[test]
    fn unpaced_without_a_session() {
        let mut ps = PoolStorage::<8, 64>::new();
        let pool = Pool::new(&mut ps);
        let t = track::State::<2>::new(&pool, track::Info::new("t").unwrap());
        let producer = t.producer().unwrap();
        let g = producer.append_group().unwrap();
        let shared = Shared::new();
        let p = Publisher { shared: &shared };
        assert_eq!(poll(&p, &g), Poll::Ready(()));
    }

    #[test]
    fn waits_for_the_runner_then_follows_the_window() {
        let mut ps = PoolStorage::<8, 64>::new();
        let pool = Pool::new(&mut ps);
        let t = track::State::<2>::new(&pool, track::Info::new("t").unwrap());
        let producer = t.producer().unwrap();
        let mut g = producer.append_group().unwrap();
        let shared = Shared::new();
        let p = Publisher { shared: &shared };
        shared.set_in_session(true);

        // Registered, the runner has not turned yet.
        assert_eq!(poll(&p, &g), Poll::Pending);
        // The session is not sending this group: write freely.
        runner_turn(&shared);
        assert_eq!(poll(&p, &g), Poll::Ready(()));
        // A stream reads it with 10 bytes of window (what the session reports):
        // one 12-byte frame (2 header bytes) uses it.
        let mut stream = g.state().consumer();
        stream.pace(10);
        assert_eq!(poll(&p, &g), Poll::Ready(()));
        g.write_frame(0, &[0; 10]).unwrap();
        assert_eq!(poll(&p, &g), Poll::Pending);
        // Credit arrives.
        stream.pace(100);
        assert_eq!(poll(&p, &g), Poll::Ready(()));

        // The next group of the track takes the same slot and waits for a turn.
        g.finish().unwrap();
        let g2 = producer.append_group().unwrap();
        assert_eq!(poll(&p, &g2), Poll::Pending);
        assert_eq!(
            shared
                .pace
                .iter()
                .filter(|s| s.track.get().is_some())
                .count(),
            1
        );
        runner_turn(&shared);
        let mut stream2 = g2.state().consumer();
        stream2.pace(0);
        assert_eq!(poll(&p, &g2), Poll::Pending);
        // The stream goes (say, with its session): the group is not paced.
        drop(stream2);
        assert_eq!(poll(&p, &g2), Poll::Ready(()));

        // The session ends: nothing is paced until the next one.
        shared.set_in_session(false);
        assert_eq!(poll(&p, &g2), Poll::Ready(()));
    }

    #[test]
    fn tracks_beyond_the_slots_are_unpaced_and_ended_tracks_free_theirs() {
        let mut ps = PoolStorage::<16, 64>::new();
        let pool = Pool::new(&mut ps);
        let tracks: std::vec::Vec<_> = (0..=PACED_TRACKS)
            .map(|_| track::State::<2>::new(&pool, track::Info::new("t").unwrap()))
            .collect();
        let mut producers: std::vec::Vec<_> =
            tracks.iter().map(|t| t.producer().unwrap()).collect();
        let groups: std::vec::Vec<_> = producers
            .iter()
            .map(|p| p.append_group().unwrap())
            .collect();
        let shared = Shared::new();
        let p = Publisher { shared: &shared };
        shared.set_in_session(true);
        for g in &groups[..PACED_TRACKS] {
            assert_eq!(poll(&p, g), Poll::Pending);
        }
        // No slot left: the last track is not paced.
        assert_eq!(poll(&p, &groups[PACED_TRACKS]), Poll::Ready(()));
        // A finished track's slot is taken over.
        assert!(producers[0].finish());
        assert_eq!(poll(&p, &groups[PACED_TRACKS]), Poll::Pending);
    }

    // ---- status ----

    #[test]
    fn status_counts_sessions_and_subscribers() {
        let shared = Shared::new();
        let p = Publisher { shared: &shared };
        assert_eq!(p.state(), State::Idle);
        shared.count_attempt();
        shared.set_state(State::Handshake);
        shared.set_ready();
        shared.set_subscribers(2);
        assert!(p.is_ready());
        assert_eq!((p.attempts(), p.sessions(), p.subscribers()), (1, 1, 2));
        shared.set_in_session(false);
        assert_eq!(p.subscribers(), 0);
        shared.set_error(Some(Error::ConnectionLost));
        assert_eq!(p.last_error(), Some(Error::ConnectionLost));
    }
}
