//! The web config file (`--web.config.file`): Prometheus' exporter-toolkit format, so an
//! operator who has set up a Prometheus or an exporter writes the same YAML here:
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: server.crt
//!   key_file: server.key
//!   client_auth_type: RequireAndVerifyClientCert   # optional
//!   client_ca_file: ca.crt                         # with the Verify* types
//!   min_version: TLS12                             # optional
//! basic_auth_users:
//!   alice: $2y$10$...                              # bcrypt hashes
//!   bob: $2y$10$...
//! railscope_roles:                                 # railscope's own: who is admin
//!   alice: admin
//! ```
//!
//! Everything is checked at load (the hashes' format, the certificates and the key read and
//! matched), so a bad file is refused at start-up or on reload, never at a request's time.
//! Relative paths are taken from the file's directory, as the exporter-toolkit does.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fmt,
    path::{Path, PathBuf},
    str::FromStr,
    sync::{Arc, Mutex},
};

use rustls::{
    RootCertStore, ServerConfig,
    server::{WebPkiClientVerifier, danger::ClientCertVerifier},
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use serde::Deserialize;

/// What an authenticated caller may do: `read` everything the API serves, or also what
/// changes the collector's state (`admin`: `POST /-/reload`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Read,
    Admin,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Read => "read",
            Role::Admin => "admin",
        })
    }
}

/// The exporter-toolkit's `client_auth_type`, as Go's `tls.ClientAuthType` names them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum ClientAuthType {
    #[default]
    NoClientCert,
    RequestClientCert,
    RequireAnyClientCert,
    VerifyClientCertIfGiven,
    RequireAndVerifyClientCert,
}

impl ClientAuthType {
    fn verifies(self) -> bool {
        matches!(
            self,
            Self::VerifyClientCertIfGiven | Self::RequireAndVerifyClientCert
        )
    }
}

#[derive(Clone, Copy, Debug, Deserialize)]
enum TlsVersion {
    TLS10,
    TLS11,
    TLS12,
    TLS13,
}

/// The file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tls_server_config: Option<TlsFile>,
    #[serde(default)]
    basic_auth_users: BTreeMap<String, String>,
    #[serde(default)]
    railscope_roles: BTreeMap<String, Role>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    client_ca_file: Option<PathBuf>,
    #[serde(default)]
    client_auth_type: ClientAuthType,
    min_version: Option<TlsVersion>,
}

/// Why a web config file cannot be used: one line naming the file and the field.
#[derive(Debug, thiserror::Error)]
#[error("{}: {field}{}{message}", file.display(), if field.is_empty() { "" } else { ": " })]
pub struct WebConfigError {
    pub file: PathBuf,
    /// The field, as a YAML path (`tls_server_config.cert_file`); empty for the whole file.
    pub field: String,
    pub message: String,
}

/// A user of `basic_auth_users`.
#[derive(Debug)]
struct User {
    hash: String,
    role: Role,
}

/// Most successful verifications remembered (then forgotten all at once): users times the
/// passwords they use, so far more than any real use, and a bound on memory whatever happens.
const MAX_VERIFIED: usize = 4096;

/// A loaded, checked web config: what the listener and the authentication read.
pub struct WebConfig {
    /// Serve HTTPS with this (None: plain HTTP).
    pub tls: Option<Arc<ServerConfig>>,
    pub client_auth: ClientAuthType,
    users: HashMap<String, User>,
    /// blake3(user, password) of the credentials bcrypt already accepted: bcrypt costs tens
    /// of milliseconds a check by design, which the dashboard's many requests must not pay
    /// each (the exporter-toolkit keeps the same cache). Forgotten with the config on reload.
    verified: Mutex<HashSet<[u8; 32]>>,
}

