//! The kernel's ethtool ioctl (`SIOCETHTOOL` on any socket of the agent's network namespace),
//! as far as statistics go: how many a netdev has (`ETHTOOL_GSSET_INFO`), their names
//! (`ETHTOOL_GSTRINGS`) and their values (`ETHTOOL_GSTATS`), the three requests `ethtool -S`
//! makes. The structures are `include/uapi/linux/ethtool.h`'s; every buffer is of `u64`, so
//! it is aligned for the structure laid over it.

use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GSTRINGS: u32 = 0x1b;
const ETHTOOL_GSTATS: u32 = 0x1d;
const ETHTOOL_GSSET_INFO: u32 = 0x37;
/// The string set of the statistics.
const ETH_SS_STATS: u32 = 1;
/// Bytes of one statistic's name, NUL-padded.
const ETH_GSTRING_LEN: usize = 32;
/// What the kernel may add between asking for the count and reading the names or values (a
/// driver whose set grows in between: the kernel writes as many as it has then): room that
/// is never written past.
const HEADROOM: usize = 64;

/// `struct ifreq`, with the `ifr_data` member of its union (40 bytes on 64-bit Linux).
#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _rest: [u8; 16],
}

/// Which request failed; named in errors as the kernel's header names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Request {
    GssetInfo,
    Gstrings,
    Gstats,
}

impl Request {
    pub(super) fn name(self) -> &'static str {
        match self {
            Request::GssetInfo => "ETHTOOL_GSSET_INFO",
            Request::Gstrings => "ETHTOOL_GSTRINGS",
            Request::Gstats => "ETHTOOL_GSTATS",
        }
    }
}

/// A socket to send ethtool requests through (`AF_INET`, `SOCK_DGRAM`: any socket does).
#[derive(Debug)]
pub(super) struct EthtoolSocket(OwnedFd);

impl EthtoolSocket {
    pub(super) fn open() -> io::Result<Self> {
        // SAFETY: plain socket(2); the descriptor is owned from here on.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just returned by socket(2), owned by nothing else.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// `SIOCETHTOOL` on `netdev` with `buf` as the request (its first `u32` the command).
    fn request(&self, netdev: &str, buf: &mut [u64]) -> io::Result<()> {
        let name = CString::new(netdev)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in the name"))?;
        let bytes = name.as_bytes_with_nul();
        if bytes.len() > libc::IFNAMSIZ {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "longer than a netdev name can be",
            ));
        }
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            data: buf.as_mut_ptr().cast(),
            _rest: [0; 16],
        };
        for (to, from) in req.name.iter_mut().zip(bytes) {
            *to = *from as libc::c_char;
        }
        // SAFETY: `req` names a netdev and points at `buf`, which is as large as the request
        // the kernel reads and writes: each caller sizes it for the count it asks for plus
        // HEADROOM, and the kernel writes no more than the count it reports.
        let rc = unsafe { libc::ioctl(self.0.as_raw_fd(), SIOCETHTOOL as _, &mut req) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// How many statistics `netdev` has (`ETHTOOL_GSSET_INFO` for `ETH_SS_STATS`): 0 when
    /// its driver has no statistics set.
    pub(super) fn stat_count(&self, netdev: &str) -> Result<u32, (Request, io::Error)> {
        // struct ethtool_sset_info: cmd u32, reserved u32, sset_mask u64, data[] u32.
        let mut buf = [0u64; 3];
        buf[0] = pair(ETHTOOL_GSSET_INFO, 0);
        buf[1] = 1 << ETH_SS_STATS;
        self.request(netdev, &mut buf)
            .map_err(|e| (Request::GssetInfo, e))?;
        if buf[1] & (1 << ETH_SS_STATS) == 0 {
            return Ok(0);
        }
        Ok(first_u32(buf[2]))
    }

    /// The names of `netdev`'s `count` statistics (`ETHTOOL_GSTRINGS`), in the order
    /// [`stats`](Self::stats) gives their values. Fewer when the driver has fewer now.
    pub(super) fn stat_names(
        &self,
        netdev: &str,
        count: u32,
    ) -> Result<Vec<String>, (Request, io::Error)> {
        // struct ethtool_gstrings: cmd u32, string_set u32, len u32, data[len * 32] u8.
        let capacity = count as usize + HEADROOM;
        let words = (12 + capacity * ETH_GSTRING_LEN).div_ceil(8);
        let mut buf = vec![0u64; words];
        buf[0] = pair(ETHTOOL_GSTRINGS, ETH_SS_STATS);
        buf[1] = pair(count, 0);
        self.request(netdev, &mut buf)
            .map_err(|e| (Request::Gstrings, e))?;
        let bytes: &[u8] = bytemuck_bytes(&buf);
        let len = u32::from_ne_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
        let len = len.min(capacity);
        Ok(bytes[12..12 + len * ETH_GSTRING_LEN]
            .chunks(ETH_GSTRING_LEN)
            .map(|raw| {
                let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
                String::from_utf8_lossy(&raw[..end]).into_owned()
            })
            .collect())
    }

    /// `netdev`'s statistics (`ETHTOOL_GSTATS`) into `values`, which is resized to as many
    /// as the kernel gave: `count` unless the driver's set changed since it was counted.
    pub(super) fn stats(
        &self,
        netdev: &str,
        count: u32,
        scratch: &mut Vec<u64>,
        values: &mut Vec<u64>,
    ) -> Result<(), (Request, io::Error)> {
        // struct ethtool_stats: cmd u32, n_stats u32, data[n_stats] u64.
        let capacity = count as usize + HEADROOM;
        scratch.clear();
        scratch.resize(1 + capacity, 0);
        scratch[0] = pair(ETHTOOL_GSTATS, count);
        self.request(netdev, scratch)
            .map_err(|e| (Request::Gstats, e))?;
        let n = (second_u32(scratch[0]) as usize).min(capacity);
        values.clear();
        values.extend_from_slice(&scratch[1..1 + n]);
        Ok(())
    }
}

/// Two `u32` fields laid in one `u64` word, in memory order.
fn pair(first: u32, second: u32) -> u64 {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&first.to_ne_bytes());
    b[4..].copy_from_slice(&second.to_ne_bytes());
    u64::from_ne_bytes(b)
}

fn first_u32(word: u64) -> u32 {
    u32::from_ne_bytes(word.to_ne_bytes()[..4].try_into().expect("4 bytes"))
}

fn second_u32(word: u64) -> u32 {
    u32::from_ne_bytes(word.to_ne_bytes()[4..].try_into().expect("4 bytes"))
}

/// The bytes of a `u64` buffer.
fn bytemuck_bytes(buf: &[u64]) -> &[u8] {
    // SAFETY: u8 has no alignment or validity requirement; the length is the buffer's in bytes.
    unsafe { std::slice::from_raw_parts(buf.as_ptr().cast(), std::mem::size_of_val(buf)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_laid_in_memory_order() {
        let w = pair(0x1d, 7);
        assert_eq!(first_u32(w), 0x1d);
        assert_eq!(second_u32(w), 7);
        assert_eq!(&bytemuck_bytes(&[w])[..4], &0x1du32.to_ne_bytes());
    }

    #[test]
    fn a_netdev_that_is_not_there_is_an_error_of_its_request() {
        let socket = EthtoolSocket::open().unwrap();
        let (request, e) = socket.stat_count("railscope-none0").unwrap_err();
        assert_eq!(request, Request::GssetInfo);
        assert_eq!(e.raw_os_error(), Some(libc::ENODEV), "{e}");
        let (_, e) = socket
            .stat_count("a-name-far-too-long-for-a-netdev")
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
