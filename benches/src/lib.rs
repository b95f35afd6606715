//! Shared helpers for skiff's benches and allocation audit.
//!
//! [`counting::Counting`] (skiff-testkit's) is a global allocator wrapper that
//! counts the heap allocations made by the current thread, so a test or bench
//! can prove that an operation makes none. [`fixture`] builds a node's media state (pool,
//! track, audience) once, the way a relay sizes its tables at start-up; the
//! audience is a fixed-capacity [`subscribers`] table.
//! [`audit`] holds the allocation audit's cases, shared by the `alloc_audit`
//! bench (which prints them) and `tests/alloc_audit.rs` (which requires zero).

pub mod audit;
pub use skiff_testkit::counting;
pub mod fixture;
pub mod subscribers;
