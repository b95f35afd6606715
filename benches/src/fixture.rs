//! A node's media state for benches and the allocation audit: one pool, one
//! track with a few groups, and an audience of subscribers.
//!
//! Storage is sized once at start-up and leaked, as a relay sizes its tables
//! from its configuration; everything after [`Node::new`] runs on it without
//! touching the heap.

use skiff_core::model::track::{self, Info};
use skiff_core::pool::{BlockMeta, Pool};
use skiff_core::subscribers::{BoxedSubscribers, Id, TableFull};
use skiff_core::window::{Request, Window, WindowError};

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
        let meta: &'static mut [BlockMeta] =
            Box::leak((0..blocks).map(|_| BlockMeta::new()).collect::<Vec<_>>().into_boxed_slice());
        let pool: &'static Pool<'static> =
            Box::leak(Box::new(Pool::from_parts(bytes, meta).expect("pool layout")));
        let info = Info::new("video").expect("short name");
        let track: &'static track::State<'static, GROUPS> =
            Box::leak(Box::new(track::State::new(pool, info)));
        let producer = track.producer().expect("a new track has no producer");
        Node { pool, track, producer }
    }

    /// Writes one group of `frames` frames of `frame_len` bytes; returns its sequence.
    pub fn write_group(&self, frames: usize, frame_len: usize) -> u64 {
        let payload = vec![0x5au8; frame_len];
        let mut group = self.producer.append_group().expect("group slot");
        for i in 0..frames {
            group.write_frame(i as u64 * 33, &payload).expect("pool room");
        }
        group.finish().expect("finish");
        group.sequence()
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
    audience.join(Viewer { window, reader }).map_err(JoinError::Full)
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
