//! QMux (qmux-01) wire format: records, frames and transport parameters (PROTOCOL.md §1–2).
