//! A node's media state for benches and the allocation audit: one pool, one
//! track with a few groups, and an audience of subscribers.
//!
//! Storage is sized once at start-up and leaked, as a relay sizes its tables
//! from its configuration; everything after [`Node::new`] runs on it without
//! touching the heap.
//!
//! Readers: a [`Viewer`] is a registered subscriber (window + track reader);
//! a [`Follower`] reads the track's frames from group to group as a viewer's
//! player does, and [`read_group`] reads one group's frames to where its
//! writer is.

use crate::subscribers::{BoxedSubscribers, Id, TableFull};
use skiff_core::model::group::{self, Next};
use skiff_core::model::track::{self, Info};
use skiff_core::pool::{BlockMeta, Pool};
use skiff_core::window::{Request, Start, Window, WindowError};

/// Group slots per track in the fixture.
pub const GROUPS: usize = 8;

/// Disjoint ranges a subscriber window holds inline.
pub const RANGES: usize = 4;

/// The largest audience the fixture's table holds.
pub const MAX_AUDIENCE: usize = 16_384;

/// One subscriber of the track: its window and its reader.
pub struct Viewer {
    /// The groups this subscriber still wants.
    pub window: Window<RANGES>,
    /// Its own position in the track.
    pub reader: track::Consumer<'static, 'static>,
}

/// The audience table of one track.
pub type Audience = BoxedSubscribers<Viewer, MAX_AUDIENCE>;

/// Why a join was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinError {
    /// The request does not resolve against the track.
    Window(WindowError),
    /// The audience table is full.
    Full(TableFull),
}

/// A pool and a track over it, leaked for the life of the process.
pub struct Node {
    /// The block pool every group is stored in.
    pub pool: &'static Pool<'static>,
    /// The track the audience subscribes to.
    pub track: &'static track::State<'static, GROUPS>,
    /// The track's one writer, kept for the node's life (dropping it would end the track).
    pub producer: track::Producer<'static, 'static>,
}

impl Node {
    /// A node with `blocks` pool blocks of `block_size` bytes and an empty track.
    pub fn new(blocks: usize, block_size: usize) -> Node {
        let bytes: &'static mut [u8] = Box::leak(vec![0u8; blocks * block_size].into_boxed_slice());
        let meta: &'static mut [BlockMeta] = Box::leak(
            (0..blocks)
                .map(|_| BlockMeta::new())
                .collect::<Vec<_>>()
                .into_boxed_slice(),
        );
        let pool: &'static Pool<'static> = Box::leak(Box::new(
            Pool::from_parts(bytes, meta).expect("pool layout"),
        ));
        let info = Info::new("video").expect("short name");
        let track: &'static track::State<'static, GROUPS> =
            Box::leak(Box::new(track::State::new(pool, info)));
        let producer = track.producer().expect("a new track has no producer");
        Node {
            pool,
            track,
            producer,
        }
    }

    /// Writes one group of `frames` frames of `frame_len` bytes; returns its sequence.
    pub fn write_group(&self, frames: usize, frame_len: usize) -> u64 {
        let payload = vec![0x5au8; frame_len];
        let mut group = self.producer.append_group().expect("group slot");
        for i in 0..frames {
            group
                .write_frame(i as u64 * 33, &payload)
                .expect("pool room");
        }
        group.finish().expect("finish");
        group.sequence()
    }

    /// A group slot outside the track, over the node's pool, leaked for the life
    /// of the process: for cases that drive one group's life by hand
    /// ([`group::State::reset`] … [`group::State::clear`]).
    pub fn group_slot(&self, max_bytes: u64) -> &'static group::State<'static> {
        Box::leak(Box::new(group::State::new(self.pool, max_bytes)))
    }

    /// A [`Follower`] of the node's track from `start`.
    pub fn follower(&self, start: Start) -> Follower {
        Follower {
            reader: self.track.consumer(start),
            group: None,
        }
    }
}

/// Frames and payload bytes a read went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Drained {
    /// FRAME headers read.
    pub frames: u64,
    /// Payload bytes read.
    pub bytes: u64,
}

