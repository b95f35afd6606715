//! skiff-core: the sans-IO, `no_std`, allocation-free heart of skiff.
//!
//! It holds every protocol rule of moq-lite-05 over QMux (qmux-01) and every
//! memory and pacing decision a node makes; it performs no I/O, reads no clock
//! and spawns nothing. Backends (io_uring on Linux, embassy-net on
//! microcontrollers) move bytes and [`time::Instant`]s in and out.
//!
//! The media model, from the top: a [`model::broadcast`] holds tracks; a
//! [`model::track`] is a sequence of groups; a [`model::group`] is a sequence of
//! frames ([`model::frame`]), stored in blocks of a [`pool`] that every reader
//! shares. Subscribers ask for a [`window`] of groups. [`pacing`] bounds how
//! far a writer runs ahead of its fastest reader.
//!
//! With default features the crate needs no allocator at all.
#![no_std]
#![deny(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// Declared first so its macros are visible in every module below.
#[macro_use]
mod fmt;

#[cfg(any(test, feature = "alloc"))]
#[allow(unused_extern_crates)]
extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

pub mod conn;
pub mod hang;
pub mod model;
pub mod pacing;
pub mod pool;
pub mod relay;
pub mod session;
pub mod time;
pub mod transport;
pub mod window;
pub mod wire;
