//! The shared session suite over QMux, the session's default transport.

use super::*;

/// The transport the suite runs over.
type Tr = Connection<32>;

// Compiled once per transport on purpose: one file, one suite.
#[allow(clippy::duplicate_mod)]
#[path = "suite.rs"]
pub(super) mod suite;
