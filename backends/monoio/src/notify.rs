//! A per-thread "local media changed" signal shared by every session task of
//! one thread: [`Notify`].
//!
//! # The wake path
//! A change of local media reaches the session tasks that care about it one
//! way: through the core's track wakers.
//! 1. A session task registers, on each track it serves and each track it
//!    fills, the waker `Notify::track_waker` gives for that track
//!    ([`track::Ref::wake_on_change`]); one waker per track state and
//!    thread, however many sessions serve the track.
//! 2. Whoever changes the track (an SDK producer, a session filling it, the
//!    relay's policy ending it) only writes through the core model; the
//!    track's next change (group, frame, bytes, end, eviction, TRACK_INFO)
//!    wakes that waker, which bumps the track here ([`Notify::bump_tracks`]).
//!    Nobody bumps a media change by hand.
//! 3. Bumps are coalesced: a bump only marks the tracks and schedules the
//!    flusher task ([`Notify::shared`]); when the runtime gets to it (after
//!    the tasks that were ready already), it wakes once every task following
//!    one of the marked tracks. So a hundred sessions making progress in one
//!    scheduling round cost one round of wake-ups, not a hundred (which made
//!    fan-out quadratic): waking the followers at once on every bump costs
//!    8 % more instructions per delivery at 30 viewers and 26 % more at 100
//!    (`benches/callgrind-relay.sh`, at `69696b1`; see
//!    `benches/results/2026-12-05-wake-coalescing.md`).
//!
//! # What the track wakers do not carry
//! A few changes concern other tasks without changing any track's media, so
//! no track waker fires for them; whoever makes them bumps here:
//! - consumption: a reader that took bytes of a track frees credit and
//!   pacing room for the track's filler ([`Notify::bump_consumed_tracks`]:
//!   a session after its pass, from its listed `Consumed` changes; an SDK
//!   consumer after reading), and blocks given back to the pool free room
//!   for every producer waiting on it ([`Notify::bump_consumed`]: the relay
//!   when lent blocks come back);
//! - demand: a subscription served from a track started, changed or ended,
//!   which its filler follows upstream (the session's listed `Demand`
//!   changes, bumped as the track's consumption, which the filler follows
//!   and the other sessions serving the track do not: a viewer joining a
//!   track with n viewers wakes one task, not n);
//! - tables and routes: a broadcast announced or withdrawn, a track added,
//!   a request queued for a session, a timer of the relay's policy, a
//!   session's end ([`Notify::bump`]: every task looks again).
//!
//! # Who is woken
//! A session's task follows the media of the tracks it serves and both the
//! media and the consumption of the tracks it fills
//! ([`Waiter::register_session`]); a task that only read a track it serves is
//! not concerned by other readers of it, so after a fan-out round the
//! senders' bumps wake the producers, not every sender again. It keeps its
//! place registered while it runs: a change that concerned it meanwhile is
//! kept for its next wait ([`Waiter::take_concerned`]). Up to `TRACK_KEYS`
//! tracks per task and `PENDING_KEYS` per flush; past that a task or a bump
//! counts as "every track". A bump that names no track ([`Notify::bump`],
//! [`Notify::bump_consumed`]) concerns every task, and a task registered
//! with [`Waiter::register`] is concerned by every bump.
//!
//! The tasks are indexed by the tracks they follow (a table from track key
//! to its followers, plus the list of tasks following every track), so a
//! flush naming k tracks visits the followers of those k and the tasks
//! following everything; only a change of every track walks every task.
//! The index is intrusive and keeps its room: once the thread's tasks and
//! tracks have been seen, bumps, flushes and registrations allocate nothing.
//!
//! [`track::Ref::wake_on_change`]: skiff_core::model::track::Ref::wake_on_change

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::poll_fn;
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::{Rc, Weak};
use std::task::{Poll, RawWaker, RawWakerVTable, Waker};

/// A track's identity, as bumps and waiters name it ([`track::Ref::key`]);
/// this module relies on it being `Copy + Eq + Hash` only.
///
/// [`track::Ref::key`]: skiff_core::model::track::Ref::key
pub type TrackKey = skiff_core::model::track::Key;

/// Tracks one waiting task can follow by key (more: it follows every change).
pub(crate) const TRACK_KEYS: usize = 4;

/// Tracks the media bumps waiting for one flush can name (more: the flush
/// wakes every media waiter).
pub(crate) const PENDING_KEYS: usize = 16;

/// The hash of the tables keyed by track: a key is a state's address (and
/// its generation), made by this process, not by a peer, so one multiply
/// spreads it well enough and costs a fraction of SipHash, on every pass.
type KeyHash = BuildHasherDefault<KeyHasher>;

/// See [`KeyHash`].
#[derive(Debug, Default, Clone, Copy)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

const _: () = assert!(TRACK_KEYS <= 8, "one mask bit per followed track");

/// Up to `K` distinct track keys.
#[derive(Debug, Clone, Copy)]
struct Keys<const K: usize> {
    /// The first `len` are `Some`.
    keys: [Option<TrackKey>; K],
    len: usize,
}

impl<const K: usize> Keys<K> {
    const EMPTY: Self = Keys {
        keys: [None; K],
        len: 0,
    };