impl fmt::Debug for WebConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebConfig")
            .field("tls", &self.tls.is_some())
            .field("client_auth", &self.client_auth)
            .field("users", &self.users.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl WebConfig {
    /// No file: plain HTTP, no users (every caller is admitted).
    pub fn open() -> Self {
        Self {
            tls: None,
            client_auth: ClientAuthType::NoClientCert,
            users: HashMap::new(),
            verified: Mutex::default(),
        }
    }

    /// Reads and checks `path`, the certificates and key it names included.
    pub fn load(path: &Path) -> Result<Self, WebConfigError> {
        let error = |field: &str, message: String| WebConfigError {
            file: path.to_owned(),
            field: field.into(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| error("", e.to_string()))?;
        // An empty file is an empty mapping (the exporter-toolkit accepts it too).
        let file: File = if text.trim().is_empty() {
            File::default()
        } else {
            serde_saphyr::from_str(&text).map_err(|e| {
                // The parser's message is `error: line L column C: what`, then a snippet of
                // the file on further lines: the first line is the one to log.
                let message = e.to_string();
                let first = message.lines().next().unwrap_or_default();
                let first = first.trim().trim_start_matches("error: ");
                error("", first.split(" --> ").next().unwrap_or(first).into())
            })?
        };
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut users = HashMap::new();
        for (name, hash) in &file.basic_auth_users {
            let field = format!("basic_auth_users.{name}");
            if name.contains(':') {
                return Err(error(&field, "a user name cannot hold ':'".into()));
            }
            bcrypt::HashParts::from_str(hash).map_err(|e| {
                error(
                    &field,
                    format!("not a bcrypt hash ($2a$, $2b$ or $2y$, 60 characters): {e}"),
                )
            })?;
            let role = file
                .railscope_roles
                .get(name)
                .copied()
                .unwrap_or(Role::Read);
            users.insert(
                name.clone(),
                User {
                    hash: hash.clone(),
                    role,
                },
            );
        }
        for name in file.railscope_roles.keys() {
            if !users.contains_key(name) {
                return Err(error(
                    &format!("railscope_roles.{name}"),
                    "no such user in basic_auth_users".into(),
                ));
            }
        }
        let (tls, client_auth) = match &file.tls_server_config {
            Some(tls) => (
                Some(Arc::new(server_config(tls, dir, &error)?)),
                tls.client_auth_type,
            ),
            None => (None, ClientAuthType::NoClientCert),
        };
        Ok(Self {
            tls,
            client_auth,
            users,
            verified: Mutex::default(),
        })
    }

    /// Whether a caller must prove who it is: with a password, or with a client certificate
    /// the collector verifies.
    pub fn authenticates(&self) -> bool {
        !self.users.is_empty() || self.client_auth == ClientAuthType::RequireAndVerifyClientCert
    }

    /// Whether basic auth is asked for.
    pub fn has_users(&self) -> bool {
        !self.users.is_empty()
    }

    /// The role of `user` if `password` is theirs, from the cache when it was checked before
    /// (cheap), else None: [`Self::verify`] decides.
    pub fn verified_before(&self, user: &str, password: &str) -> Option<Role> {
        let role = self.users.get(user)?.role;
        let key = credential_key(user, password);
        let verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        verified.contains(&key).then_some(role)
    }

    /// The role of `user` if `password` is theirs (bcrypt: tens of milliseconds at the
    /// usual costs, so off the async threads).
    pub fn verify(&self, user: &str, password: &str) -> Option<Role> {
        let Some(found) = self.users.get(user) else {
            // As long as for a known user, so that a wrong name and a wrong password cannot
            // be told apart by the time the answer takes.
            let _ = bcrypt::verify(password, &DUMMY_HASH);
            return None;
        };
        if !bcrypt::verify(password, &found.hash).unwrap_or(false) {
            return None;
        }
        let mut verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        if verified.len() >= MAX_VERIFIED {
            verified.clear();
        }
        verified.insert(credential_key(user, password));
        Some(found.role)
    }
}

/// A bcrypt hash at cost 10 (the usual cost of the users' hashes), made once.
static DUMMY_HASH: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| bcrypt::hash("railscope", 10).unwrap_or_default());

fn credential_key(user: &str, password: &str) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(&(user.len() as u64).to_le_bytes());
    hasher.update(user.as_bytes());
    hasher.update(password.as_bytes());
    *hasher.finalize().as_bytes()
}

