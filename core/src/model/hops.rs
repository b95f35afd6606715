//! A broadcast's route through a cluster of relays: the Hop IDs it crossed,
//! origin first, in a fixed array (docs/protocol.md §3.6, §4.3).
//!
//! A relay keeps one [`HopList`] per route it knows and per broadcast it
//! offers; an ANNOUNCE writes it as its hop list. The ordering of routes to one
//! path ([`HopList::rank`]) is the one moq-dev's relays use, so every node of a
//! mixed cluster picks the same route.

use core::fmt;

use crate::wire::lite::{Hops, MAX_HOPS};

/// Hop IDs, origin first, at most [`MAX_HOPS`]; `Copy` and heap-free.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct HopList {
    ids: [u64; MAX_HOPS],
    len: u8,
}

/// Why a hop could not be added to a [`HopList`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum HopError {
    /// The list holds [`MAX_HOPS`] entries already.
    Full,
    /// The non-zero ID is in the list already (a loop).
    Duplicate,
}

impl HopList {
    /// The empty list: a broadcast published by the node that offers it.
    pub const EMPTY: HopList = HopList {
        ids: [0; MAX_HOPS],
        len: 0,
    };

    /// The entries of `hops`, in order.
    ///
    /// # Errors
    /// [`HopError::Full`] past [`MAX_HOPS`] entries.
    pub fn from_hops(hops: Hops<'_>) -> Result<Self, HopError> {
        let mut list = HopList::EMPTY;
        for id in hops.iter() {
            list.push_any(id)?;
        }
        Ok(list)
    }

    /// The entries of `ids`, in order (duplicates are not looked for).
    ///
    /// # Errors
    /// [`HopError::Full`] past [`MAX_HOPS`] entries.
    pub fn from_slice(ids: &[u64]) -> Result<Self, HopError> {
        let mut list = HopList::EMPTY;
        for &id in ids {
            list.push_any(id)?;
        }
        Ok(list)
    }

    /// The IDs, origin first.
    pub fn as_slice(&self) -> &[u64] {
        self.ids.get(..usize::from(self.len)).unwrap_or(&[])
    }

    /// The list in its wire form (borrowed).
    pub fn as_hops(&self) -> Hops<'_> {
        Hops::new(self.as_slice())
    }

    /// How many entries.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the non-zero `id` is in the list (0 names nobody: false).
    pub fn contains(&self, id: u64) -> bool {
        id != 0 && self.as_slice().contains(&id)
    }

    /// The first hop: the node that published the broadcast (0: unknown).
    pub fn first(&self) -> Option<u64> {
        self.as_slice().first().copied()
    }

    /// Appends `id`; 0 (unknown) may repeat, a non-zero ID may not.
    ///
    /// # Errors
    /// [`HopError::Full`] or [`HopError::Duplicate`]; the list is unchanged.
    pub fn push(&mut self, id: u64) -> Result<(), HopError> {
        if self.contains(id) {
            return Err(HopError::Duplicate);
        }
        self.push_any(id)
    }

    fn push_any(&mut self, id: u64) -> Result<(), HopError> {
        let slot = self
            .ids
            .get_mut(usize::from(self.len))
            .ok_or(HopError::Full)?;
        *slot = id;
        self.len += 1;
        Ok(())
    }

    /// Names an unknown publisher (docs/protocol.md §4.3): a list that is
    /// empty or starts with 0 gets `stamp` in front (`[stamp, 0]` for the
    /// empty one), so a publisher without a Hop ID that reconnects is a new
    /// first hop; the 0 stays and keeps the route ranked anonymous.
    ///
    /// # Errors
    /// [`HopError::Full`] with no room for the stamp, [`HopError::Duplicate`]
    /// if `stamp` is in the list already; the list is unchanged.
    pub fn stamp(&mut self, stamp: u64) -> Result<(), HopError> {
        match self.first() {
            None => {
                let mut l = HopList::EMPTY;
                l.push_any(stamp)?;
                l.push_any(0)?;
                *self = l;
                Ok(())
            }
            Some(0) => {
                if self.contains(stamp) {
                    return Err(HopError::Duplicate);
                }
                let n = self.len();
                if n >= MAX_HOPS {
                    return Err(HopError::Full);
                }
                self.ids.copy_within(0..n, 1);
                self.ids[0] = stamp;
                self.len += 1;
                Ok(())
            }
            Some(_) => Ok(()),
        }
    }

    /// Whether the route crossed a hop that did not name itself (a 0 entry).
    pub fn is_anonymous(&self) -> bool {
        self.as_slice().contains(&0)
    }

    /// The tie-break key of this route to `path` among routes that cluster
    /// peers forwarded: FNV-1a (64 bits, moq-dev's seed) over the path's
    /// bytes, then each hop ID's eight bytes, least significant first. Every
    /// node computes the same value for the same route, so all of them pick
    /// the same one among equals, whichever build they run.
    pub fn tie_key(&self, path: &str) -> u64 {
        const BASIS: u64 = 0x0000_420C_0DEC_B00B;
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let mix = |h: u64, b: u8| (h ^ u64::from(b)).wrapping_mul(PRIME);
        let h = path.bytes().fold(BASIS, mix);
        self.as_slice()
            .iter()
            .fold(h, |h, id| id.to_le_bytes().into_iter().fold(h, mix))
    }

    /// The ordering key of this route to `path` (lower wins, docs/protocol.md
    /// §4.3): a route that crossed an anonymous hop last; then one published
    /// on this node (`local`) before a forwarded one; then the shorter list;
    /// then, for a route a cluster peer forwarded (`peer`), [`tie_key`]
    /// (others 0). Equal keys go to the newest announcement (the caller's
    /// order of arrival). On lite-05 no link carries a price, so every route
    /// costs the same and cost never decides.
    ///
    /// [`tie_key`]: HopList::tie_key
    pub fn rank(&self, path: &str, local: bool, peer: bool) -> (bool, bool, usize, u64) {
        (
            self.is_anonymous(),
            !local,
            self.len(),
            if peer { self.tie_key(path) } else { 0 },
        )
    }
}