    /// Adds `key` (once); false if it did not fit.
    fn add(&mut self, key: TrackKey) -> bool {
        if self.contains(key) {
            return true;
        }
        match self.keys.get_mut(self.len) {
            Some(place) => {
                *place = Some(key);
                self.len += 1;
                true
            }
            None => false,
        }
    }

    fn contains(&self, key: TrackKey) -> bool {
        self.iter().any(|k| k == key)
    }

    fn iter(&self) -> impl Iterator<Item = TrackKey> + '_ {
        self.keys.iter().flatten().copied()
    }
}

/// One task's place: its waker, which tracks it follows (`None`: all), and
/// which of them concern it by their consumption too, not by media only.
#[derive(Debug)]
struct Place {
    waker: Option<Waker>,
    /// Following every track: for media changes only.
    media_only: bool,
    follows: Option<Keys<TRACK_KEYS>>,
    /// Bit `i`: the `i`-th followed track concerns it by consumption too.
    consumed: u8,
    /// A flush concerned it since [`Waiter::take_concerned`] last looked.
    concerned: bool,
    /// In the index's lists by `follows` (a place not registered yet is in none).
    listed: bool,
}

impl Place {
    const FREE: Self = Place {
        waker: None,
        media_only: false,
        follows: None,
        consumed: 0,
        concerned: false,
        listed: false,
    };
}

/// No link: the end of a list, or an empty one.
const NIL: usize = usize::MAX;

/// A place's entry in one list of the index: the neighbouring links.
#[derive(Debug, Clone, Copy)]
struct Link {
    prev: usize,
    next: usize,
}

impl Link {
    const NONE: Self = Link {
        prev: NIL,
        next: NIL,
    };
}

/// Puts `link` first in the list starting at `head`.
fn push_front(links: &mut [Link], head: &mut usize, link: usize) {
    links[link] = Link {
        prev: NIL,
        next: *head,
    };
    if let Some(old) = links.get_mut(*head) {
        old.prev = link;
    }
    *head = link;
}

/// Takes `link` out of the list starting at `head`.
fn unlink(links: &mut [Link], head: &mut usize, link: usize) {
    let Link { prev, next } = links[link];
    match links.get_mut(prev) {
        Some(p) => p.next = next,
        None => *head = next,
    }
    if let Some(n) = links.get_mut(next) {
        n.prev = prev;
    }
    links[link] = Link::NONE;
}

/// The registered tasks, indexed by the tracks they follow: a flush naming
/// tracks visits their followers and the tasks following every track, not
/// every task of the thread. A track's consumption has an index of its own,
/// of the few tasks it concerns (the track's filler): a viewer reading a
/// track with thousands of viewers visits its filler, not them.
///
/// The lists are intrusive: place `slot` owns links `slot * TRACK_KEYS ..`
/// in each index, the `i`-th for its `i`-th followed track (the first also
/// for the follow-everything list), so following and unfollowing take no
/// allocation once the places and the tables have grown to the thread's
/// needs.
#[derive(Debug)]
struct Places {
    places: Vec<Place>,
    links: Vec<Link>,
    /// The first link of each followed track's list.
    followers: HashMap<TrackKey, usize, KeyHash>,
    /// The links of the consumption lists, as `links`.
    consumer_links: Vec<Link>,
    /// The first link of each track's list of the places its consumption
    /// concerns.
    consumers: HashMap<TrackKey, usize, KeyHash>,
    /// The first link of the list of places following every track.
    everything: usize,
    /// Places visited by flushes so far.
    #[cfg(test)]
    visits: usize,
}

impl Default for Places {
    fn default() -> Self {
        Places {
            places: Vec::new(),
            links: Vec::new(),
            followers: HashMap::default(),
            consumer_links: Vec::new(),
            consumers: HashMap::default(),
            everything: NIL,
            #[cfg(test)]
            visits: 0,
        }
    }
}

impl Places {
    /// A new place at the end.
    fn push(&mut self) -> usize {
        self.places.push(Place::FREE);
        self.links
            .extend(std::iter::repeat_n(Link::NONE, TRACK_KEYS));
        self.consumer_links
            .extend(std::iter::repeat_n(Link::NONE, TRACK_KEYS));
        self.places.len() - 1
    }

    /// Makes place `slot` follow `follows` (`None`: every track), the
    /// consumption of those whose bit is set in `consumed` too.
    fn follow(&mut self, slot: usize, follows: Option<Keys<TRACK_KEYS>>, consumed: u8) {
        let Some(place) = self.places.get(slot) else {
            return;
        };
        let same = match (&place.follows, &follows) {
            (None, None) => true,
            // The same keys in the same order: the consumption bits name
            // the same tracks.
            (Some(a), Some(b)) => a.iter().eq(b.iter()) && place.consumed == consumed,
            _ => false,
        };
        if place.listed && same {
            return;
        }
        self.unlist(slot);
        self.places[slot].follows = follows;
        self.places[slot].consumed = consumed;
        let first = slot * TRACK_KEYS;
        match follows {
            None => push_front(&mut self.links, &mut self.everything, first),
            Some(keys) => {
                for (i, key) in keys.iter().enumerate() {
                    let head = self.followers.entry(key).or_insert(NIL);
                    push_front(&mut self.links, head, first + i);
                    if consumed & (1 << i) != 0 {
                        let head = self.consumers.entry(key).or_insert(NIL);
                        push_front(&mut self.consumer_links, head, first + i);
                    }
                }
            }
        }
        self.places[slot].listed = true;
    }

