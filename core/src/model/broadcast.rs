//! A broadcast: a path and a fixed-capacity table of tracks, looked up by name.
//!
//! # API summary
//!
//! * [`State<'a, 'p, T>`]: the storage, a path ([`PathBuf`] of at most
//!   [`MAX_PATH_LEN`] bytes) and `T` track places. [`State::new`]`(path)`;
//!   [`State::handle`] gives a [`Ref`].
//! * [`Ref<'a, 'p>`]: a `Copy`, size-erased handle, and the consumer side:
//!   [`Ref::path`], [`Ref::track`]`(name) -> Option<track::Ref>`,
//!   [`Ref::tracks`], [`Ref::status`], [`Ref::version`], [`Ref::producer`].
//! * [`Producer`] (one per broadcast): [`Producer::add`]`(track::Ref)`
//!   (errors: [`AddError`]), [`Producer::remove`]`(name)`, [`Producer::finish`].
//!
//! The table holds `track::Ref`s (two pointers each) to track states that
//! live elsewhere, so tracks of different ring sizes share one broadcast and
//! a track can be served while it is being added or removed. Every handle
//! borrows the broadcast for `'a`, the same lifetime as the tracks it holds
//! (the table is interior-mutable, so the two cannot differ): declare the
//! tracks first, or keep everything in `static`s.
//!
//! The path of a broadcast never changes while it lives (an
//! [`origin`](super::origin) keys broadcasts by it). A relay reuses the
//! storage for another broadcast once nothing refers to it any more
//! ([`Ref::reopen`]): that starts a new generation, and handles to the old
//! one are stale ([`Ref::is_current`]). Paths are read as copies
//! ([`Ref::path`]) or compared in place ([`Ref::has_path`]), so no borrow of
//! the old path can outlive a reuse. Adding, removing and finishing bump
//! [`Ref::version`].

use core::cell::{Cell, RefCell};
use core::fmt;

use super::hops::HopList;
use super::path::{Path, PathBuf, PathError};
use super::track;

/// The longest broadcast path a broadcast holds, in bytes.
pub const MAX_PATH_LEN: usize = 128;

/// Where a broadcast is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Status {
    /// Tracks may be added and removed.
    Open,
    /// No track will be added any more; the tracks held can still be looked up.
    Finished,
}

/// Why [`Producer::add`] refused a track; the table is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum AddError {
    /// Every place in the table is taken.
    Full,
    /// A track with the same name is in the table already.
    Duplicate,
    /// The broadcast is finished.
    Finished,
}

impl fmt::Display for AddError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AddError::Full => "broadcast track table full",
            AddError::Duplicate => "duplicate track name",
            AddError::Finished => "broadcast finished",
        })
    }
}

impl core::error::Error for AddError {}

/// [`Ref::producer`] refused: the broadcast already has a live [`Producer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ProducerTaken;

impl fmt::Display for ProducerTaken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("broadcast already has a producer")
    }
}

impl core::error::Error for ProducerTaken {}

/// Why [`Ref::reopen`] refused; the broadcast is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ReopenError {
    /// The new path does not fit.
    Path(PathError),
    /// A producer of the broadcast is still alive.
    Producer,
}

impl fmt::Display for ReopenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReopenError::Path(e) => write!(f, "broadcast path: {e}"),
            ReopenError::Producer => f.write_str("broadcast still has a producer"),
        }
    }
}

impl core::error::Error for ReopenError {}

/// Broadcast-wide fields, independent of the table size.
struct Core {
    /// Borrowed only inside this module's calls, never across them.
    path: RefCell<PathBuf<MAX_PATH_LEN>>,
    status: Cell<Status>,
    has_producer: Cell<bool>,
    version: Cell<u64>,
    /// Bumped by [`Ref::reopen`]; handles compare it to detect reuse.
    epoch: Cell<u64>,
    /// The route the broadcast came by (docs/protocol.md §3.6): written in
    /// every ANNOUNCE of it. Borrowed only inside this module's calls.
    hops: RefCell<HopList>,
}

