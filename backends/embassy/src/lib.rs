//! skiff-embassy: publish moq-lite tracks from a microcontroller over embassy-net TCP.
//!
//! Everything is caller-provided storage; this crate never allocates.
#![no_std]

pub mod clock;
