//! Example programs for skiff; see `src/bin/`.
//!
//! * `viewer`: subscribes to a track through a relay and checks every frame against the
//!   test pattern of the mps2-an386 firmware (`boards/qemu-mps2-an386/src/pattern.rs`,
//!   shared by source). `boards/qemu-e2e.sh` runs it against the firmware under QEMU.
