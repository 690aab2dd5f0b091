//! The pre-shared key of a cluster and its file.

use std::{
    fmt,
    io::Read as _,
    path::{Path, PathBuf},
};

/// Errors of loading the pre-shared key.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read key file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("key file {path}: expected 32 raw bytes or 64 hex characters, found {len} bytes")]
    Length { path: PathBuf, len: usize },
    #[error("key file {path}: 64 characters but not all hex digits")]
    Hex { path: PathBuf },
}

/// The pre-shared key of a cluster: 32 bytes, used as the BLAKE3 key of the frame MAC.
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; 32]);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Key {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// Reads a key file: exactly 32 raw bytes, or 64 hex characters (a trailing newline or
    /// other trailing whitespace is fine). Errors name the file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, KeyError> {
        let path = path.as_ref();
        // A key file is tiny: read at most a little more than the longest valid one, so a
        // wrong path (a device, a log) is an error and not a hang.
        let mut contents = Vec::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(256).read_to_end(&mut contents))
            .map_err(|source| KeyError::Read {
                path: path.to_owned(),
                source,
            })?;
        let key = Self::parse(&contents, path)?;
        warn_if_readable_by_others(path);
        Ok(key)
    }

    fn parse(contents: &[u8], path: &Path) -> Result<Self, KeyError> {
        if let Ok(raw) = <[u8; 32]>::try_from(contents) {
            return Ok(Self(raw));
        }
        let text = contents.trim_ascii_end();
        if text.len() != 64 {
            return Err(KeyError::Length {
                path: path.to_owned(),
                len: contents.len(),
            });
        }
        let mut key = [0u8; 32];
        for (byte, pair) in key.iter_mut().zip(text.chunks_exact(2)) {
            let hex = |c: u8| (c as char).to_digit(16);
            match (hex(pair[0]), hex(pair[1])) {
                (Some(hi), Some(lo)) => *byte = (hi * 16 + lo) as u8,
                _ => {
                    return Err(KeyError::Hex {
                        path: path.to_owned(),
                    });
                }
            }
        }
        Ok(Self(key))
    }

    /// The key as 64 lowercase hex characters, as a key file holds it.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The key's bytes, for the MAC.
    pub(crate) fn bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            "key file {} is readable by group or others (mode {:o}); chmod 600 it",
            path.display(),
            meta.permissions().mode() & 0o777
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::key;

    #[test]
    fn key_file_accepts_raw_bytes_and_hex_with_newline() {
        let dir = std::env::temp_dir().join(format!("railscope-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let raw = dir.join("raw.key");
        let mut bytes = [7u8; 32];
        bytes[31] = b'\n'; // a raw key may end in a newline byte: 32 bytes are always raw
        std::fs::write(&raw, bytes).unwrap();
        assert_eq!(Key::from_file(&raw).unwrap(), Key::from_bytes(bytes));

        let hex = dir.join("hex.key");
        let text: String = (0u8..32).map(|b| format!("{b:02x}")).collect();
        std::fs::write(&hex, format!("{text}\n")).unwrap();
        let expected: Vec<u8> = (0u8..32).collect();
        assert_eq!(
            Key::from_file(&hex).unwrap(),
            Key::from_bytes(expected.try_into().unwrap())
        );
        std::fs::write(&hex, text.to_uppercase()).unwrap();
        assert_eq!(
            Key::from_file(&hex).unwrap(),
            Key::from_bytes((0u8..32).collect::<Vec<_>>().try_into().unwrap())
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn key_file_errors_name_the_file() {
        let dir = std::env::temp_dir().join(format!("railscope-badkey-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let short = dir.join("short.key");
        std::fs::write(&short, "abcd\n").unwrap();
        let e = Key::from_file(&short).unwrap_err().to_string();
        assert!(
            e.contains("short.key") && e.contains("found 5 bytes"),
            "{e}"
        );

        let not_hex = dir.join("nothex.key");
        std::fs::write(&not_hex, "g".repeat(64)).unwrap();
        let e = Key::from_file(&not_hex).unwrap_err().to_string();
        assert!(e.contains("nothex.key") && e.contains("hex"), "{e}");

        let missing = dir.join("missing.key");
        let e = Key::from_file(&missing).unwrap_err().to_string();
        assert!(
            e.contains("missing.key") && e.contains("cannot read"),
            "{e}"
        );
        assert!(!e.contains('\n'));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn key_debug_does_not_show_the_key() {
        assert_eq!(format!("{:?}", key()), "Key(..)");
    }
}
