//! What every end-to-end test sets up before it starts a binary: a scratch directory, a
//! private wire key file, free loopback ports.

use std::{
    ffi::OsString,
    net::{TcpListener, UdpSocket},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use monitor_wire::Key;

/// The wire key most tests share (any 32 bytes do; a test that wants its own passes another).
pub const KEY_HEX: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

/// An empty directory `railscope-NAME-PID` under the system's temp directory (emptied if a
/// previous run left it).
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("railscope-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Copies the directory tree `from` to `to` (a fixture sysfs tree a test then changes).
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// `DIR/wire.key` holding `hex` (64 hex digits), private as a key file should be (the
/// binaries warn about others-readable ones).
pub fn key_file(dir: &Path, hex: &str) -> PathBuf {
    let path = dir.join("wire.key");
    std::fs::write(&path, format!("{hex}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// The key written as `hex` by [`key_file`].
pub fn key_from_hex(hex: &str) -> Key {
    assert_eq!(hex.len(), 64, "a wire key is 64 hex digits: {hex}");
    let bytes: Vec<u8> = (0..32)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    Key::from_bytes(bytes.try_into().unwrap())
}

/// A loopback UDP port nobody was bound to a moment ago.
pub fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A loopback TCP port nobody was bound to a moment ago.
pub fn free_tcp_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `args` with `--config /dev/null` added unless they name a configuration: a binary started
/// by a test reads the test's settings only, never the machine's `/etc/railscope/*.toml`
/// (a host with railscope installed would change what it does).
pub fn without_host_config(args: &[OsString]) -> Vec<OsString> {
    let mut out = args.to_vec();
    if !args.iter().any(|a| a == "--config") {
        out.extend(["--config".into(), "/dev/null".into()]);
    }
    out
}
