//! An origin: the fixed-capacity catalog of announced broadcasts, by path, with a change log.
//!
//! # API summary
//!
//! * [`State<'a, 'p, B, L>`]: the storage, `B` broadcast places and a ring of
//!   the `L` most recent changes. [`State::new`]; [`State::handle`] gives a [`Ref`].
//! * [`Ref<'a, 'p>`]: a `Copy`, size-erased handle shared by every session:
//!   [`Ref::announce`]`(broadcast::Ref)` (errors: [`AnnounceError`]),
//!   [`Ref::unannounce`]`(path)`, [`Ref::get`]`(path)` (exact match),
//!   [`Ref::under`]`(prefix)` (active broadcasts under a whole-segment prefix,
//!   with their suffix), [`Ref::count_under`], [`Ref::version`],
//!   [`Ref::poll_changed`].
//! * Following changes: [`Ref::cursor`] gives a [`Cursor`] at "now" (read the
//!   full set with [`Ref::under`] at the same time), then
//!   [`Ref::next_change_under`]`(&mut cursor, prefix)` yields each later
//!   [`Change`] (active / ended) with its suffix, or `Err(`[`Lagged`]`)` if
//!   the follower fell behind the ring: it then re-reads the full set.
//!
//! # Model
//!
//! docs/protocol.md §3.6, §4.2: a subscriber asks for the broadcasts under a
//! prefix; the publisher answers with the active set (ANNOUNCE_OK's Active
//! Count, then one ANNOUNCE each), then with every change (Active or Ended),
//! suffixes relative to the prefix. A session does exactly that with one
//! [`Cursor`] per announce stream, without heap: the origin keeps the last
//! `L` changes in a ring, and a cursor is just a change count.
//!
//! A broadcast is keyed by its own path ([`broadcast::Ref::path`], which never
//! changes while it lives). Each change keeps a copy of the path, so it still
//! names it after the broadcast was unannounced, and after its storage was
//! reused for another broadcast ([`broadcast::Ref::reopen`]). Matching is by whole segment ([`Path::strip_prefix`]).
//! Lookups and announcements are O(B); reading a change is O(1).

use core::cell::Cell;
use core::fmt;
use core::task::{Context, Poll};

use super::broadcast::{self, MAX_PATH_LEN};
use super::path::{Path, PathBuf};
use super::track::{WAKERS, Wakers};

/// Why [`Ref::announce`] refused a broadcast; nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum AnnounceError {
    /// Every place in the catalog is taken.
    Full,
    /// A broadcast with the same path is announced already.
    Duplicate,
}

impl fmt::Display for AnnounceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AnnounceError::Full => "origin catalog full",
            AnnounceError::Duplicate => "broadcast path already announced",
        })
    }
}

impl core::error::Error for AnnounceError {}

/// A follower fell behind the change ring: `missed` changes were overwritten.
///
/// Its cursor was moved to the present; it re-reads the full set
/// ([`Ref::under`]) and compares it with what it announced so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Lagged {
    /// Changes the follower did not see.
    pub missed: u64,
}

impl fmt::Display for Lagged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "announce follower missed {} changes", self.missed)
    }
}

impl core::error::Error for Lagged {}

/// One entry of the change log: a broadcast became active or ended, with a
/// copy of its path (the log keeps naming the path after the broadcast's
/// storage was reused for another one).
#[derive(Clone, Copy)]
pub struct Change<'a, 'p> {
    broadcast: broadcast::Ref<'a, 'p>,
    active: bool,
    path: [u8; MAX_PATH_LEN],
    len: u8,
}

impl<'a, 'p> Change<'a, 'p> {
    fn new(broadcast: broadcast::Ref<'a, 'p>, active: bool) -> Self {
        let mut path = [0u8; MAX_PATH_LEN];
        let held = broadcast.path();
        let bytes = held.as_str().as_bytes();
        let len = bytes.len().min(MAX_PATH_LEN);
        if let (Some(dst), Some(src)) = (path.get_mut(..len), bytes.get(..len)) {
            dst.copy_from_slice(src);
        }
        Change {
            broadcast,
            active,
            path,
            len: len as u8,
        }
    }

