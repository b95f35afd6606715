//! The write side's staging buffer and the vectored write it becomes.
//!
//! A sans-IO session writes its records into the buffer's spare room and
//! [`Staging::commit`]s them. With `Staging::spare_and_gather` it writes
//! only the records' headers there and leaves group payload in the block pool:
//! each payload range is kept (sharing its block) with the staged position it
//! follows. [`Staging::take`] turns the lot into an [`Outgoing`], one
//! `writev` of header bytes and pool ranges in wire order, so the kernel
//! copies payload straight from the pool: no user-space copy per subscriber.

use skiff_core::pool;
use skiff_core::session::Gather;

/// Most payload ranges one staging buffer gathers before it must be sent.
pub const GATHER_RANGES: usize = 16;

/// Largest iovec count one `writev` is given (Linux `IOV_MAX`).
const IOV_MAX: usize = 1024;

/// A write staging buffer, with a count of the bytes staged and the pool
/// ranges gathered between them. Its bytes are initialized (zeroed) as they
/// are first reserved, not all when it is made: a buffer that only ever
/// staged record headers touches a few KiB of its capacity.
#[derive(Debug, Default)]
pub struct Staging {
    /// Initialized up to `len()`, the most ever reserved.
    buf: Vec<u8>,
    /// Bytes staged at the front of `buf`.
    filled: usize,
    /// Pool ranges to send after the given number of staged bytes, in order.
    ranges: Vec<(usize, pool::Slice<'static>)>,
    /// Bytes in `ranges`.
    gathered: usize,
    /// The iovec list of the last write (kept for its allocation).
    iov: Vec<libc::iovec>,
}

impl Staging {
    /// A staging buffer over `buf`'s allocation (its bytes are dropped).
    pub fn new(mut buf: Vec<u8>) -> Self {
        buf.clear();
        Staging {
            buf,
            filled: 0,
            ranges: Vec::with_capacity(GATHER_RANGES),
            gathered: 0,
            iov: Vec::with_capacity(2 * GATHER_RANGES + 2),
        }
    }

    /// Makes room for at least `total` staged bytes (zeroes what was never
    /// reserved before; allocates only past the capacity).
    pub fn reserve(&mut self, total: usize) {
        if self.buf.len() < total {
            self.buf.resize(total, 0);
        }
    }

    /// Bytes the allocation holds.
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Bytes that can still be staged without allocating.
    pub(crate) fn room_left(&self) -> usize {
        self.buf.capacity().saturating_sub(self.filled)
    }

    /// Bytes to send: staged and gathered.
    pub fn len(&self) -> usize {
        self.filled + self.gathered
    }

    /// Whether nothing is staged or gathered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether no more payload ranges can be gathered before a send.
    pub(crate) fn is_gather_full(&self) -> bool {
        self.ranges.len() >= GATHER_RANGES
    }

    /// The staged bytes (without the gathered ranges).
    pub(crate) fn staged(&self) -> &[u8] {
        self.buf.get(..self.filled).unwrap_or(&[])
    }

    /// The room after the staged bytes, and where a gathered transmit puts
    /// payload ranges (positions relative to the room's start).
    pub(crate) fn spare_and_gather(&mut self) -> (&mut [u8], impl Gather<'static> + '_) {
        let base = self.filled;
        let room = self.buf.get_mut(self.filled..).unwrap_or(&mut []);
        let sink = Sink {
            base,
            ranges: &mut self.ranges,
            gathered: &mut self.gathered,
        };
        (room, sink)
    }

    /// Stages the first `n` bytes of the spare room (at most all of it).
    pub fn commit(&mut self, n: usize) {
        self.filled = self.filled.saturating_add(n).min(self.buf.len());
    }

    /// Stages a copy of `data`, growing the buffer if it does not fit.
    pub fn extend_from_slice(&mut self, data: &[u8]) {
        let end = self.filled + data.len();
        self.reserve(end);
        if let Some(room) = self.buf.get_mut(self.filled..end) {
            room.copy_from_slice(data);
            self.filled = end;
        }
    }

    /// The staged bytes and the pool ranges gathered between them (each with
    /// the staged position it follows), for a writer that reframes them.
    pub fn parts(&self) -> (&[u8], &[(usize, pool::Slice<'static>)]) {
        (self.staged(), &self.ranges)
    }

    /// Gathers `slice` after the bytes staged so far (sent from its block, not copied).
    pub(crate) fn gather(&mut self, slice: pool::Slice<'static>) {
        self.gathered += slice.len();
        self.ranges.push((self.filled, slice));
    }

    /// The staged bytes `start..end`, to change in place (e.g. mask them).
    pub(crate) fn spare_staged(&mut self, start: usize, end: usize) -> Option<&mut [u8]> {
        self.buf.get_mut(..self.filled)?.get_mut(start..end)
    }

    /// Drops everything staged and gathered (the ranges let go of their blocks).
    pub fn clear(&mut self) {
        self.filled = 0;
        self.ranges.clear();
        self.gathered = 0;
    }

    /// Takes everything to send out for a write (the buffer is empty until
    /// [`Staging::restore`]).
    pub fn take(&mut self) -> Outgoing {
        let total = self.len();
        let mut out = Outgoing {
            buf: std::mem::take(&mut self.buf),
            filled: std::mem::take(&mut self.filled),
            ranges: std::mem::take(&mut self.ranges),
            iov: std::mem::take(&mut self.iov),
            sent: 0,
            total,
        };
        self.gathered = 0;
        out.prepare();
        out
    }

    /// Puts back the allocations a write returned; nothing is staged then,
    /// and the gathered ranges let go of their blocks.
    pub fn restore(&mut self, mut written: Outgoing) {
        written.ranges.clear();
        written.iov.clear();
        self.buf = written.buf;
        self.ranges = written.ranges;
        self.iov = written.iov;
        self.filled = 0;
        self.gathered = 0;
    }
}

/// The [`Gather`] of a [`Staging`] during one transmit call.
struct Sink<'b> {
    /// Staged bytes before the call's room.
    base: usize,
    ranges: &'b mut Vec<(usize, pool::Slice<'static>)>,
    gathered: &'b mut usize,
}

impl Gather<'static> for Sink<'_> {
    fn room(&self) -> usize {
        GATHER_RANGES.saturating_sub(self.ranges.len())
    }

