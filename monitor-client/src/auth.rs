//! Who railscope says it is to an endpoint (the collector to a TSDB, a client to the
//! collector): HTTP basic auth (a user name and a password file) or a bearer token file, as Prometheus' own `remote_write` takes them
//! (`basic_auth.password_file`, `authorization.credentials_file`).
//!
//! Secrets come from files only, never from the URL, the command line or collector.toml
//! itself: those end up in `ps`, in `--check-config`'s output, in logs and in backups of
//! /etc. The files are read once at start-up (one error naming the file if one cannot be
//! read), and the secret is held as the `Authorization` header value, which no `Debug` or
//! log line shows.

use std::{fmt, path::PathBuf};

use crate::endpoint::EndpointError;

/// The authentication of one endpoint as configured (paths, not secrets).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Auth {
    #[default]
    None,
    /// `Authorization: Basic base64(username:password)`, the password read from a file.
    Basic {
        username: String,
        password_file: PathBuf,
    },
    /// `Authorization: Bearer TOKEN`, the token read from a file.
    Bearer { token_file: PathBuf },
}

/// An `Authorization` header value; never shown.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<not shown>)")
    }
}

impl Auth {
    /// The `Authorization` header value for `endpoint`, its file read now; None without
    /// authentication.
    pub fn header(&self, endpoint: &str) -> Result<Option<Secret>, EndpointError> {
        match self {
            Auth::None => Ok(None),
            Auth::Basic {
                username,
                password_file,
            } => {
                let password = read_secret(endpoint, "basic-auth-password-file", password_file)?;
                let pair = format!("{username}:{password}");
                Ok(Some(Secret(format!("Basic {}", base64(pair.as_bytes())))))
            }
            Auth::Bearer { token_file } => {
                let token = read_secret(endpoint, "bearer-token-file", token_file)?;
                Ok(Some(Secret(format!("Bearer {token}"))))
            }
        }
    }
}

/// A secret file's content without the surrounding white space (the newline editors and
/// `echo` leave), as Prometheus reads its password and credentials files. Empty, or holding
/// a line break inside, is an error: neither can be what was meant, and a line break would
/// end the header.
fn read_secret(
    endpoint: &str,
    what: &'static str,
    path: &std::path::Path,
) -> Result<String, EndpointError> {
    let fail = |reason: String| EndpointError::File {
        endpoint: endpoint.to_owned(),
        what,
        path: path.to_owned(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err(fail("empty".into()));
    }
    if secret.contains(['\r', '\n']) || secret.chars().any(char::is_control) {
        return Err(fail("more than one line, or control characters".into()));
    }
    Ok(secret.to_owned())
}

/// Standard base64 with padding (RFC 4648), for the basic-auth header.
fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648() {
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
            ("Aladdin:open sesame", "QWxhZGRpbjpvcGVuIHNlc2FtZQ=="),
        ] {
            assert_eq!(base64(plain.as_bytes()), coded, "{plain}");
        }
    }

    #[test]
    fn secrets_are_read_trimmed_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("password");
        std::fs::write(&file, "open sesame\n").unwrap();
        let auth = Auth::Basic {
            username: "Aladdin".into(),
            password_file: file.clone(),
        };
        let header = auth.header("mimir").unwrap().unwrap();
        assert_eq!(header.expose(), "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==");
        assert!(!format!("{header:?}").contains("QWxh"));
        std::fs::write(&file, "\n").unwrap();
        let e = auth.header("mimir").unwrap_err().to_string();
        assert!(
            e.contains("mimir") && e.contains(&*file.to_string_lossy()),
            "{e}"
        );
        let e = Auth::Bearer {
            token_file: dir.path().join("missing"),
        }
        .header("mimir")
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("bearer-token-file") && e.contains("missing") && !e.contains('\n'),
            "{e}"
        );
    }
}