impl Default for HopList {
    fn default() -> Self {
        HopList::EMPTY
    }
}

impl fmt::Debug for HopList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamping_names_an_unknown_publisher_and_keeps_it_anonymous() {
        let mut empty = HopList::EMPTY;
        empty.stamp(7).unwrap();
        assert_eq!(empty.as_slice(), [7, 0]);
        assert!(empty.is_anonymous());
        let mut zero = HopList::from_slice(&[0, 5]).unwrap();
        zero.stamp(7).unwrap();
        assert_eq!(zero.as_slice(), [7, 0, 5]);
        let mut named = HopList::from_slice(&[3, 5]).unwrap();
        named.stamp(7).unwrap();
        assert_eq!(named.as_slice(), [3, 5]);
        assert!(!named.is_anonymous());
        let full = HopList::from_slice(&[0; MAX_HOPS]).unwrap();
        assert_eq!(full.clone().stamp(7), Err(HopError::Full));
        assert_eq!(named.push(5), Err(HopError::Duplicate));
        assert_eq!(full.clone().push(0), Err(HopError::Full));
    }

    /// The key is FNV-1a with moq-dev's basis: pinned values, so a change
    /// that would split a mixed cluster fails here.
    #[test]
    fn the_tie_key_is_fnv1a_over_the_path_and_the_little_endian_ids() {
        assert_eq!(HopList::EMPTY.tie_key(""), 0x0000_420C_0DEC_B00B);
        // One byte: (basis ^ b) * prime, wrapping.
        let one = (0x0000_420C_0DEC_B00Bu64 ^ u64::from(b'a')).wrapping_mul(0x100_0000_01b3);
        assert_eq!(HopList::EMPTY.tie_key("a"), one);
        // An ID adds its eight bytes, least significant first.
        let mut h = 0x0000_420C_0DEC_B00Bu64;
        for b in 0x0102u64.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        assert_eq!(HopList::from_slice(&[0x0102]).unwrap().tie_key(""), h);
        let a = HopList::from_slice(&[1, 2]).unwrap();
        let b = HopList::from_slice(&[2, 1]).unwrap();
        assert_ne!(a.tie_key("cam"), b.tie_key("cam"));
    }

    #[test]
    fn ranking_puts_anonymous_last_then_local_then_short() {
        let anon = HopList::from_slice(&[9, 0]).unwrap();
        let long = HopList::from_slice(&[1, 2, 3]).unwrap();
        let short = HopList::from_slice(&[4, 5]).unwrap();
        assert!(long.rank("p", false, true) < anon.rank("p", true, false));
        assert!(short.rank("p", false, true) < long.rank("p", false, true));
        assert!(long.rank("p", true, false) < short.rank("p", false, true));
        // Only a peer's route is hashed.
        assert_eq!(short.rank("p", true, false).3, 0);
    }
}
