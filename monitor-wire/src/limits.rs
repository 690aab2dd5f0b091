//! The format's fixed numbers, below every module that checks or reports them (the
//! encoder, the decoder, the MAC and the errors that name them).

/// First bytes of every frame.
pub const MAGIC: [u8; 4] = *b"RSWF";
/// The format version this crate writes and reads.
pub const VERSION: u8 = 1;
/// Default largest frame, MAC included: fits a 1500-byte Ethernet MTU with IPv6 and UDP headers.
pub(crate) const DEFAULT_MTU: usize = 1400;
/// Most samples one frame may carry (a bound for the decoder: a constant series costs a few
/// bytes for any number of samples).
pub const MAX_FRAME_SAMPLES: usize = 1 << 16;
/// Bytes of MAC at the end of every frame and schema request.
pub const MAC_LEN: usize = 16;
/// Smallest possible frame: header with an empty node name and no sections, plus the MAC.
pub const MIN_FRAME_LEN: usize = 4 + 1 + 1 + 1 + 4 + 1 + 8 + 1 + MAC_LEN;