    /// Takes place `slot` out of every list.
    fn unlist(&mut self, slot: usize) {
        let Some(place) = self.places.get_mut(slot) else {
            return;
        };
        if !std::mem::take(&mut place.listed) {
            return;
        }
        let first = slot * TRACK_KEYS;
        let consumed = place.consumed;
        match place.follows {
            None => unlink(&mut self.links, &mut self.everything, first),
            Some(keys) => {
                for (i, key) in keys.iter().enumerate() {
                    if let Some(head) = self.followers.get_mut(&key) {
                        unlink(&mut self.links, head, first + i);
                        if *head == NIL {
                            self.followers.remove(&key);
                        }
                    }
                    if consumed & (1 << i) != 0
                        && let Some(head) = self.consumers.get_mut(&key)
                    {
                        unlink(&mut self.consumer_links, head, first + i);
                        if *head == NIL {
                            self.consumers.remove(&key);
                        }
                    }
                }
            }
        }
    }

    /// Wakes every waiting task concerned by the media changes of `media`,
    /// or (unless it waits for media only) by the consumption of `consumed`.
    fn wake(&mut self, media: &Scope, consumed: &Scope) {
        if matches!(media, Scope::All) || matches!(consumed, Scope::All) {
            for slot in 0..self.places.len() {
                self.visit(slot, media, consumed);
            }
            return;
        }
        self.visit_list(self.everything, false, media, consumed);
        if let Scope::Tracks(keys) = media {
            for key in keys.iter() {
                if let Some(&head) = self.followers.get(&key) {
                    self.visit_list(head, false, media, consumed);
                }
            }
        }
        if let Scope::Tracks(keys) = consumed {
            for key in keys.iter() {
                if let Some(&head) = self.consumers.get(&key) {
                    self.visit_list(head, true, media, consumed);
                }
            }
        }
    }

    /// Visits the places of the list starting at `head`, in the
    /// consumption index if `consumers`.
    fn visit_list(&mut self, head: usize, consumers: bool, media: &Scope, consumed: &Scope) {
        let mut link = head;
        loop {
            let links = if consumers {
                &self.consumer_links
            } else {
                &self.links
            };
            let Some(l) = links.get(link) else {
                break;
            };
            let next = l.next;
            self.visit(link / TRACK_KEYS, media, consumed);
            link = next;
        }
    }

    /// Wakes the task of place `slot` if it waits and is concerned (a place
    /// visited twice in one flush is woken once: the first visit takes its
    /// waker).
    fn visit(&mut self, slot: usize, media: &Scope, consumed: &Scope) {
        #[cfg(test)]
        {
            self.visits += 1;
        }
        let Some(place) = self.places.get_mut(slot) else {
            return;
        };
        if place.waker.is_none() && place.concerned {
            return;
        }
        let concerned = match place.follows.as_ref() {
            None => media.concerns(None) || (!place.media_only && consumed.concerns(None)),
            Some(keys) => {
                media.concerns(Some(keys)) || consumed.concerns_masked(keys, place.consumed)
            }
        };
        if concerned {
            place.concerned = true;
            if let Some(w) = place.waker.take() {
                w.wake();
            }
        }
    }
}

/// Which tracks bumps waiting for a flush concern.
// Kept by value in a `Cell` and copied per bump: boxing the keys would
// allocate per bump.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Copy, Default)]
enum Scope {
    /// No bump of this kind waits.
    #[default]
    Nothing,
    /// Changes of these tracks (and of no other).
    Tracks(Keys<PENDING_KEYS>),
    /// Any change.
    All,
}

impl Scope {
    /// Adds changes of `keys` (`None`: of every track).
    fn add(&mut self, keys: Option<&mut dyn Iterator<Item = TrackKey>>) {
        let Some(keys) = keys else {
            *self = Scope::All;
            return;
        };
        let mut named = match *self {
            Scope::All => return,
            Scope::Tracks(k) => k,
            Scope::Nothing => Keys::EMPTY,
        };
        for k in keys {
            if !named.add(k) {
                // Too many tracks named: every one it is.
                *self = Scope::All;
                return;
            }
        }
        *self = Scope::Tracks(named);
    }

    /// Whether a task following `follows` is concerned through the tracks of
    /// bit mask `mask` only (bit `i`: the `i`-th followed track).
    fn concerns_masked(&self, follows: &Keys<TRACK_KEYS>, mask: u8) -> bool {
        match self {
            Scope::Nothing => false,
            Scope::All => mask != 0,
            Scope::Tracks(changed) => follows
                .iter()
                .enumerate()
                .any(|(i, k)| mask & (1 << i) != 0 && changed.contains(k)),
        }
    }

