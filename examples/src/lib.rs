//! Example programs for skiff; see `src/bin/`.
//!
//! * `camera`: the host camera node, a command line over `skiff_media::node`,
//!   which publishes H.264 in moq-dev's hang format (a `catalog.json` track and
//!   a `video` track) from the stamped test pattern, a Y4M pipe or an Annex-B
//!   pipe, with the monoio client.
//! * `viewer`: subscribes through a relay and checks every frame: a hang
//!   broadcast is decoded with openh264 (continuity, stamps, latency, PNG
//!   output, or the boards' I_PCM test card checked sample by sample:
//!   `boards/qemu-e2e.sh` runs it against the firmware under QEMU); frames of
//!   the private run-length codec are checked with [`camera::Decoder`]. Its
//!   checks are [`viewer`], which tests also run in process.

pub mod camera;
pub mod viewer;
