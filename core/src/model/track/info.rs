//! What a track is: its [`Name`] and [`Info`] (the TRACK_INFO values), and
//! the memory [`Limits`] it is created with.

use core::fmt;
use core::num::NonZeroU64;

use crate::time::{Duration, Instant};
use crate::wire::lite::TrackInfo;

/// The longest track name a [`Name`] holds, in bytes.
pub const MAX_NAME_LEN: usize = 128;

/// moq-dev's default publisher priority (docs/protocol.md §3.7).
pub const DEFAULT_PRIORITY: u8 = 127;

/// moq-dev's default publisher max age: 5 s (docs/protocol.md §3.7).
pub const DEFAULT_MAX_AGE: Duration = Duration::from_millis(5000);

/// moq-dev's default timescale: milliseconds (docs/protocol.md §3.7).
pub const DEFAULT_TIMESCALE: NonZeroU64 = match NonZeroU64::new(1000) {
    Some(t) => t,
    None => panic!("1000 is not zero"),
};

/// A name longer than [`MAX_NAME_LEN`] bytes was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct NameTooLong;

impl fmt::Display for NameTooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("track name too long")
    }
}

impl core::error::Error for NameTooLong {}

/// A track name: an opaque string of at most [`MAX_NAME_LEN`] bytes, stored inline.
///
/// docs/protocol.md §3.2: track names are compared byte for byte and never
/// normalized. The name is owned (a relay builds it from a network buffer it
/// cannot keep) and `Copy` (so a track slot can be reused for another track).
#[derive(Clone, Copy)]
pub struct Name {
    len: u8,
    bytes: [u8; MAX_NAME_LEN],
}

const _: () = assert!(MAX_NAME_LEN <= u8::MAX as usize);

impl Name {
    /// The empty name.
    pub const EMPTY: Name = Name {
        len: 0,
        bytes: [0; MAX_NAME_LEN],
    };

    /// Copies `name`.
    ///
    /// # Errors
    /// [`NameTooLong`] beyond [`MAX_NAME_LEN`] bytes.
    pub const fn new(name: &str) -> Result<Name, NameTooLong> {
        let src = name.as_bytes();
        if src.len() > MAX_NAME_LEN {
            return Err(NameTooLong);
        }
        let mut bytes = [0u8; MAX_NAME_LEN];
        let mut i = 0;
        while i < src.len() {
            bytes[i] = src[i];
            i += 1;
        }
        Ok(Name {
            len: src.len() as u8,
            bytes,
        })
    }

    /// The name's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..self.len as usize).unwrap_or(&[])
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        // Always valid: the bytes were copied from a `&str`.
        core::str::from_utf8(self.as_bytes()).unwrap_or("")
    }

    /// Length in bytes.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the name is empty.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Default for Name {
    fn default() -> Self {
        Name::EMPTY
    }
}

impl PartialEq for Name {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Name {}

impl core::hash::Hash for Name {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for Name {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(f, "{=str}", self.as_str())
    }
}

/// What a track is: its name and the TRACK_INFO values (docs/protocol.md §3.7).
///
/// The values are immutable for the life of the track; a relay re-serves
/// exactly what it received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Info {
    /// The track name within its broadcast.
    pub name: Name,
    /// Publisher priority, a tie-break only (default [`DEFAULT_PRIORITY`]).
    pub priority: u8,
    /// How long non-latest groups are kept, in presentation time (default [`DEFAULT_MAX_AGE`]).
    pub max_age: Duration,
    /// Timestamp units per second (default [`DEFAULT_TIMESCALE`]).
    pub timescale: NonZeroU64,
}

impl Info {
    /// A track called `name` with moq-dev's defaults.
    ///
    /// # Errors
    /// [`NameTooLong`] beyond [`MAX_NAME_LEN`] bytes.
    pub const fn new(name: &str) -> Result<Info, NameTooLong> {
        match Name::new(name) {
            Ok(name) => Ok(Info {
                name,
                priority: DEFAULT_PRIORITY,
                max_age: DEFAULT_MAX_AGE,
                timescale: DEFAULT_TIMESCALE,
            }),
            Err(e) => Err(e),
        }
    }

    /// A track called `name` with the values of a received TRACK_INFO.
    ///
    /// # Errors
    /// [`NameTooLong`] beyond [`MAX_NAME_LEN`] bytes.
    pub const fn from_wire(name: &str, info: TrackInfo) -> Result<Info, NameTooLong> {
        match Name::new(name) {
            Ok(name) => Ok(Info {
                name,
                priority: info.priority,
                max_age: info.max_age,
                timescale: info.timescale,
            }),
            Err(e) => Err(e),
        }
    }

    /// The TRACK_INFO message for this track.
    pub const fn to_wire(&self) -> TrackInfo {
        TrackInfo {
            priority: self.priority,
            max_age: self.max_age,
            timescale: self.timescale,
        }
    }

    /// Sets the publisher priority.
    pub const fn with_priority(mut self, priority: u8) -> Self {
        self.priority = priority;
        self
    }

    /// Sets the publisher max age.
    pub const fn with_max_age(mut self, max_age: Duration) -> Self {
        self.max_age = max_age;
        self
    }

    /// Sets the timescale.
    pub const fn with_timescale(mut self, timescale: NonZeroU64) -> Self {
        self.timescale = timescale;
        self
    }

    /// `timestamp` (in this track's timescale) as an instant in microseconds, saturating.
    pub const fn instant(&self, timestamp: u64) -> Instant {
        let micros = timestamp as u128 * 1_000_000 / self.timescale.get() as u128;
        Instant::from_micros(if micros > u64::MAX as u128 {
            u64::MAX
        } else {
            micros as u64
        })
    }
}

/// Memory limits of a track.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Limits {
    /// The largest group in bytes (FRAME headers included); a write past it
    /// fails with [`group::WriteError::GroupTooLarge`](crate::model::group::WriteError::GroupTooLarge).
    pub group_bytes: u64,
    /// The byte budget of the cache: pool blocks held by this track's groups,
    /// times the block size. Writing past it evicts the oldest non-latest
    /// groups. It is also each group's retain limit: a group that grows past
    /// it is trimmed (see the module docs) instead of holding all its bytes.
    pub cache_bytes: u64,
}

impl Limits {
    /// No limit but the pool's.
    pub const NONE: Limits = Limits {
        group_bytes: u64::MAX,
        cache_bytes: u64::MAX,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::NONE
    }
}
