//! skiff-monoio: the Linux server and client backend of skiff.
//!
//! It drives `skiff-core`'s sans-IO sessions from monoio io_uring runtimes,
//! one per core. This module holds the pieces shared by the relay and client.

pub mod clock;