type Place<'a, 'p> = Cell<Option<track::Ref<'a, 'p>>>;

/// The storage of one broadcast: its path and `T` places for tracks.
pub struct State<'a, 'p, const T: usize> {
    core: Core,
    tracks: [Place<'a, 'p>; T],
}

impl<'a, 'p, const T: usize> State<'a, 'p, T> {
    /// An open broadcast at `path` with no track.
    ///
    /// # Errors
    /// [`PathError::TooLong`] beyond [`MAX_PATH_LEN`] bytes.
    pub fn new(path: Path<'_>) -> Result<Self, PathError> {
        Ok(State {
            core: Core {
                path: RefCell::new(PathBuf::from_path(path)?),
                status: Cell::new(Status::Open),
                has_producer: Cell::new(false),
                version: Cell::new(0),
                epoch: Cell::new(0),
                hops: RefCell::new(HopList::EMPTY),
            },
            tracks: [const { Cell::new(None) }; T],
        })
    }

    /// The size-erased handle every producer, consumer and origin uses.
    pub fn handle(&'a self) -> Ref<'a, 'p> {
        Ref {
            core: &self.core,
            tracks: &self.tracks,
            epoch: self.core.epoch.get(),
        }
    }

    /// The broadcast's one producer; see [`Ref::producer`].
    ///
    /// # Errors
    /// [`ProducerTaken`] while another producer is alive.
    pub fn producer(&'a self) -> Result<Producer<'a, 'p>, ProducerTaken> {
        self.handle().producer()
    }
}

impl<const T: usize> State<'_, '_, T> {
    /// True while a [`Producer`] of the broadcast is alive.
    pub fn has_producer(&self) -> bool {
        self.core.has_producer.get()
    }

    /// [`Ref::reopen`] without a handle to the new generation (for a table
    /// that makes one when it hands the broadcast out).
    ///
    /// # Errors
    /// As [`Ref::reopen`].
    pub fn reuse(&self, path: Path<'_>) -> Result<(), ReopenError> {
        reopen(&self.core, &self.tracks, path)
    }
}

/// Reuses `core` and `tracks` for the broadcast at `path` (see [`Ref::reopen`]).
fn reopen<'a, 'p>(
    core: &Core,
    tracks: &[Place<'a, 'p>],
    path: Path<'_>,
) -> Result<(), ReopenError> {
    if core.has_producer.get() {
        return Err(ReopenError::Producer);
    }
    let path = PathBuf::from_path(path).map_err(ReopenError::Path)?;
    *core.path.borrow_mut() = path;
    for place in tracks {
        place.set(None);
    }
    core.status.set(Status::Open);
    *core.hops.borrow_mut() = HopList::EMPTY;
    core.epoch.set(core.epoch.get().wrapping_add(1));
    core.version.set(core.version.get().wrapping_add(1));
    Ok(())
}

impl<const T: usize> fmt::Debug for State<'_, '_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("broadcast::State")
            .field("path", &*self.core.path.borrow())
            .field("status", &self.core.status.get())
            .field("capacity", &T)
            .finish_non_exhaustive()
    }
}

/// A borrowed handle to one generation of a broadcast [`State`] of any table
/// size; `Copy`, and the consumer side (track lookup).
#[derive(Clone, Copy)]
pub struct Ref<'a, 'p> {
    core: &'a Core,
    tracks: &'a [Place<'a, 'p>],
    /// The generation this handle was made for.
    epoch: u64,
}

impl<'a, 'p> Ref<'a, 'p> {
    /// The broadcast's one producer.
    ///
    /// # Errors
    /// [`ProducerTaken`] while another producer is alive.
    pub fn producer(self) -> Result<Producer<'a, 'p>, ProducerTaken> {
        if self.core.has_producer.get() || !self.is_current() {
            return Err(ProducerTaken);
        }
        self.core.has_producer.set(true);
        Ok(Producer { broadcast: self })
    }