    fn push(&mut self, at: usize, slice: pool::Slice<'static>) {
        *self.gathered += slice.len();
        self.ranges.push((self.base + at, slice));
    }
}

/// Staged bytes and the pool ranges between them, owned by one vectored
/// write while the kernel reads them (the ranges keep their blocks alive).
#[derive(Debug)]
pub struct Outgoing {
    buf: Vec<u8>,
    filled: usize,
    ranges: Vec<(usize, pool::Slice<'static>)>,
    /// The unsent bytes as iovecs, rebuilt by `prepare`.
    iov: Vec<libc::iovec>,
    /// Bytes written so far.
    sent: usize,
    /// Bytes in all.
    total: usize,
}

impl Outgoing {
    /// Bytes left to write.
    pub fn remaining(&self) -> usize {
        self.total - self.sent
    }

    /// Bytes written so far.
    pub fn sent(&self) -> usize {
        self.sent
    }

    /// Notes that the kernel took `n` more bytes and points the iovecs at the rest.
    pub fn advance(&mut self, n: usize) {
        self.sent = (self.sent + n).min(self.total);
        self.prepare();
    }

    /// Rebuilds the iovec list for the bytes not sent yet, in wire order:
    /// staged bytes up to each range's position, the range, and so on.
    fn prepare(&mut self) {
        self.iov.clear();
        let mut skip = self.sent;
        let mut staged = 0;
        let ranges = self.ranges.iter().map(|(at, s)| (*at, s.as_bytes()));
        let tail = core::iter::once((self.filled, &[][..]));
        for (at, payload) in ranges.chain(tail) {
            let head = self.buf.get(staged..at).unwrap_or(&[]);
            staged = at;
            for part in [head, payload] {
                if self.iov.len() == IOV_MAX {
                    return;
                }
                if skip >= part.len() {
                    skip -= part.len();
                    continue;
                }
                let rest = &part[skip..];
                skip = 0;
                self.iov.push(libc::iovec {
                    iov_base: rest.as_ptr().cast_mut().cast(),
                    iov_len: rest.len(),
                });
            }
        }
    }
}

// SAFETY: `iov` points into `buf` (a heap allocation that neither moves nor
// changes while the write owns this value) and into pool blocks that `ranges`
// keeps referenced (their bytes are committed and never change or move while
// a reference lives); `prepare` only runs while no write owns the value.
unsafe impl monoio::buf::IoVecBuf for Outgoing {
    fn read_iovec_ptr(&self) -> *const libc::iovec {
        self.iov.as_ptr()
    }

    fn read_iovec_len(&self) -> usize {
        self.iov.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes the iovecs of `out` describe, in order.
    fn wire(out: &Outgoing) -> Vec<u8> {
        out.iov
            .iter()
            // SAFETY: the iovecs describe live bytes of `out` (see `prepare`).
            .flat_map(|v| unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len) })
            .copied()
            .collect()
    }

    #[test]
    fn gathered_ranges_go_between_the_staged_bytes() {
        let pool = crate::tables::process_pool(0);
        let mut block = pool.alloc().unwrap();
        block.append(b"PAYLOAD-one|PAYLOAD-two");
        let shared = block.into_shared();

        let mut st = Staging::new(Vec::with_capacity(64));
        st.extend_from_slice(b"ctl;");
        st.reserve(st.staged().len() + 16);
        {
            let (room, mut sink) = st.spare_and_gather();
            room[..3].copy_from_slice(b"h1;");
            sink.push(3, shared.clone().slice(0, 11).unwrap());
            room[3..6].copy_from_slice(b"h2;");
            sink.push(6, shared.clone().slice(12, 23).unwrap());
            room[6..10].copy_from_slice(b";end");
        }
        st.commit(10);
        assert_eq!(st.len(), 14 + 22);
        assert_eq!(shared.ref_count(), 3);

        let mut out = st.take();
        let all = b"ctl;h1;PAYLOAD-oneh2;PAYLOAD-two;end".to_vec();
        assert_eq!(wire(&out), all);
        // A partial write: the rest starts mid-range.
        out.advance(10);
        assert_eq!(wire(&out), all[10..]);
        out.advance(all.len() - 10 - 2);
        assert_eq!(wire(&out), b"nd");
        out.advance(2);
        assert_eq!(out.remaining(), 0);
        assert!(wire(&out).is_empty());

        st.restore(out);
        assert!(st.is_empty());
        // The ranges let go of their block.
        assert_eq!(shared.ref_count(), 1);
    }
}
