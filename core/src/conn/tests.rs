//! Connection tests: a client and a server wired back to back in memory.
