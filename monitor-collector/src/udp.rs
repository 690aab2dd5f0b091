//! The collector's UDP sockets: several on one address with `SO_REUSEPORT` (the kernel spreads
//! senders over them by address, so each receive thread gets its share), a large receive
//! buffer, and batched receives with `recvmmsg`: up to [`BATCH`] datagrams per system call.
//! Each socket also reports, with `SO_RXQ_OVFL`, how many datagrams the kernel dropped
//! because its receive buffer was full, so those losses are counted too.

use std::{
    io,
    mem::MaybeUninit,
    net::{SocketAddr, UdpSocket},
    os::fd::AsRawFd as _,
    time::Duration,
};

use socket2::{Domain, Protocol, Socket, Type};

/// Datagrams read by one `recvmmsg` at most.
pub(crate) const BATCH: usize = 32;
/// The largest UDP payload.
const MAX_DATAGRAM: usize = 65_536;
/// Receive buffer asked for each socket (the kernel caps it at net.core.rmem_max).
const RECEIVE_BUFFER: usize = 32 << 20;

/// Binds `count` sockets to `addr` with `SO_REUSEPORT` (a port of 0: the first socket's port
/// for the others). Each has a read timeout of `timeout`, so its thread can notice a stop.
pub(crate) fn bind_group(
    addr: SocketAddr,
    count: usize,
    timeout: Duration,
) -> io::Result<Vec<UdpSocket>> {
    let mut sockets = Vec::with_capacity(count);
    let mut bound = addr;
    for _ in 0..count.max(1) {
        let socket = Socket::new(Domain::for_address(bound), Type::DGRAM, Some(Protocol::UDP))?;
        socket.set_reuse_port(true)?;
        if let Err(e) = socket.set_recv_buffer_size(RECEIVE_BUFFER) {
            tracing::debug!("SO_RCVBUF not raised: {e}");
        }
        set_int_option(&socket, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 1)?;
        socket
            .bind(&bound.into())
            .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on UDP {bound}: {e}")))?;
        socket.set_read_timeout(Some(timeout))?;
        let socket: UdpSocket = socket.into();
        bound = socket.local_addr()?;
        sockets.push(socket);
    }
    Ok(sockets)
}