    /// The broadcast concerned. Stale ([`broadcast::Ref::is_current`]) once
    /// its storage was reused; the change still names its path.
    pub fn broadcast(&self) -> broadcast::Ref<'a, 'p> {
        self.broadcast
    }

    /// The broadcast's full path as it was when the change happened.
    pub fn path(&self) -> Path<'_> {
        let bytes = self.path.get(..usize::from(self.len)).unwrap_or(&[]);
        // Copied from a valid path, whole.
        Path::new(core::str::from_utf8(bytes).unwrap_or("")).unwrap_or(Path::EMPTY)
    }

    /// Whether the broadcast became active (as opposed to ended).
    pub fn is_active(&self) -> bool {
        self.active
    }
}

impl fmt::Debug for Change<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Change")
            .field("path", &self.path().as_str())
            .field("active", &self.active)
            .finish()
    }
}

/// A follower's position in the change log: the number of changes it has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Cursor {
    next: u64,
}

impl Cursor {
    /// How many changes (since the origin was built) this cursor is past.
    pub fn position(&self) -> u64 {
        self.next
    }
}

struct Core {
    /// Number of changes logged so far.
    version: Cell<u64>,
    wakers: Wakers<WAKERS>,
}

type Place<'a, 'p> = Cell<Option<broadcast::Ref<'a, 'p>>>;
type LogEntry<'a, 'p> = Cell<Option<Change<'a, 'p>>>;

/// The storage of an origin: `B` broadcast places and the last `L` changes.
pub struct State<'a, 'p, const B: usize, const L: usize> {
    core: Core,
    entries: [Place<'a, 'p>; B],
    log: [LogEntry<'a, 'p>; L],
}

impl<'a, 'p, const B: usize, const L: usize> State<'a, 'p, B, L> {
    /// An empty catalog.
    pub const fn new() -> Self {
        State {
            core: Core {
                version: Cell::new(0),
                wakers: Wakers::new(),
            },
            entries: [const { Cell::new(None) }; B],
            log: [const { Cell::new(None) }; L],
        }
    }

    /// The size-erased handle sessions share.
    pub fn handle(&'a self) -> Ref<'a, 'p> {
        Ref {
            core: &self.core,
            entries: &self.entries,
            log: &self.log,
        }
    }
}

impl<const B: usize, const L: usize> Default for State<'_, '_, B, L> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const B: usize, const L: usize> fmt::Debug for State<'_, '_, B, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("origin::State")
            .field("version", &self.core.version.get())
            .field("capacity", &B)
            .field("log", &L)
            .finish_non_exhaustive()
    }
}

/// A borrowed handle to an origin [`State`] of any size; `Copy`.
#[derive(Clone, Copy)]
pub struct Ref<'a, 'p> {
    core: &'a Core,
    entries: &'a [Place<'a, 'p>],
    log: &'a [LogEntry<'a, 'p>],
}

impl<'a, 'p> Ref<'a, 'p> {
    /// Announces `broadcast` under its path.
    ///
    /// # Errors
    /// [`AnnounceError::Duplicate`] if that path is announced already (unannounce
    /// it first); [`AnnounceError::Full`] if every place is taken.
    pub fn announce(&self, broadcast: broadcast::Ref<'a, 'p>) -> Result<(), AnnounceError> {
        if self.get(broadcast.path().as_path()).is_some() {
            return Err(AnnounceError::Duplicate);
        }
        let place = self
            .entries
            .iter()
            .find(|p| p.get().is_none())
            .ok_or(AnnounceError::Full)?;
        place.set(Some(broadcast));
        debug!("announced {}", broadcast.path().as_str());
        self.log(Change::new(broadcast, true));
        Ok(())
    }