/// The rustls server config of `tls_server_config`.
fn server_config(
    tls: &TlsFile,
    dir: &Path,
    error: &dyn Fn(&str, String) -> WebConfigError,
) -> Result<ServerConfig, WebConfigError> {
    let field = |name: &str| format!("tls_server_config.{name}");
    let path_of = |name: &str, value: &Option<PathBuf>| -> Result<PathBuf, WebConfigError> {
        let value = value
            .as_ref()
            .ok_or_else(|| error(&field(name), "missing".into()))?;
        Ok(dir.join(value))
    };
    let read = |name: &str, path: &Path| {
        std::fs::read(path).map_err(|e| error(&field(name), format!("{}: {e}", path.display())))
    };
    let cert_path = path_of("cert_file", &tls.cert_file)?;
    let key_path = path_of("key_file", &tls.key_file)?;
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&read("cert_file", &cert_path)?)
            .collect::<Result<_, _>>()
            .map_err(|e| error(&field("cert_file"), format!("{}: {e}", cert_path.display())))?;
    if certs.is_empty() {
        return Err(error(
            &field("cert_file"),
            format!("{}: no PEM certificate in it", cert_path.display()),
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(&read("key_file", &key_path)?)
        .map_err(|e| error(&field("key_file"), format!("{}: {e}", key_path.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier: Arc<dyn ClientCertVerifier> = if tls.client_auth_type.verifies() {
        let ca_path = path_of("client_ca_file", &tls.client_ca_file).map_err(|_| {
            error(
                &field("client_ca_file"),
                format!("missing (client_auth_type {:?})", tls.client_auth_type),
            )
        })?;
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&read("client_ca_file", &ca_path)?) {
            let cert = cert.map_err(|e| {
                error(
                    &field("client_ca_file"),
                    format!("{}: {e}", ca_path.display()),
                )
            })?;
            roots.add(cert).map_err(|e| {
                error(
                    &field("client_ca_file"),
                    format!("{}: {e}", ca_path.display()),
                )
            })?;
        }
        if roots.is_empty() {
            return Err(error(
                &field("client_ca_file"),
                format!("{}: no PEM certificate in it", ca_path.display()),
            ));
        }
        let builder = WebPkiClientVerifier::builder_with_provider(roots.into(), provider.clone());
        let builder = match tls.client_auth_type {
            ClientAuthType::VerifyClientCertIfGiven => builder.allow_unauthenticated(),
            _ => builder,
        };
        builder
            .build()
            .map_err(|e| error(&field("client_ca_file"), e.to_string()))?
    } else {
        match tls.client_auth_type {
            ClientAuthType::RequestClientCert => {
                Arc::new(super::tls::AnyClientCert::new(provider.clone(), false))
            }
            ClientAuthType::RequireAnyClientCert => {
                Arc::new(super::tls::AnyClientCert::new(provider.clone(), true))
            }
            _ => WebPkiClientVerifier::no_client_auth(),
        }
    };
    let versions: &[&rustls::SupportedProtocolVersion] = match tls.min_version {
        Some(TlsVersion::TLS13) => &[&rustls::version::TLS13],
        // rustls speaks 1.2 and 1.3 only: older minimums allow what it has.
        _ => &[&rustls::version::TLS13, &rustls::version::TLS12],
    };
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(|e| error(&field("min_version"), e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| {
            error(
                &field("key_file"),
                format!("{} with {}: {e}", key_path.display(), cert_path.display()),
            )
        })?;
    // The server speaks HTTP/1.1 only.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory with `web.yml` holding `text`, and a certificate and key for TLS.
    fn dir_with(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.path().join("server.pem"), cert.pem()).unwrap();
        std::fs::write(dir.path().join("server.key"), key.serialize_pem()).unwrap();
        let path = dir.path().join("web.yml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    fn error(text: &str) -> String {
        let (_dir, path) = dir_with(text);
        let e = WebConfig::load(&path).unwrap_err().to_string();
        assert!(!e.contains('\n'), "one line: {e}");
        assert!(
            e.starts_with(&format!("{}: ", path.display())),
            "names the file: {e}"
        );
        e[path.display().to_string().len() + 2..].to_owned()
    }

    #[test]
    fn users_roles_and_tls_are_read() {
        let hash = bcrypt::hash("pw", 4).unwrap();
        let (_dir, path) = dir_with(&format!(
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  \
             min_version: TLS13\nbasic_auth_users:\n  alice: {hash}\n  bob: '{hash}'\n\
             railscope_roles:\n  alice: admin\n"
        ));
        let config = WebConfig::load(&path).unwrap();
        assert!(config.tls.is_some() && config.authenticates());
        assert_eq!(
            config.verified_before("alice", "pw"),
            None,
            "not yet checked"
        );
        assert_eq!(config.verify("alice", "pw"), Some(Role::Admin));
        assert_eq!(config.verified_before("alice", "pw"), Some(Role::Admin));
        assert_eq!(
            config.verify("bob", "pw"),
            Some(Role::Read),
            "read by default"
        );
        assert_eq!(config.verify("bob", "wrong"), None);
        assert_eq!(config.verified_before("bob", "wrong"), None);
        assert_eq!(config.verify("carol", "pw"), None);
        let (_dir, path) = dir_with("");
        let empty = WebConfig::load(&path).unwrap();
        assert!(empty.tls.is_none() && !empty.authenticates());
    }

    #[test]
    fn a_bad_file_is_one_line_naming_the_file_and_the_field() {
        let e = error("tls_server_config:\n  cert_file: server.pem\n  certfile: x\n");
        assert!(
            e.starts_with("line 3 column 3: unknown field `certfile`"),
            "{e}"
        );
        let e = error(
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  client_auth_type: Sometimes\n",
        );
        assert!(
            e.starts_with("line 4 column 21: unknown variant `Sometimes`"),
            "{e}"
        );
        let e = error("basic_auth_users: [alice]\n");
        assert!(e.starts_with("line 1 column 19: expected mapping"), "{e}");
        let e = error("basic_auth_users:\n  alice: $1$md5$notbcrypt\n");
        assert!(
            e.starts_with("basic_auth_users.alice: not a bcrypt hash"),
            "{e}"
        );
        let e = error("basic_auth_users:\n  alice: plain-password\n");
        assert!(
            e.starts_with("basic_auth_users.alice: not a bcrypt hash"),
            "{e}"
        );
        let hash = bcrypt::hash("pw", 4).unwrap();
        let e = error(&format!(
            "basic_auth_users:\n  alice: {hash}\nrailscope_roles:\n  alice: root\n"
        ));
        assert!(
            e.starts_with("line 4 column 10: unknown variant `root`"),
            "{e}"
        );
        let e = error(&format!(
            "basic_auth_users:\n  alice: {hash}\nrailscope_roles:\n  bob: admin\n"
        ));
        assert_eq!(e, "railscope_roles.bob: no such user in basic_auth_users");
        let e = error(":\n  - [\n");
        assert!(!e.is_empty(), "{e}");
    }

    #[test]
    fn missing_certificates_and_keys_are_named() {
        let e = error("tls_server_config:\n  cert_file: nowhere.pem\n  key_file: server.key\n");
        assert!(
            e.starts_with("tls_server_config.cert_file: ")
                && e.contains("nowhere.pem: No such file"),
            "{e}"
        );
        let e = error("tls_server_config:\n  cert_file: server.pem\n");
        assert_eq!(e, "tls_server_config.key_file: missing");
        let e = error("tls_server_config:\n  cert_file: server.key\n  key_file: server.key\n");
        assert!(
            e.starts_with("tls_server_config.cert_file: ") && e.contains("no PEM certificate"),
            "{e}"
        );
        let e = error("tls_server_config:\n  cert_file: server.pem\n  key_file: server.pem\n");
        assert!(e.starts_with("tls_server_config.key_file: "), "{e}");
        let e = error(
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  \
             client_auth_type: RequireAndVerifyClientCert\n",
        );
        assert!(
            e.starts_with("tls_server_config.client_ca_file: missing"),
            "{e}"
        );
        let e = error(
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  \
             client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: ca.pem\n",
        );
        assert!(
            e.starts_with("tls_server_config.client_ca_file: ") && e.contains("ca.pem"),
            "{e}"
        );
    }
}
