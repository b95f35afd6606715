//! Example programs for skiff; see `src/bin/`.
//!
//! * `camera`: the host camera node. [`camera`] captures a moving test pattern and
//!   encodes it (run-length key frames, XOR-delta frames, a group per GOP); [`node`]
//!   publishes it through a relay with the monoio client.
//! * `viewer`: subscribes to a track through a relay and checks every frame, either
//!   against the test pattern of the mps2-an386 firmware
//!   (`boards/qemu-mps2-an386/src/pattern.rs`, shared by source;
//!   `boards/qemu-e2e.sh` runs it against the firmware under QEMU) or, for the host
//!   camera's frames, by decoding them with [`camera::Decoder`] and comparing the
//!   picture with [`camera::is_pattern`].

pub mod camera;
pub mod node;
