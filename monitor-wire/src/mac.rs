//! The MAC of frames and schema requests: the first 16 bytes of keyed BLAKE3 over every byte
//! before it, checked in constant time before anything else is read.

use crate::{error::WireError, key::Key};

pub use crate::limits::MAC_LEN;

/// The MAC of `body`.
pub(crate) fn mac(key: &Key, body: &[u8]) -> [u8; MAC_LEN] {
    let mut mac = [0u8; MAC_LEN];
    mac.copy_from_slice(&blake3::keyed_hash(key.bytes(), body).as_bytes()[..MAC_LEN]);
    mac
}

/// Appends the MAC of everything in `out`.
pub(crate) fn seal(out: &mut Vec<u8>, key: &Key) {
    let tag = mac(key, out);
    out.extend_from_slice(&tag);
}

/// Checks the MAC of a datagram of at least `min` bytes (MAC included) and returns the
/// authenticated bytes (everything before it).
pub(crate) fn verify<'a>(bytes: &'a [u8], key: &Key, min: usize) -> Result<&'a [u8], WireError> {
    let len = bytes.len();
    if len < min {
        return Err(WireError::TooShort { len });
    }
    let (body, tag) = bytes.split_at(len - MAC_LEN);
    let expected = mac(key, body);
    // Constant time: the comparison does not stop at the first differing byte.
    let diff = expected
        .iter()
        .zip(tag)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    if diff != 0 {
        return Err(WireError::BadMac { len });
    }
    Ok(body)
}
