//! Taking one message from the front of a control buffer of bounded size.

use crate::wire::DecodeError;
use crate::wire::lite::{Message, decode_message, decode_message_within};

/// Decodes a message that must fit `limit` bytes of buffer, telling a message
/// that is merely too long for our buffer ([`Too::Large`]) from a malformed one.
pub(in crate::session) fn decode_within<'m, M: Message<'m>>(
    data: &'m [u8],
    limit: usize,
) -> Result<(M, usize), Too> {
    match decode_message_within::<M>(data, limit) {
        Ok(v) => Ok(v),
        Err(DecodeError::Incomplete) => Err(Too::Incomplete),
        Err(DecodeError::TooLarge) => match decode_message::<M>(data) {
            // Within the protocol's limit but over our buffer: a resource limit.
            Ok(_) | Err(DecodeError::Incomplete) => Err(Too::Large),
            Err(_) => Err(Too::Malformed),
        },
        Err(_) => Err(Too::Malformed),
    }
}

/// Why a message could not be taken from a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::session) enum Too {
    Incomplete,
    Large,
    Malformed,
}