    /// Withdraws the broadcast at `path` and returns it, or `None` if none is announced there.
    pub fn unannounce(&self, path: Path<'_>) -> Option<broadcast::Ref<'a, 'p>> {
        let place = self
            .entries
            .iter()
            .find(|p| p.get().is_some_and(|b| b.has_path(path)))?;
        let broadcast = place.take()?;
        debug!("unannounced {}", path.as_str());
        self.log(Change::new(broadcast, false));
        Some(broadcast)
    }

    /// Logs the broadcast announced at `path` as active again (its route
    /// changed: a publisher sends a restart, docs/protocol.md §3.6); false
    /// if none is announced there.
    pub fn reannounce(&self, path: Path<'_>) -> bool {
        let Some(broadcast) = self.get(path) else {
            return false;
        };
        self.log(Change::new(broadcast, true));
        true
    }

    /// The broadcast announced at exactly `path`.
    pub fn get(&self, path: Path<'_>) -> Option<broadcast::Ref<'a, 'p>> {
        self.iter().find(|b| b.has_path(path))
    }

    /// Every announced broadcast, in catalog order.
    pub fn iter(&self) -> impl Iterator<Item = broadcast::Ref<'a, 'p>> + use<'a, 'p> {
        self.entries.iter().filter_map(Cell::get)
    }

    /// The announced broadcasts under the whole-segment `prefix`, each with a
    /// copy of its path relative to the prefix (docs/protocol.md §3.6: `""` is the
    /// prefix itself).
    pub fn under<'q>(
        &self,
        prefix: Path<'q>,
    ) -> impl Iterator<Item = (PathBuf<MAX_PATH_LEN>, broadcast::Ref<'a, 'p>)> + use<'a, 'p, 'q>
    {
        self.iter()
            .filter_map(move |b| b.suffix(prefix).map(|s| (s, b)))
    }

    /// How many broadcasts are announced under `prefix` (ANNOUNCE_OK's Active Count).
    pub fn count_under(&self, prefix: Path<'_>) -> usize {
        self.iter().filter(|b| b.is_under(prefix)).count()
    }

    /// How many broadcasts are announced.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// Whether no broadcast is announced.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The catalog size `B`.
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.entries.len()
    }

    /// The number of changes so far; bumped by every announce and unannounce.
    pub fn version(&self) -> u64 {
        self.core.version.get()
    }

    /// Ready with the current version once it differs from `since`; otherwise
    /// registers the task (see [`Wakers`]) and returns `Pending`.
    #[must_use = "Pending means: poll again when woken"]
    pub fn poll_changed(&self, cx: &mut Context<'_>, since: u64) -> Poll<u64> {
        let v = self.core.version.get();
        if v != since {
            return Poll::Ready(v);
        }
        self.core.wakers.register(cx.waker());
        Poll::Pending
    }

    /// A cursor at the present: it will see every change from now on.
    ///
    /// Take it when reading the full set ([`Ref::under`]), with no change in
    /// between (the origin is single-threaded: do not yield between the two).
    pub fn cursor(&self) -> Cursor {
        Cursor {
            next: self.core.version.get(),
        }
    }

    /// The next change after `cursor`, advancing it; `Ok(None)` when up to date.
    ///
    /// # Errors
    /// [`Lagged`] if changes the cursor had not seen were overwritten (more
    /// than `L` behind); the cursor is moved to the present.
    pub fn next_change(&self, cursor: &mut Cursor) -> Result<Option<Change<'a, 'p>>, Lagged> {
        let version = self.core.version.get();
        if cursor.next == version {
            return Ok(None);
        }
        let behind = version.wrapping_sub(cursor.next);
        let entry = if behind <= self.log.len() as u64 {
            let len = self.log.len() as u64;
            // `len > 0` here: `behind >= 1`.
            self.log
                .get((cursor.next % len) as usize)
                .and_then(Cell::get)
        } else {
            None
        };
        match entry {
            Some(change) => {
                cursor.next += 1;
                Ok(Some(change))
            }
            None => {
                debug!("announce follower lagged by {} changes", behind);
                cursor.next = version;
                Err(Lagged { missed: behind })
            }
        }
    }

    /// The next change under the whole-segment `prefix` after `cursor`, with
    /// a copy of its path relative to the prefix; changes elsewhere are skipped.
    ///
    /// # Errors
    /// As [`Ref::next_change`].
    pub fn next_change_under(
        &self,
        cursor: &mut Cursor,
        prefix: Path<'_>,
    ) -> Result<Option<(PathBuf<MAX_PATH_LEN>, Change<'a, 'p>)>, Lagged> {
        while let Some(change) = self.next_change(cursor)? {
            if let Some(suffix) = change.path().strip_prefix(prefix)
                && let Ok(suffix) = PathBuf::from_path(suffix)
            {
                return Ok(Some((suffix, change)));
            }
        }
        Ok(None)
    }

    fn log(&self, change: Change<'a, 'p>) {
        let v = self.core.version.get();
        let len = self.log.len() as u64;
        if len > 0
            && let Some(entry) = self.log.get((v % len) as usize)
        {
            entry.set(Some(change));
        }
        self.core.version.set(v + 1);
        self.core.wakers.wake();
    }
}