impl core::ops::AddAssign for Drained {
    fn add_assign(&mut self, rhs: Drained) {
        self.frames += rhs.frames;
        self.bytes += rhs.bytes;
    }
}

/// What [`read_group`] stopped at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupEnd {
    /// The writer has not written more yet.
    Pending,
    /// The group is finished and was read to its end.
    Finished,
    /// The group was aborted or its slot reused.
    Gone,
}

/// Reads `group`'s frames from where it stands to where its writer is, handing
/// every payload chunk to `sink` (zero-copy: the chunk is a view of a pool
/// block); adds what it read to `out`.
#[inline]
pub fn read_group(
    group: &mut group::Consumer<'_, '_>,
    out: &mut Drained,
    mut sink: impl FnMut(&[u8]),
) -> GroupEnd {
    loop {
        // Payload of the frame being read (a frame can be streamed in pieces).
        while group.payload_remaining() > 0 {
            match group.payload_chunk() {
                Ok(Next::Ready(chunk)) => {
                    let n = chunk.len();
                    sink(chunk);
                    group.advance(n);
                    out.bytes += n as u64;
                }
                Ok(Next::Pending) => return GroupEnd::Pending,
                Ok(Next::Finished) => break,
                Err(_) => return GroupEnd::Gone,
            }
        }
        match group.read_frame_header() {
            Ok(Next::Ready(_)) => out.frames += 1,
            Ok(Next::Pending) => return GroupEnd::Pending,
            Ok(Next::Finished) => return GroupEnd::Finished,
            Err(_) => return GroupEnd::Gone,
        }
    }
}

/// A reader of the track that goes from group to group in sequence order and
/// reads every frame of each, as a viewer's player does.
pub struct Follower {
    /// Its position in the track.
    pub reader: track::Consumer<'static, 'static>,
    /// The group it is in, if it has one.
    pub group: Option<group::Consumer<'static, 'static>>,
}

impl Follower {
    /// Reads everything written so far (finishing groups and moving on to the
    /// next ones), handing each payload chunk to `sink`; returns what it read.
    #[inline]
    pub fn drain(&mut self, mut sink: impl FnMut(&[u8])) -> Drained {
        let mut out = Drained::default();
        loop {
            let Some(group) = self.group.as_mut() else {
                match self.reader.next_group() {
                    Ok(track::Next::Ready(g)) => {
                        self.group = Some(g);
                        continue;
                    }
                    Ok(track::Next::Lagged(_)) => continue,
                    Ok(track::Next::Pending | track::Next::Finished) | Err(_) => return out,
                }
            };
            match read_group(group, &mut out, &mut sink) {
                GroupEnd::Pending => return out,
                GroupEnd::Finished | GroupEnd::Gone => self.group = None,
            }
        }
    }
}

/// A subscriber joins: its request is resolved against the live edge, it gets a
/// reader at the first group it wants, and it is registered in the audience.
///
/// # Errors
/// [`JoinError`] when the window cannot be resolved or the table is full.
#[inline]
pub fn join(audience: &mut Audience, node: &Node, request: Request) -> Result<Id, JoinError> {
    let window = Window::resolve(request, node.track).map_err(JoinError::Window)?;
    let start = match window.first(node.track) {
        Some(seq) => skiff_core::window::Start::Group(seq),
        None => request.start,
    };
    let reader = node.track.consumer(start);
    audience
        .join(Viewer { window, reader })
        .map_err(JoinError::Full)
}

/// A subscriber leaves; false if `id` was not in the audience.
#[inline]
pub fn leave(audience: &mut Audience, id: Id) -> bool {
    audience.leave(id).is_some()
}

/// An audience of `n` steady subscribers of the node's track, from the live edge.
pub fn audience(node: &Node, n: usize) -> Audience {
    let mut a = Audience::new();
    for _ in 0..n {
        join(&mut a, node, Request::LIVE).expect("room for the steady audience");
    }
    a
}