fn set_int_option(socket: &Socket, level: i32, name: i32, value: libc::c_int) -> io::Result<()> {
    // SAFETY: a valid socket fd and a c_int option value of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Space for one SO_RXQ_OVFL control message (a u32), aligned for cmsghdr.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct ControlBuf([u8; 64]);

/// Buffers for one socket's batched receives.
pub(crate) struct BatchReceiver {
    buffers: Vec<Box<[u8]>>,
    addrs: Vec<MaybeUninit<libc::sockaddr_storage>>,
    iovecs: Vec<libc::iovec>,
    control: Vec<ControlBuf>,
    headers: Vec<libc::mmsghdr>,
    received: usize,
    /// The kernel's count of datagrams this socket dropped, as last reported.
    overflow_seen: u32,
    /// Drops reported since the last call to [`BatchReceiver::take_overflow`].
    overflow_new: u64,
}

impl Default for BatchReceiver {
    fn default() -> Self {
        Self::new()
    }
}

impl BatchReceiver {
    pub(crate) fn new() -> Self {
        Self {
            buffers: (0..BATCH)
                .map(|_| vec![0u8; MAX_DATAGRAM].into_boxed_slice())
                .collect(),
            addrs: vec![MaybeUninit::zeroed(); BATCH],
            iovecs: Vec::with_capacity(BATCH),
            control: vec![ControlBuf([0; 64]); BATCH],
            // SAFETY: mmsghdr is plain data; zero is a valid (empty) value.
            headers: (0..BATCH).map(|_| unsafe { std::mem::zeroed() }).collect(),
            received: 0,
            overflow_seen: 0,
            overflow_new: 0,
        }
    }

    /// Waits (up to the socket's read timeout) for at least one datagram and reads as many as
    /// are queued, up to [`BATCH`]. Returns how many: 0 when the timeout passed.
    pub(crate) fn recv(&mut self, socket: &UdpSocket) -> io::Result<usize> {
        self.received = 0;
        self.iovecs.clear();
        for buf in &mut self.buffers {
            self.iovecs.push(libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            });
        }
        for i in 0..BATCH {
            let h = &mut self.headers[i];
            h.msg_hdr.msg_name = self.addrs[i].as_mut_ptr().cast();
            h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
            h.msg_hdr.msg_iov = &mut self.iovecs[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = self.control[i].0.as_mut_ptr().cast();
            h.msg_hdr.msg_controllen = self.control[i].0.len() as _;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
        // SAFETY: every header points into buffers owned by self that outlive the call, with
        // their true lengths.
        let n = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                self.headers.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock
                | io::ErrorKind::TimedOut
                | io::ErrorKind::Interrupted => Ok(0),
                _ => Err(e),
            };
        }
        self.received = n as usize;
        for i in 0..self.received {
            if let Some(dropped) = self.overflow_count(i) {
                self.overflow_new += u64::from(dropped.wrapping_sub(self.overflow_seen));
                self.overflow_seen = dropped;
            }
        }
        Ok(self.received)
    }

    /// The kernel's drop count that came with datagram `i`, if any.
    fn overflow_count(&self, i: usize) -> Option<u32> {
        let hdr = &self.headers[i].msg_hdr;
        // SAFETY: the kernel filled msg_control up to msg_controllen; the CMSG macros stay
        // within it.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(hdr);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SO_RXQ_OVFL
                {
                    return Some(std::ptr::read_unaligned(
                        libc::CMSG_DATA(cmsg).cast::<u32>(),
                    ));
                }
                cmsg = libc::CMSG_NXTHDR(hdr, cmsg);
            }
        }
        None
    }

    /// Datagram `i` of the last batch and its sender.
    pub(crate) fn datagram(&self, i: usize) -> (&[u8], Option<SocketAddr>) {
        let h = &self.headers[i];
        let len = (h.msg_len as usize).min(MAX_DATAGRAM);
        // SAFETY: the kernel wrote a sockaddr of msg_namelen bytes into the storage (zeroed
        // beforehand, so reading it whole is defined).
        let storage = unsafe { self.addrs[i].assume_init_ref() };
        let addr = socket_addr(storage, h.msg_hdr.msg_namelen as usize);
        (&self.buffers[i][..len], addr)
    }

    /// Datagrams the kernel dropped on this socket (its receive buffer was full) that were
    /// reported since the last call.
    pub(crate) fn take_overflow(&mut self) -> u64 {
        std::mem::take(&mut self.overflow_new)
    }
}

/// An IPv4 or IPv6 sender's address from what recvmmsg wrote.
fn socket_addr(storage: &libc::sockaddr_storage, len: usize) -> Option<SocketAddr> {
    match i32::from(storage.ss_family) {
        libc::AF_INET if len >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says it is a sockaddr_in, and it fits in the storage.
            let a =
                unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::from((
                u32::from_be(a.sin_addr.s_addr).to_be_bytes(),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: the family says it is a sockaddr_in6, and it fits in the storage.
            let a = unsafe {
                &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                a.sin6_addr.s6_addr.into(),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_shares_one_port_and_batches_what_is_queued() {
        let sockets =
            bind_group("127.0.0.1:0".parse().unwrap(), 3, Duration::from_millis(50)).unwrap();
        let port = sockets[0].local_addr().unwrap().port();
        assert!(port != 0);
        assert!(
            sockets
                .iter()
                .all(|s| s.local_addr().unwrap().port() == port)
        );

        // One sender lands on one socket of the group (the kernel hashes its address).
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        for i in 0..10u8 {
            sender
                .send_to(&[i; 100][..usize::from(i) + 1], ("127.0.0.1", port))
                .unwrap();
        }
        let mut got = Vec::new();
        let mut receiver = BatchReceiver::new();
        for socket in &sockets {
            loop {
                let n = receiver.recv(socket).unwrap();
                if n == 0 {
                    break;
                }
                for i in 0..n {
                    let (bytes, from) = receiver.datagram(i);
                    assert_eq!(from, Some(sender.local_addr().unwrap()));
                    got.push(bytes.to_vec());
                }
            }
        }
        assert_eq!(got.len(), 10);
        for (i, d) in got.iter().enumerate() {
            assert_eq!(d, &vec![i as u8; i + 1]);
        }
        assert_eq!(receiver.take_overflow(), 0);
    }
}