    /// Whether a task following `follows` (`None`: every track) is concerned.
    fn concerns(&self, follows: Option<&Keys<TRACK_KEYS>>) -> bool {
        match (self, follows) {
            (Scope::Nothing, _) => false,
            (Scope::Tracks(changed), Some(follows)) => follows.iter().any(|k| changed.contains(k)),
            _ => true,
        }
    }
}

/// The per-thread change signal (`!Send`; share it with `Rc`).
#[derive(Debug)]
pub struct Notify {
    /// Media bumps waiting for the flusher.
    pending_media: RefCell<Scope>,
    /// Consumption-only bumps waiting for the flusher.
    pending_consumed: RefCell<Scope>,
    /// The flusher task was spawned (on first bump) and its waker.
    flusher: Cell<bool>,
    flusher_waker: RefCell<Option<Waker>>,
    /// One place per registered task (no waker: free or not waiting).
    places: RefCell<Places>,
    free: RefCell<Vec<usize>>,
    /// One track waker per track state seen ([`Notify::track_waker`]), by
    /// state address: bounded by the thread's track tables.
    track_wakers: RefCell<HashMap<usize, Rc<TrackWake>, KeyHash>>,
}

/// A task's place in a [`Notify`] (returned to it on drop).
#[derive(Debug)]
pub struct Waiter<'n> {
    notify: &'n Notify,
    slot: usize,
}

impl Notify {
    /// A signal nobody waits on yet, without a flusher: a bump wakes at once.
    pub(crate) fn new() -> Self {
        Notify {
            pending_media: RefCell::new(Scope::Nothing),
            pending_consumed: RefCell::new(Scope::Nothing),
            flusher: Cell::new(false),
            flusher_waker: RefCell::new(None),
            places: RefCell::new(Places::default()),
            free: RefCell::new(Vec::new()),
            track_wakers: RefCell::new(HashMap::default()),
        }
    }

    /// Records a media change: every waiting task is woken once the runtime
    /// gets to the flusher (see the module docs). Must be called on a monoio
    /// runtime thread of an `Rc`-shared `Notify` created by [`Notify::shared`];
    /// a `Notify` without a flusher wakes at once.
    pub fn bump(&self) {
        self.mark(true, None);
    }

    /// Records a media change of these tracks only (keys from
    /// [`track::Ref::key`]): like [`Notify::bump`], but a task following
    /// other tracks only sleeps on (see the module docs).
    ///
    /// [`track::Ref::key`]: skiff_core::model::track::Ref::key
    pub fn bump_tracks(&self, keys: impl IntoIterator<Item = TrackKey>) {
        self.mark(true, Some(&mut keys.into_iter()));
    }

    /// Records that a task consumed media without changing any: only the
    /// tasks not waiting for media alone are woken (see [`Notify::bump`]).
    pub fn bump_consumed(&self) {
        self.mark(false, None);
    }

    /// Records that a task read these tracks and changed no media: like
    /// [`Notify::bump_consumed`], but a task following other tracks only
    /// sleeps on.
    pub fn bump_consumed_tracks(&self, keys: impl IntoIterator<Item = TrackKey>) {
        self.mark(false, Some(&mut keys.into_iter()));
    }

    /// Marks a change of either kind for the flusher (or wakes at once without one).
    fn mark(&self, media: bool, keys: Option<&mut dyn Iterator<Item = TrackKey>>) {
        let pending = if media {
            &self.pending_media
        } else {
            &self.pending_consumed
        };
        // In place: a scope is a few hundred bytes, copied on every bump otherwise.
        pending.borrow_mut().add(keys);
        if self.flusher.get() {
            self.wake_flusher();
        } else {
            self.flush_scopes(self.pending_media.take(), self.pending_consumed.take());
        }
    }

    fn wake_flusher(&self) {
        if let Some(w) = self.flusher_waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// A shared signal with its flusher task spawned on the current monoio runtime.
    pub fn shared() -> std::rc::Rc<Notify> {
        let n = std::rc::Rc::new(Notify::new());
        n.flusher.set(true);
        let weak = std::rc::Rc::downgrade(&n);
        monoio::spawn(async move {
            loop {
                let ready = poll_fn(|cx| {
                    let Some(n) = weak.upgrade() else {
                        return Poll::Ready(None);
                    };
                    let media = n.pending_media.take();
                    let consumed = n.pending_consumed.take();
                    if matches!((media, consumed), (Scope::Nothing, Scope::Nothing)) {
                        *n.flusher_waker.borrow_mut() = Some(cx.waker().clone());
                        return Poll::Pending;
                    }
                    Poll::Ready(Some((media, consumed)))
                })
                .await;
                match (weak.upgrade(), ready) {
                    (Some(n), Some((media, consumed))) => n.flush_scopes(media, consumed),
                    _ => return,
                }
            }
        });
        n
    }

    /// Wakes now every task concerned: by the
    /// media changes of `media`, or (unless it waits for media only) by the
    /// consumption of `consumed`.
    fn flush_scopes(&self, media: Scope, consumed: Scope) {
        // A woken waker may not re-enter (it only schedules).
        self.places.borrow_mut().wake(&media, &consumed);
    }

    /// The waker that bumps track `key` here when woken: register it on the
    /// track ([`track::Ref::wake_on_change`]) and the track's next change,
    /// whoever makes it, wakes the tasks following it (see the module docs).
    /// Every call for one track state returns a waker that wakes the same
    /// "task", so a track keeps one registration per thread however many
    /// sessions serve it.
    ///
    /// [`track::Ref::wake_on_change`]: skiff_core::model::track::Ref::wake_on_change
    pub(crate) fn track_waker(self: &Rc<Self>, key: TrackKey) -> Waker {
        let mut wakers = self.track_wakers.borrow_mut();
        let wake = wakers.entry(key.addr()).or_insert_with(|| {
            Rc::new(TrackWake {
                notify: Rc::downgrade(self),
                key: Cell::new(key),
            })
        });
        // A state reopened for another track: the waker names the new one.
        wake.key.set(key);
        TrackWake::waker(wake.clone())
    }

    /// A place to wait from (one per task).
    pub fn waiter(&self) -> Waiter<'_> {
        let slot = match self.free.borrow_mut().pop() {
            Some(s) => s,
            None => self.places.borrow_mut().push(),
        };
        Waiter { notify: self, slot }
    }
}

