//! Helpers shared by the interop tests.