    /// A copy of the broadcast path.
    pub fn path(&self) -> PathBuf<MAX_PATH_LEN> {
        self.core.path.borrow().clone()
    }

    /// True while a [`Producer`] of the broadcast is alive.
    #[cfg(test)]
    pub fn has_producer(&self) -> bool {
        self.core.has_producer.get()
    }

    /// Whether the broadcast's path is exactly `path` (compared in place).
    pub fn has_path(&self, path: Path<'_>) -> bool {
        self.core.path.borrow().as_path() == path
    }

    /// The broadcast's path relative to the whole-segment `prefix`, if it is
    /// under it (docs/protocol.md §3.6: `""` is the prefix itself).
    pub fn suffix(&self, prefix: Path<'_>) -> Option<PathBuf<MAX_PATH_LEN>> {
        let path = self.core.path.borrow();
        let suffix = path.as_path().strip_prefix(prefix)?;
        PathBuf::from_path(suffix).ok()
    }

    /// Whether the broadcast's path is under the whole-segment `prefix`.
    pub fn is_under(&self, prefix: Path<'_>) -> bool {
        self.core
            .path
            .borrow()
            .as_path()
            .strip_prefix(prefix)
            .is_some()
    }

    /// Whether `self` and `other` are handles to the same broadcast (same
    /// storage, same generation).
    pub fn same_broadcast(&self, other: &Ref<'_, '_>) -> bool {
        core::ptr::eq(self.core, other.core) && self.epoch == other.epoch
    }

    /// True while the storage still holds the broadcast this handle was
    /// made for.
    pub fn is_current(&self) -> bool {
        self.core.epoch.get() == self.epoch
    }

    /// Reuses the storage for the broadcast at `path` and returns the handle
    /// to it: open, with no track, a new generation (every existing handle is
    /// stale). The caller makes sure nothing still looks the old broadcast up:
    /// it is in no origin, and no origin's change log still holds it (a relay
    /// waits until the log has moved on by its length).
    ///
    /// # Errors
    /// [`ReopenError::Path`] beyond [`MAX_PATH_LEN`] bytes;
    /// [`ReopenError::Producer`] while a [`Producer`] of it is alive. The
    /// broadcast is unchanged on error.
    pub fn reopen(&self, path: Path<'_>) -> Result<Ref<'a, 'p>, ReopenError> {
        reopen(self.core, self.tracks, path)?;
        let c = self.core;
        Ok(Ref {
            epoch: c.epoch.get(),
            ..*self
        })
    }

    /// The route the broadcast came by, origin first (empty: published
    /// here); written in its ANNOUNCEs (docs/protocol.md §3.6).
    pub fn hops(&self) -> HopList {
        *self.core.hops.borrow()
    }

    /// Whether the non-zero `id` is on the broadcast's route (Exclude Hop,
    /// split horizon: docs/protocol.md §4.3).
    pub fn hops_contain(&self, id: u64) -> bool {
        self.core.hops.borrow().contains(id)
    }

    /// Where the broadcast is in its life.
    pub fn status(&self) -> Status {
        self.core.status.get()
    }

    /// A counter bumped when a track is added or removed, and on finish.
    pub fn version(&self) -> u64 {
        self.core.version.get()
    }

    /// The track called `name` (byte-wise, docs/protocol.md §3.2), if present. O(T).
    ///
    /// A missing track on an existing broadcast is NOT_FOUND (`0x33`, §4.4).
    pub fn track(&self, name: &str) -> Option<track::Ref<'a, 'p>> {
        self.tracks
            .iter()
            .filter_map(Cell::get)
            .find(|t| t.has_name(name))
    }

    /// The tracks present, in table order.
    pub fn tracks(&self) -> impl Iterator<Item = track::Ref<'a, 'p>> + use<'a, 'p> {
        self.tracks.iter().filter_map(Cell::get)
    }

    /// How many tracks are present.
    pub fn len(&self) -> usize {
        self.tracks().count()
    }