impl Waiter<'_> {
    /// Registers `waker` to be woken at the next bump of either kind.
    pub fn register(&self, waker: &Waker) {
        self.place(waker, false, None, 0);
    }

    /// Registers a session's task: the media of the tracks it serves and
    /// both the media and the consumption of the tracks it fills concern it
    /// (a session serving a track is not concerned by other readers of it).
    /// Past `TRACK_KEYS` tracks it follows every track, for media only if
    /// it fills none.
    pub fn register_session(
        &self,
        waker: &Waker,
        served: impl IntoIterator<Item = TrackKey>,
        filled: impl IntoIterator<Item = TrackKey>,
    ) {
        let mut keys = Keys::<TRACK_KEYS>::EMPTY;
        let mut consumed = 0u8;
        let mut fits = true;
        let mut fills = false;
        for key in served {
            fits &= keys.add(key);
        }
        for key in filled {
            fills = true;
            fits &= keys.add(key);
            if let Some(i) = keys.iter().position(|k| k == key) {
                consumed |= 1 << i;
            }
        }
        if fits {
            self.place(waker, false, Some(keys), consumed);
        } else {
            self.place(waker, !fills, None, 0);
        }
    }

    fn place(
        &self,
        waker: &Waker,
        media_only: bool,
        follows: Option<Keys<TRACK_KEYS>>,
        consumed: u8,
    ) {
        let mut places = self.notify.places.borrow_mut();
        places.follow(self.slot, follows, consumed);
        if let Some(place) = places.places.get_mut(self.slot) {
            place.media_only = media_only;
            match &place.waker {
                Some(old) if old.will_wake(waker) => {}
                _ => place.waker = Some(waker.clone()),
            }
        }
    }

    /// Registers `waker` again for what the place follows already (after a
    /// wake-up took it): no walk of the tracks.
    pub fn rearm(&self, waker: &Waker) {
        let mut places = self.notify.places.borrow_mut();
        if let Some(place) = places.places.get_mut(self.slot) {
            match &place.waker {
                Some(old) if old.will_wake(waker) => {}
                _ => place.waker = Some(waker.clone()),
            }
        }
    }

    /// Whether a flush concerned this place (by what it follows) since the
    /// last call: a task that keeps its registration while it runs learns
    /// here of the changes it was not waiting for then.
    pub fn take_concerned(&self) -> bool {
        let mut places = self.notify.places.borrow_mut();
        places
            .places
            .get_mut(self.slot)
            .is_some_and(|p| std::mem::take(&mut p.concerned))
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut places = self.notify.places.borrow_mut();
        places.unlist(self.slot);
        let old = places
            .places
            .get_mut(self.slot)
            .map(|place| std::mem::replace(place, Place::FREE));
        drop(places);
        // Dropped unborrowed: the last reference to a task may drop its
        // future, which may hold a waiter of its own.
        drop(old);
        self.notify.free.borrow_mut().push(self.slot);
    }
}

/// What a [`Notify::track_waker`] points at: the signal and the track it bumps.
#[derive(Debug)]
struct TrackWake {
    notify: Weak<Notify>,
    key: Cell<TrackKey>,
}

impl TrackWake {
    const VTABLE: RawWakerVTable = RawWakerVTable::new(
        Self::clone_raw,
        Self::wake_raw,
        Self::wake_by_ref_raw,
        Self::drop_raw,
    );

    /// A waker owning one strong count of `wake`.
    fn waker(wake: Rc<TrackWake>) -> Waker {
        let raw = RawWaker::new(Rc::into_raw(wake).cast::<()>(), &Self::VTABLE);
        // SAFETY: the vtable's functions treat the data pointer as the
        // `Rc<TrackWake>` given up here, one strong count per waker. A
        // `TrackWake` is `!Send`, and so is every place that holds its
        // wakers: the core's track wakers live in `Cell`s of a track state,
        // which is `!Sync` and used on its own thread only (every track
        // table is thread-local), so the waker is cloned, woken and dropped
        // on the thread that made it.
        unsafe { Waker::from_raw(raw) }
    }

