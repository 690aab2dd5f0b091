//! What the commands that start railscope's daemons on this machine (the benches,
//! `gpu-check`, the test bed's host collector) need around them: a fresh random key file and free loopback ports.

use std::{
    fs,
    io::Read as _,
    net::{TcpListener, UdpSocket},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

/// A new random key, as 64 hex digits, in `dir/wire.key` (mode 600).
pub(crate) fn write_key(dir: &Path) -> anyhow::Result<PathBuf> {
    let key = dir.join("wire.key");
    write_random_key(&key)?;
    Ok(key)
}

/// 32 random bytes as 64 hex digits in `path` (mode 600): a key, or a fleet secret.
pub(crate) fn write_random_key(path: &Path) -> anyhow::Result<()> {
    let mut bytes = [0u8; 32];
    fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    fs::write(path, hex + "\n")?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// A UDP port on loopback that was free a moment ago.
pub(crate) fn free_udp_port() -> anyhow::Result<u16> {
    Ok(UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A TCP port on loopback that was free a moment ago.
pub(crate) fn free_tcp_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
