//! The moq-lite session; being written.
