//! The shared session suite over the in-memory stream transport shaped like
//! a QUIC library ([`memory::Mem`](crate::session::harness::memory::Mem)):
//! credit goes back as data leaves its receive queues, and the driver reads
//! only what the session has room for.

use super::*;

/// The transport the suite runs over.
type Tr = crate::session::harness::memory::Mem;

// Compiled once per transport on purpose: one file, one suite.
#[allow(clippy::duplicate_mod)]
#[path = "suite.rs"]
mod suite;
