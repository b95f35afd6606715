//! FETCH answered from the recording (docs/protocol.md §3.10, §4.8): a
//! FETCH the relay's cache cannot answer ([`Event::Fetch`], the sessions of a
//! recording relay hand those over) for broadcast `X`, or `X/replay` (a
//! trailing `replay` segment names the recording of `X`), is answered from
//! the stored segment of that group, when there is one.
//!
//! The index and the segment are read on a short-lived reader thread (at
//! most [`MAX_READS`] per worker at once, segments of at most
//! [`MAX_SEGMENT_BYTES`]; past either the fetch is refused with EVICTED), so
//! no disk read runs on the worker's event loop. The segment's samples
//! ([`fmp4::segment_samples`]) become hang frames again (the legacy
//! container: the presentation time in µs as a varint, then the access unit,
//! what the recorder stripped), with the presentation time as the moq-lite
//! timestamp (hang's timescale is µs). The worker writes them as one group of
//! an answer track of its own (a fixed table, [`ANSWER_TRACKS`], in the
//! worker's block pool) and answers the fetch with it. Anything that fails
//! is refused with a code and, for a segment that does not parse, logged;
//! nothing panics.
//!
//! [`Event::Fetch`]: skiff_core::session::Event::Fetch

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use skiff_core::hang;
use skiff_core::model::{group, track};
use skiff_core::pool::Pool;
use skiff_core::wire::lite::StreamCode;
use skiff_monoio::notify::Notify;
use skiff_monoio::tables::Keep;

use super::{fmp4, store};

/// Disk reads a worker runs at once for fetches.
pub const MAX_READS: usize = 4;

/// Largest stored segment a fetch reads.
pub const MAX_SEGMENT_BYTES: u64 = 16 << 20;

/// Answer tracks per worker: groups being sent at once from the recording.
pub const ANSWER_TRACKS: usize = 8;

/// How long an answer's group is kept for its session at most, when it was
/// not read to its end (a requester that stopped reading).
const ANSWER_HOLD: Duration = Duration::from_secs(30);

/// A group read back from the recording: `(timestamp µs, hang frame)`s.
pub type Frames = Vec<(u64, Vec<u8>)>;

/// The recorded broadcast a FETCH for `broadcast` names: itself, or `X` for
/// `X/replay`.
pub fn recorded_path(broadcast: &str) -> &str {
    match broadcast
        .strip_suffix(super::replay::REPLAY_NAME)
        .and_then(|x| x.strip_suffix('/'))
    {
        Some(x) if !x.is_empty() => x,
        _ => broadcast,
    }
}

/// Reads group `group` of track `track` of the recording of `broadcast` in
/// `dir` back as hang frames.
///
/// # Errors
/// NOT_FOUND for no such recording, track or group (or a segment gone since
/// the index named it), EVICTED for a segment over [`MAX_SEGMENT_BYTES`],
/// INTERNAL for a segment that does not parse.
pub fn read_group(
    dir: &Path,
    broadcast: &str,
    track: &str,
    group: u64,
) -> Result<Frames, StreamCode> {
    let stored = match store::open_index(dir, recorded_path(broadcast)) {
        Ok(Some(s)) => s,
        Ok(None) | Err(_) => return Err(StreamCode::NotFound),
    };
    let segment = stored
        .segments(track)
        .find(|s| s.group == group)
        .ok_or(StreamCode::NotFound)?;
    if segment.bytes > MAX_SEGMENT_BYTES {
        return Err(StreamCode::Evicted);
    }
    let path = stored.segment_path(segment);
    let bytes = std::fs::read(&path).map_err(|_| StreamCode::NotFound)?;
    let samples = fmp4::segment_samples(&bytes).map_err(|e| {
        tracing::warn!(segment = %path.display(), error = %e, "stored segment does not parse: fetch refused");
        StreamCode::Internal
    })?;
    let mut frames = Vec::with_capacity(samples.len());
    let mut prefix = [0u8; hang::frame::MAX_PREFIX_LEN];
    for s in samples {
        let n =
            hang::frame::encode_prefix(s.pts_us, &mut prefix).map_err(|_| StreamCode::Internal)?;
        let mut payload = Vec::with_capacity(n + s.data.len());
        payload.extend_from_slice(prefix.get(..n).unwrap_or(&[]));
        payload.extend_from_slice(&s.data);
        frames.push((s.pts_us, payload));
    }
    Ok(frames)
}

/// An answer track in use: its producer and the group it answers with.
struct Answer {
    _producer: track::Producer<'static, 'static>,
    group: track::GroupProducer<'static, 'static>,
    since: Instant,
}

/// One worker's fetches from the recording: the directory, the reads under
/// way and the answer tracks.
pub struct FetchStore {
    dir: PathBuf,
    tracks: &'static [track::State<'static, 1>],
    answers: RefCell<Vec<Option<Answer>>>,
    reads: Rc<Cell<usize>>,
    notify: Rc<Notify>,
}