    fn fire(&self) {
        if let Some(notify) = self.notify.upgrade() {
            notify.bump_tracks([self.key.get()]);
        }
    }

    unsafe fn clone_raw(data: *const ()) -> RawWaker {
        // SAFETY: `data` came from `Rc::into_raw` in `waker` and its count is
        // held by the waker being cloned (see `waker`).
        unsafe { Rc::increment_strong_count(data.cast::<TrackWake>()) };
        RawWaker::new(data, &Self::VTABLE)
    }

    unsafe fn wake_raw(data: *const ()) {
        // SAFETY: as in `clone_raw`; waking by value gives up the waker's count.
        let wake = unsafe { Rc::from_raw(data.cast::<TrackWake>()) };
        wake.fire();
    }

    unsafe fn wake_by_ref_raw(data: *const ()) {
        // SAFETY: as in `clone_raw`; the waker keeps its count.
        let wake = unsafe { &*data.cast::<TrackWake>() };
        wake.fire();
    }

    unsafe fn drop_raw(data: *const ()) {
        // SAFETY: as in `clone_raw`; dropping the waker gives up its count.
        drop(unsafe { Rc::from_raw(data.cast::<TrackWake>()) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(n: usize) -> TrackKey {
        TrackKey::from_parts(n, 0)
    }

    /// Follows both kinds of change of `keys`, as a session filling them.
    fn follow(w: &Waiter<'_>, waker: &Waker, keys: impl IntoIterator<Item = TrackKey>) {
        w.register_session(waker, std::iter::empty(), keys);
    }

    /// Follows the media of `keys` only, as a session serving them.
    fn follow_media(w: &Waiter<'_>, waker: &Waker, keys: impl IntoIterator<Item = TrackKey>) {
        w.register_session(waker, keys, std::iter::empty());
    }

    /// Follows the media of every track, as a session serving more tracks
    /// than a place names.
    fn follow_all_media(w: &Waiter<'_>, waker: &Waker) {
        follow_media(w, waker, (0..=TRACK_KEYS).map(|i| k((1 << 40) | i)));
    }

    /// Places visited by flushes so far.
    fn visits(n: &Notify) -> usize {
        n.places.borrow().visits
    }

    /// Tasks registered.
    fn waiters(n: &Notify) -> usize {
        n.places.borrow().places.len() - n.free.borrow().len()
    }

    #[test]
    fn slots_are_reused() {
        let n = Notify::new();
        let a = n.waiter();
        let b = n.waiter();
        assert_eq!(waiters(&n), 2);
        drop(a);
        let c = n.waiter();
        assert_eq!(waiters(&n), 2);
        drop((b, c));
        assert_eq!(waiters(&n), 0);
    }

    /// Wakers that count their wake-ups, and a reading of the counts.
    struct Counters(Vec<std::sync::Arc<Count>>);

    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    impl Counters {
        fn new(n: usize) -> (Self, Vec<Waker>) {
            let counts: Vec<_> = (0..n)
                .map(|_| std::sync::Arc::new(Count(std::sync::atomic::AtomicUsize::new(0))))
                .collect();
            let wakers = counts.iter().map(|c| Waker::from(c.clone())).collect();
            (Counters(counts), wakers)
        }

        fn woken(&self) -> Vec<usize> {
            self.0
                .iter()
                .map(|c| c.0.load(std::sync::atomic::Ordering::Relaxed))
                .collect()
        }
    }

    #[test]
    fn a_track_waker_bumps_its_track_and_is_one_per_state() {
        let (counters, wakers) = Counters::new(2);
        let n = Rc::new(Notify::new());
        let places: Vec<_> = (0..2).map(|_| n.waiter()).collect();
        follow_media(&places[0], &wakers[0], [k(1)]);
        follow_media(&places[1], &wakers[1], [k(2)]);
        let a = n.track_waker(k(1));
        // Every waker of one state wakes the same "task": a track holds one.
        assert!(a.will_wake(&n.track_waker(k(1))));
        assert!(!a.will_wake(&n.track_waker(k(2))));
        a.wake_by_ref();
        assert_eq!(counters.woken(), [1, 0]);
        // A state reopened for a new track: its waker names the new key.
        follow_media(&places[1], &wakers[1], [TrackKey::from_parts(1, 7)]);
        let b = n.track_waker(TrackKey::from_parts(1, 7));
        b.wake();
        assert_eq!(counters.woken(), [1, 1]);
        // Wakers outliving their signal do nothing.
        drop(places);
        drop(n);
        a.wake();
    }

    #[test]
    fn a_session_follows_served_media_and_filled_consumption() {
        let (counters, wakers) = Counters::new(1);
        let n = Notify::new();
        let place = n.waiter();
        // Serves track 1, fills track 2.
        let register = || place.register_session(&wakers[0], [k(1)], [k(2)]);
        register();
        // Other readers of a served track do not concern it.
        n.bump_consumed_tracks([k(1)]);
        assert_eq!(counters.woken(), [0]);
        assert!(!place.take_concerned());
        n.bump_consumed_tracks([k(2)]);
        assert_eq!(counters.woken(), [1]);
        assert!(place.take_concerned());
        // A change while it runs (its waker taken) is kept for its next wait.
        n.bump_tracks([k(1)]);
        assert_eq!(counters.woken(), [1]);
        assert!(place.take_concerned());
        assert!(!place.take_concerned());
        register();
        n.bump_tracks([k(3)]);
        assert_eq!(counters.woken(), [1]);
        n.bump();
        assert_eq!(counters.woken(), [2]);
    }

    #[test]
    fn bumps_naming_tracks_wake_their_followers_only() {
        let (counters, wakers) = Counters::new(4);
        let woken = || counters.woken();
        let n = Notify::new();
        let places: Vec<_> = (0..4).map(|_| n.waiter()).collect();
        // 0 serves track 1 (media only), 1 fills track 2, 2 follows every
        // track, 3 serves more tracks than a place names (so: every track).
        let register = || {
            follow_media(&places[0], &wakers[0], [k(1)]);
            follow(&places[1], &wakers[1], [k(2)]);
            places[2].register(&wakers[2]);
            follow_media(&places[3], &wakers[3], (10..10 + TRACK_KEYS + 1).map(k));
        };
        register();
        n.bump_tracks([k(1)]);
        assert_eq!(woken(), [1, 0, 1, 1]);
        register();
        // Reading track 1 concerns its filler (none here) and 2, which
        // follows everything; media-only waiters sleep through consumption.
        n.bump_consumed_tracks([k(1)]);
        assert_eq!(woken(), [1, 0, 2, 1]);
        register();
        n.bump_consumed_tracks([k(2)]);
        assert_eq!(woken(), [1, 1, 3, 1]);
        register();
        n.bump_tracks([k(2), k(3)]);
        assert_eq!(woken(), [1, 2, 4, 2]);
        register();
        // A bump of every track, or of more than a flush names, wakes everyone.
        n.bump_tracks((100..100 + PENDING_KEYS + 1).map(k));
        assert_eq!(woken(), [2, 3, 5, 3]);
        register();
        n.bump();
        assert_eq!(woken(), [3, 4, 6, 4]);
    }

    #[test]
    fn a_track_bump_visits_only_that_tracks_followers() {
        const N: usize = 1000;
        let (counters, wakers) = Counters::new(N + 1);
        // The waiters woken so far, with how often.
        let woken = || -> Vec<(usize, usize)> {
            counters
                .woken()
                .into_iter()
                .enumerate()
                .filter(|&(_, w)| w > 0)
                .collect()
        };
        let n = Notify::new();
        let places: Vec<_> = (0..=N).map(|_| n.waiter()).collect();
        let key = |i: usize| -> TrackKey { k(5000 + i) };
        // Waiter i < N follows track i alone; waiter N follows every track.
        let register = |i: usize| {
            if i == N {
                places[i].register(&wakers[i]);
            } else {
                follow(&places[i], &wakers[i], [key(i)]);
            }
        };
        (0..=N).for_each(register);

        let before = visits(&n);
        n.bump_tracks([key(500)]);
        assert_eq!(
            visits(&n) - before,
            2,
            "its follower and the one following all"
        );
        assert_eq!(woken(), [(500, 1), (N, 1)]);

        register(500);
        register(N);
        let before = visits(&n);
        n.bump_consumed_tracks([key(7), key(8)]);
        assert_eq!(visits(&n) - before, 3);
        assert_eq!(woken(), [(7, 1), (8, 1), (500, 1), (N, 2)]);

        // A bump of every track visits everyone.
        (0..=N).for_each(register);
        let before = visits(&n);
        n.bump();
        assert!(visits(&n) - before > N);
        assert_eq!(woken().len(), N + 1);
    }

    #[test]
    fn a_tracks_consumption_visits_its_filler_not_its_viewers() {
        const VIEWERS: usize = 200;
        let (counters, wakers) = Counters::new(VIEWERS + 1);
        let n = Notify::new();
        let places: Vec<_> = (0..=VIEWERS).map(|_| n.waiter()).collect();
        let track = k(9);
        // Place 0 fills the track; the others serve it to their viewers.
        let register = || {
            follow(&places[0], &wakers[0], [track]);
            for (place, waker) in places.iter().zip(&wakers).skip(1) {
                follow_media(place, waker, [track]);
            }
        };
        register();
        let before = visits(&n);
        n.bump_consumed_tracks([track]);
        assert_eq!(visits(&n) - before, 1, "the filler alone");
        assert_eq!(counters.woken()[0], 1);
        assert_eq!(counters.woken().iter().sum::<usize>(), 1);
        // Media still reaches every task serving the track.
        register();
        let before = visits(&n);
        n.bump_tracks([track]);
        assert_eq!(visits(&n) - before, VIEWERS + 1);
        assert_eq!(counters.woken().iter().sum::<usize>(), VIEWERS + 2);
        // A filler that stops filling leaves the consumption list.
        places[0].register_session(&wakers[0], [track], std::iter::empty());
        let before = visits(&n);
        n.bump_consumed_tracks([track]);
        assert_eq!(visits(&n) - before, 0);
    }

    #[test]
    fn followers_move_with_their_registration() {
        let (counters, w) = Counters::new(2);
        let n = Notify::new();
        let (a, b) = (n.waiter(), n.waiter());
        follow(&a, &w[0], [k(1), k(2)]);
        follow_media(&b, &w[1], [k(2)]);
        // Named twice by one flush, woken once.
        n.bump_tracks([k(1), k(2)]);
        assert_eq!(counters.woken(), [1, 1]);

        // Following other tracks: the old ones no longer wake it.
        follow(&a, &w[0], [k(3)]);
        n.bump_tracks([k(1), k(2)]);
        assert_eq!(counters.woken(), [1, 1]);
        n.bump_tracks([k(3)]);
        assert_eq!(counters.woken(), [2, 1]);
        // Following everything.
        a.register(&w[0]);
        n.bump_tracks([k(9)]);
        assert_eq!(counters.woken(), [3, 1]);

        // Switching back and forth reuses the index's room.
        let room = |n: &Notify| {
            let p = n.places.borrow();
            (
                p.links.capacity(),
                p.followers.capacity(),
                p.places.capacity(),
            )
        };
        follow(&a, &w[0], [k(4), k(5)]);
        let warm = room(&n);
        for round in 0..100 {
            if round % 2 == 0 {
                follow(&a, &w[0], [k(6)]);
            } else {
                follow(&a, &w[0], [k(4), k(5)]);
            }
            follow_media(&b, &w[1], [k(round % 3)]);
            n.bump_tracks([k(6), k(round % 3)]);
        }
        assert_eq!(room(&n), warm);

        // A dropped waiter is in no list.
        drop((a, b));
        let before = visits(&n);
        n.bump_tracks([k(4), k(5), k(6), k(0), k(1), k(2)]);
        assert_eq!(visits(&n), before);
        assert!(n.places.borrow().followers.is_empty());
    }

    #[test]
    fn the_index_wakes_whom_a_walk_of_every_waiter_would() {
        /// What a waiter registered: media only, the tracks it follows
        /// (`None`: all), and whether it waits.
        #[derive(Clone)]
        struct Model {
            media_only: bool,
            follows: Option<Vec<TrackKey>>,
            waiting: bool,
        }
        const W: usize = 24;
        let (counters, wakers) = Counters::new(W);
        let n = Notify::new();
        let mut waiters: Vec<Option<(Waiter<'_>, Model)>> = (0..W).map(|_| None).collect();
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |below: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % below as u64) as usize
        };
        for _ in 0..20_000 {
            let i = next(W);
            match next(10) {
                0 => waiters[i] = None,
                1..=5 => {
                    let w = waiters[i].get_or_insert_with(|| {
                        let model = Model {
                            media_only: false,
                            follows: None,
                            waiting: false,
                        };
                        (n.waiter(), model)
                    });
                    let media_only = next(2) == 0;
                    // At least one: a session following no track is not
                    // concerned by consumption of every track.
                    let keys: Vec<TrackKey> =
                        (0..1 + next(TRACK_KEYS + 1)).map(|_| k(next(8))).collect();
                    let all = next(4) == 0;
                    match (media_only, all) {
                        (false, true) => w.0.register(&wakers[i]),
                        (false, false) => follow(&w.0, &wakers[i], keys.iter().copied()),
                        (true, true) => follow_all_media(&w.0, &wakers[i]),
                        (true, false) => follow_media(&w.0, &wakers[i], keys.iter().copied()),
                    }
                    let mut distinct = keys.clone();
                    distinct.sort_unstable();
                    distinct.dedup();
                    w.1 = Model {
                        media_only,
                        follows: (!all && distinct.len() <= TRACK_KEYS).then_some(distinct),
                        waiting: true,
                    };
                }
                kind => {
                    let media = kind % 2 == 0;
                    let named: Option<Vec<TrackKey>> =
                        (next(5) != 0).then(|| (0..1 + next(3)).map(|_| k(next(8))).collect());
                    let before = counters.woken();
                    match (media, &named) {
                        (true, Some(k)) => n.bump_tracks(k.iter().copied()),
                        (false, Some(k)) => n.bump_consumed_tracks(k.iter().copied()),
                        (true, None) => n.bump(),
                        (false, None) => n.bump_consumed(),
                    }
                    let after = counters.woken();
                    for (j, w) in waiters.iter_mut().enumerate() {
                        let want = w.as_mut().is_some_and(|(_, m)| {
                            let follows = match (&m.follows, &named) {
                                (Some(f), Some(k)) => f.iter().any(|t| k.contains(t)),
                                _ => true,
                            };
                            let woken = m.waiting && follows && (media || !m.media_only);
                            m.waiting &= !woken;
                            woken
                        });
                        assert_eq!(after[j] - before[j], usize::from(want), "waiter {j}");
                    }
                }
            }
        }
    }

    #[test]
    fn consumption_wakes_only_tasks_not_waiting_for_media_alone() {
        let (counters, w) = Counters::new(2);
        let n = Notify::new();
        let (a, m) = (n.waiter(), n.waiter());
        a.register(&w[0]);
        follow_all_media(&m, &w[1]);
        n.bump_consumed();
        assert_eq!(counters.woken(), [1, 0]);
        a.register(&w[0]);
        n.bump();
        assert_eq!(counters.woken(), [2, 1]);
    }
}
