//! skiff-testkit: what the tests and benches of skiff's crates share, so
//! each exists once. Only ever a `[dev-dependencies]` entry (and a
//! dependency of the unpublished benches and interop tools); never
//! published.
//!
//! - [`counting`]: the counting global allocator (allocations and bytes per
//!   thread, live heap bytes);
//! - [`every`]: when a load generator prints its next progress line;
//! - `pki` (feature `pki`): a test CA and a server certificate it signed,
//!   as PEM files;
//! - [`relay_process`]: a `skiff-relay serve` child process on loopback
//!   (the caller names the binary), and where to find a `moq-relay`;
//! - `client` (feature `client`): sessions driven by hand with ready-made
//!   apps on skiff-monoio's session driver, for tests that count or order
//!   what the SDK hides;
//! - `watched` (feature `client`): a hang video track published through a
//!   relay with a live viewer kept on it, both SDK clients;
//! - `wait` (feature `client`): waiting for a change on a thread's
//!   `Notify` from a test task, with the session driver's API.

#[cfg(feature = "client")]
pub mod client;
pub mod counting;
pub mod every;
#[cfg(feature = "pki")]
pub mod pki;
pub mod relay_process;
#[cfg(feature = "client")]
pub mod wait;
#[cfg(feature = "client")]
pub mod watched;