impl std::fmt::Debug for FetchStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FetchStore")
            .field("dir", &self.dir)
            .field("reads", &self.reads.get())
            .finish_non_exhaustive()
    }
}

/// A fetch's outcome: the frames read, or the code to refuse it with.
pub type Outcome = Result<Frames, StreamCode>;

impl FetchStore {
    /// The fetches from the recording in `dir` of a worker whose block pool
    /// is `pool`; `keep` holds the answer tracks; `notify` wakes the
    /// worker's sessions when a read finished. `None` if the answer tracks
    /// cannot be named (never for their name).
    ///
    /// # Safety
    /// As [`Keep::slice`]: `keep` outlives every use of the store.
    pub unsafe fn new(
        dir: PathBuf,
        pool: &'static Pool<'static>,
        keep: &mut Keep,
        notify: Rc<Notify>,
    ) -> Option<Self> {
        let info = track::Info::new("fetch").ok()?;
        // SAFETY: the caller's promise.
        let tracks = unsafe { keep.slice(ANSWER_TRACKS, || track::State::<1>::new(pool, info)) };
        Some(FetchStore {
            dir,
            tracks,
            answers: RefCell::new((0..ANSWER_TRACKS).map(|_| None).collect()),
            reads: Rc::default(),
            notify,
        })
    }

    /// Starts reading group `group` of `track` of `broadcast`'s recording;
    /// the outcome lands in `into` (with `tag`) and the worker is woken.
    /// EVICTED at once past [`MAX_READS`] reads.
    pub fn start_read<T: 'static>(
        &self,
        broadcast: &str,
        name: &str,
        group: u64,
        tag: T,
        into: Rc<RefCell<Vec<(T, Outcome)>>>,
    ) {
        if self.reads.get() >= MAX_READS {
            into.borrow_mut().push((tag, Err(StreamCode::Evicted)));
            self.notify.bump();
            return;
        }
        let (dir, broadcast, name) = (self.dir.clone(), broadcast.to_owned(), name.to_owned());
        self.reads.set(self.reads.get() + 1);
        let notify = self.notify.clone();
        let reads = self.reads.clone();
        monoio::spawn(async move {
            let read = move || read_group(&dir, &broadcast, &name, group);
            let outcome = crate::offload::on_thread("skiff-fetch-read", read)
                .await
                .unwrap_or(Err(StreamCode::Evicted));
            reads.set(reads.get().saturating_sub(1));
            into.borrow_mut().push((tag, outcome));
            notify.bump();
        });
    }

    /// A group of an answer track holding `frames` (group `group` of track
    /// `name`), to answer a fetch with.
    ///
    /// # Errors
    /// EVICTED if every answer track is still in use or the pool is full,
    /// INTERNAL for a name that cannot be a track's or frames out of order.
    pub fn answer(
        &self,
        name: &str,
        group: u64,
        frames: &Frames,
    ) -> Result<group::Consumer<'static, 'static>, StreamCode> {
        let now = Instant::now();
        let mut answers = self.answers.borrow_mut();
        let free = answers.iter().position(|a| match a {
            None => true,
            Some(a) => {
                let st = a.group.state();
                st.furthest_read() >= st.bytes_written()
                    || now.duration_since(a.since) > ANSWER_HOLD
            }
        });
        let (Some(i), Some(state)) = (free, free.and_then(|i| self.tracks.get(i))) else {
            return Err(StreamCode::Evicted);
        };
        let info = track::Info::new(name)
            .map_err(|_| StreamCode::Internal)?
            .with_timescale(hang::TIMESCALE);
        // The previous answer's readers see their group go (it was read to its end).
        if let Some(slot) = answers.get_mut(i) {
            *slot = None;
        }
        let t = state.handle().reopen(info);
        let producer = t.producer().map_err(|_| StreamCode::Internal)?;
        let mut g = producer
            .create_group(group)
            .map_err(|_| StreamCode::Internal)?;
        for (ts, payload) in frames {
            if let Err(e) = g.write_frame(*ts, payload) {
                g.abort(StreamCode::Internal.to_code());
                return Err(match e {
                    group::WriteError::PoolExhausted | group::WriteError::GroupTooLarge => {
                        StreamCode::Evicted
                    }
                    _ => StreamCode::Internal,
                });
            }
        }
        g.finish().map_err(|_| StreamCode::Internal)?;
        let consumer = t.group(group).ok_or(StreamCode::Internal)?;
        if let Some(slot) = answers.get_mut(i) {
            *slot = Some(Answer {
                _producer: producer,
                group: g,
                since: now,
            });
        }
        Ok(consumer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replay_path_names_the_recording() {
        assert_eq!(recorded_path("anon/cam.hang/replay"), "anon/cam.hang");
        assert_eq!(recorded_path("anon/cam.hang"), "anon/cam.hang");
        assert_eq!(recorded_path("/replay"), "/replay");
    }
}
