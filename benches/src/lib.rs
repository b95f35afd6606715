//! Shared helpers for skiff's benches and allocation audit.
