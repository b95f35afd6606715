//! [`Slice`]: a range of committed bytes in one block, owning a reference to it.

use core::fmt;
use core::ops::Deref;

use super::Block;

/// A range of committed bytes in one block, owning a reference to it.
///
/// Its address is fixed while it lives, so a backend can hand it to the kernel
/// (io_uring send) and let the reader move on.
#[derive(Clone)]
pub struct Slice<'p> {
    pub(super) block: Block<'p>,
    pub(super) start: u32,
    pub(super) end: u32,
}

impl<'p> Slice<'p> {
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // In range by construction (`Block::slice`), and committed bytes never shrink.
        self.block
            .data()
            .get(self.start as usize..self.end as usize)
            .unwrap_or(&[])
    }

    /// The block the bytes live in.
    #[cfg(test)]
    pub fn block(&self) -> &Block<'p> {
        &self.block
    }

    /// The pool the bytes live in.
    pub fn pool(&self) -> &'p super::Pool<'p> {
        self.block.pool()
    }

    /// Keeps only the first `len` bytes (all of them if `len` is not shorter).
    pub fn truncate(&mut self, len: usize) {
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        self.end = self.end.min(self.start.saturating_add(len));
    }
}

impl Deref for Slice<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl fmt::Debug for Slice<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slice")
            .field("block", &self.block.idx)
            .field("start", &self.start)
            .field("end", &self.end)
            .finish()
    }
}