    /// Whether no track is present.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The table size `T`.
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.tracks.len()
    }

    fn changed(&self) {
        self.core
            .version
            .set(self.core.version.get().wrapping_add(1));
    }
}

impl fmt::Debug for Ref<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("broadcast::Ref")
            .field("path", &*self.core.path.borrow())
            .field("status", &self.core.status.get())
            .field("tracks", &self.len())
            .finish()
    }
}

/// The one writer of a broadcast's track table (from [`Ref::producer`]).
///
/// Dropping it finishes the broadcast.
pub struct Producer<'a, 'p> {
    broadcast: Ref<'a, 'p>,
}

impl<'a, 'p> Producer<'a, 'p> {
    /// The broadcast this producer writes.
    pub fn broadcast(&self) -> Ref<'a, 'p> {
        self.broadcast
    }

    /// Sets the route the broadcast came by ([`Ref::hops`]); an origin that
    /// offers it announces the change with [`super::origin::Ref::reannounce`].
    pub fn set_hops(&self, hops: &HopList) {
        *self.broadcast.core.hops.borrow_mut() = *hops;
    }

    /// Adds `track` under its own name ([`track::Ref::info`]).
    ///
    /// # Errors
    /// [`AddError::Duplicate`] if a track of that name is present,
    /// [`AddError::Full`] if every place is taken, [`AddError::Finished`]
    /// after [`Producer::finish`]. The table is unchanged on error.
    pub fn add(&self, track: track::Ref<'a, 'p>) -> Result<(), AddError> {
        let b = self.broadcast;
        if b.status() == Status::Finished {
            return Err(AddError::Finished);
        }
        let name = track.info().name;
        if b.track(name.as_str()).is_some() {
            return Err(AddError::Duplicate);
        }
        let place = b
            .tracks
            .iter()
            .find(|p| p.get().is_none())
            .ok_or(AddError::Full)?;
        place.set(Some(track));
        b.changed();
        Ok(())
    }

    /// Removes the track called `name` and returns it, or `None` if absent.
    ///
    /// Readers of the track keep reading it; it is only no longer found here.
    pub fn remove(&self, name: &str) -> Option<track::Ref<'a, 'p>> {
        let b = self.broadcast;
        let place = b
            .tracks
            .iter()
            .find(|p| p.get().is_some_and(|t| t.has_name(name)))?;
        let track = place.take();
        b.changed();
        track
    }

    /// Ends the broadcast: no track will be added any more. Returns false if already finished.
    pub fn finish(&mut self) -> bool {
        let b = self.broadcast;
        if b.status() == Status::Finished {
            return false;
        }
        b.core.status.set(Status::Finished);
        b.changed();
        true
    }
}

impl Drop for Producer<'_, '_> {
    fn drop(&mut self) {
        self.broadcast.core.has_producer.set(false);
        self.finish();
    }
}

