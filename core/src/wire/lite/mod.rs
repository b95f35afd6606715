//! moq-lite-05 messages (PROTOCOL.md §3).
