//! The shared session suite over the in-memory QUIC-like transport that
//! does not order streams ([`memory::Mem`](crate::session::harness::memory::Mem)
//! with `ORDERED` false): request streams' frames reach the session before
//! group streams' frames of the same step, so a subscription's END can
//! overtake the groups it covers, and the session's grace for late group
//! streams (docs/protocol.md §11.7) must keep every group.

use super::*;

/// The transport the suite runs over.
type Tr = crate::session::harness::memory::Mem<false>;

// Compiled once per transport on purpose: one file, one suite.
#[allow(clippy::duplicate_mod)]
#[path = "suite.rs"]
mod suite;