impl fmt::Debug for Producer<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("broadcast::Producer")
            .field("broadcast", &self.broadcast)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use crate::pool::{Pool, PoolStorage};
    use crate::window::Start;
    use std::vec::Vec;

    fn path(s: &str) -> Path<'_> {
        Path::new(s).unwrap()
    }

    // --- table --------------------------------------------------------------

    #[test]
    fn add_lookup_remove() {
        let mut storage = PoolStorage::<8, 32>::new();
        let pool = Pool::new(&mut storage);
        let video = track::State::<4>::new(&pool, track::Info::new("video").unwrap());
        let audio = track::State::<2>::new(&pool, track::Info::new("audio").unwrap());
        let dup = track::State::<2>::new(&pool, track::Info::new("video").unwrap());
        let extra = track::State::<2>::new(&pool, track::Info::new("extra").unwrap());
        let bc = State::<2>::new(path("/room/cam/")).unwrap();
        let b = bc.handle();
        assert_eq!(b.path().as_str(), "room/cam");
        assert!(b.has_path(path("room/cam")) && !b.has_path(path("room")));
        let p = bc.producer().unwrap();
        assert_eq!(b.producer().unwrap_err(), ProducerTaken);
        let v0 = b.version();
        p.add(video.handle()).unwrap();
        p.add(audio.handle()).unwrap();
        assert!(b.version() > v0);
        assert_eq!(p.add(dup.handle()), Err(AddError::Duplicate));
        assert_eq!(p.add(extra.handle()), Err(AddError::Full));
        assert_eq!((b.len(), b.capacity()), (2, 2));
        assert!(b.track("video").unwrap().same_track(&video.handle()));
        assert!(
            b.track("Video").is_none(),
            "names are compared byte for byte"
        );
        let names: Vec<_> = b.tracks().map(|t| t.info().name).collect();
        assert_eq!(names, ["video", "audio"]);

        // Readers of a removed track keep reading it.
        let tp = video.producer().unwrap();
        let mut c = b.track("video").unwrap().consumer(Start::Latest);
        let removed = p.remove("video").unwrap();
        assert!(removed.same_track(&video.handle()));
        assert!(p.remove("video").is_none());
        assert!(b.track("video").is_none());
        let mut g = tp.append_group().unwrap();
        g.write_frame(0, b"x").unwrap();
        assert!(c.next_group().unwrap().ready().is_some());
        p.add(extra.handle()).unwrap();
        assert_eq!(b.len(), 2);
    }

    #[test]
    fn finish_stops_additions() {
        let mut storage = PoolStorage::<2, 32>::new();
        let pool = Pool::new(&mut storage);
        let video = track::State::<1>::new(&pool, track::Info::new("video").unwrap());
        let late = track::State::<1>::new(&pool, track::Info::new("late").unwrap());
        let bc = State::<4>::new(path("a")).unwrap();
        let b = bc.handle();
        let mut p = bc.producer().unwrap();
        p.add(video.handle()).unwrap();
        assert!(p.finish());
        assert!(!p.finish());
        assert_eq!(b.status(), Status::Finished);
        assert_eq!(p.add(late.handle()), Err(AddError::Finished));
        assert!(
            b.track("video").is_some(),
            "finished broadcasts still serve their tracks"
        );
        drop(p);
        // Dropping the producer frees the role (and finishes, already done here).
        assert!(b.producer().is_ok());
    }

    #[test]
    fn dropping_the_producer_finishes() {
        let bc = State::<1>::new(path("a")).unwrap();
        drop(bc.producer().unwrap());
        assert_eq!(bc.handle().status(), Status::Finished);
    }

    #[test]
    fn reopen_is_a_new_broadcast_and_old_handles_are_stale() {
        let mut storage = PoolStorage::<2, 32>::new();
        let pool = Pool::new(&mut storage);
        let video = track::State::<1>::new(&pool, track::Info::new("video").unwrap());
        let bc = State::<2>::new(path("old")).unwrap();
        let old = bc.handle();
        let mut p = old.producer().unwrap();
        p.add(video.handle()).unwrap();
        assert_eq!(old.reopen(path("new")).unwrap_err(), ReopenError::Producer);
        assert!(p.finish());
        drop(p);
        let new = old.reopen(path("new")).unwrap();
        assert!(new.is_current() && !old.is_current());
        assert!(!new.same_broadcast(&old));
        assert!(new.has_path(path("new")) && new.is_empty());
        assert_eq!(new.status(), Status::Open);
        assert!(old.producer().is_err(), "a stale handle makes no producer");
        assert!(new.producer().is_ok());
        assert_eq!(new.suffix(path("")).unwrap().as_str(), "new");
        assert!(new.reopen(path(&"x".repeat(MAX_PATH_LEN + 1))).is_err());
    }

    #[test]
    fn path_capacity() {
        let long = [b'a'; MAX_PATH_LEN + 1];
        let long = core::str::from_utf8(&long).unwrap();
        assert_eq!(State::<1>::new(path(long)).unwrap_err(), PathError::TooLong);
        assert!(State::<1>::new(path(&long[1..])).is_ok());
    }
}