impl fmt::Debug for Ref<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("origin::Ref")
            .field("announced", &self.len())
            .field("capacity", &self.entries.len())
            .field("version", &self.core.version.get())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use std::string::{String, ToString};
    use std::vec::Vec;

    fn path(s: &str) -> Path<'_> {
        Path::new(s).unwrap()
    }

    /// The remaining changes under `prefix` as `+suffix` / `-suffix`.
    fn drain(o: Ref<'_, '_>, c: &mut Cursor, prefix: &str) -> Result<Vec<String>, Lagged> {
        let mut out = Vec::new();
        while let Some((suffix, change)) = o.next_change_under(c, path(prefix))? {
            let sign = if change.is_active() { "+" } else { "-" };
            out.push(std::format!("{sign}{}", suffix.as_str()));
        }
        Ok(out)
    }

    fn suffixes(o: Ref<'_, '_>, prefix: &str) -> Vec<String> {
        o.under(path(prefix))
            .map(|(s, _)| s.as_str().to_string())
            .collect()
    }

    // --- catalog ------------------------------------------------------------

    #[test]
    fn announce_lookup_and_prefixes() {
        let a = broadcast::State::<1>::new(path("room/cam")).unwrap();
        let b = broadcast::State::<1>::new(path("room/mic")).unwrap();
        let c = broadcast::State::<1>::new(path("roomy")).unwrap();
        let d = broadcast::State::<1>::new(path("room")).unwrap();
        let again = broadcast::State::<1>::new(path("room/cam")).unwrap();
        let origin = State::<3, 8>::new();
        let o = origin.handle();
        o.announce(a.handle()).unwrap();
        o.announce(b.handle()).unwrap();
        assert_eq!(o.announce(again.handle()), Err(AnnounceError::Duplicate));
        o.announce(c.handle()).unwrap();
        assert_eq!(o.announce(d.handle()), Err(AnnounceError::Full));
        assert_eq!((o.len(), o.capacity()), (3, 3));
        assert!(o.get(path("room/cam")).unwrap().same_broadcast(&a.handle()));
        assert!(o.get(path("room")).is_none(), "lookup is by exact path");
        // Whole-segment prefixes, suffixes relative to the prefix.
        assert_eq!(suffixes(o, "room"), ["cam", "mic"]);
        assert_eq!(suffixes(o, ""), ["room/cam", "room/mic", "roomy"]);
        assert_eq!(suffixes(o, "room/cam"), [""]);
        assert_eq!(o.count_under(path("room")), 2);
        assert_eq!(o.count_under(path("nothing")), 0);

        let gone = o.unannounce(path("room/mic")).unwrap();
        assert!(gone.same_broadcast(&b.handle()));
        assert!(o.unannounce(path("room/mic")).is_none());
        o.announce(d.handle()).unwrap();
        assert_eq!(suffixes(o, "room"), ["cam", ""]);
    }

    // --- following changes ----------------------------------------------------

    #[test]
    fn followers_see_changes_under_their_prefix() {
        let a = broadcast::State::<1>::new(path("room/cam")).unwrap();
        let b = broadcast::State::<1>::new(path("other/x")).unwrap();
        let origin = State::<4, 8>::new();
        let o = origin.handle();
        o.announce(a.handle()).unwrap();
        // A new follower reads the full set, then follows from there.
        let mut cur = o.cursor();
        assert_eq!(suffixes(o, "room"), ["cam"]);
        assert_eq!(drain(o, &mut cur, "room"), Ok(Vec::<String>::new()));
        o.announce(b.handle()).unwrap();
        o.unannounce(path("room/cam")).unwrap();
        o.announce(a.handle()).unwrap();
        let mut all = cur;
        assert_eq!(
            drain(o, &mut cur, "room"),
            Ok(std::vec!["-cam".into(), "+cam".into()])
        );
        assert_eq!(
            drain(o, &mut all, ""),
            Ok(std::vec![
                "+other/x".into(),
                "-room/cam".into(),
                "+room/cam".into()
            ])
        );
        assert_eq!(cur.position(), o.version());
    }

    #[test]
    fn a_follower_behind_the_ring_is_told_and_resyncs() {
        let a = broadcast::State::<1>::new(path("a")).unwrap();
        let origin = State::<2, 2>::new();
        let o = origin.handle();
        let mut slow = o.cursor();
        let mut fast = o.cursor();
        for _ in 0..2 {
            o.announce(a.handle()).unwrap();
            assert_eq!(drain(o, &mut fast, ""), Ok(std::vec!["+a".into()]));
            o.unannounce(path("a")).unwrap();
            assert_eq!(drain(o, &mut fast, ""), Ok(std::vec!["-a".into()]));
        }
        o.announce(a.handle()).unwrap();
        assert_eq!(drain(o, &mut slow, ""), Err(Lagged { missed: 5 }));
        // Moved to the present: the full set is current, then changes follow.
        assert_eq!(suffixes(o, ""), ["a"]);
        assert_eq!(drain(o, &mut slow, ""), Ok(Vec::<String>::new()));
        o.unannounce(path("a")).unwrap();
        assert_eq!(drain(o, &mut slow, ""), Ok(std::vec!["-a".into()]));
        // Exactly `L` behind is still readable.
        let mut edge = o.cursor();
        o.announce(a.handle()).unwrap();
        o.unannounce(path("a")).unwrap();
        assert_eq!(
            drain(o, &mut edge, "a"),
            Ok(std::vec!["+".into(), "-".into()])
        );
    }

    #[test]
    fn no_log_means_every_change_is_a_lag() {
        let a = broadcast::State::<1>::new(path("a")).unwrap();
        let origin = State::<1, 0>::new();
        let o = origin.handle();
        let mut c = o.cursor();
        o.announce(a.handle()).unwrap();
        assert_eq!(o.next_change(&mut c).unwrap_err(), Lagged { missed: 1 });
        assert!(matches!(o.next_change(&mut c), Ok(None)));
    }

    #[test]
    fn changes_wake_waiters() {
        use core::task::Waker;
        let a = broadcast::State::<1>::new(path("a")).unwrap();
        let origin = State::<1, 4>::new();
        let o = origin.handle();
        let mut cx = Context::from_waker(Waker::noop());
        let v = o.version();
        assert_eq!(o.poll_changed(&mut cx, v), Poll::Pending);
        o.announce(a.handle()).unwrap();
        assert_eq!(o.poll_changed(&mut cx, v), Poll::Ready(v + 1));
    }
}
