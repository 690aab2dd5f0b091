//! Who may use the collector's HTTP API, the way Prometheus decides it, so that operators
//! need nothing new: a web config file in the exporter-toolkit's format
//! (`--web.config.file`; `config`) gives TLS (`tls`) and basic-auth users, and
//! railscope adds roles to it (`railscope_roles`: `read`, the default, or `admin`); every
//! request is authenticated and each route asks for a role (`auth`). The file, with the
//! certificates it names, is read again on `POST /-/reload` and on SIGHUP; a file that
//! cannot be used is refused and the old one kept.

pub(crate) mod auth;
mod config;
pub(crate) mod tls;

use std::{
    fmt,
    path::{Path, PathBuf},
    sync::{
        Arc, RwLock,
        atomic::{AtomicU64, Ordering},
    },
};

pub use config::{ClientAuthType, Role, WebConfig, WebConfigError};

/// The web config in effect, and what it refused.
pub struct WebAuth {
    /// None: no web config file (plain HTTP, every caller admitted).
    path: Option<PathBuf>,
    current: RwLock<Arc<WebConfig>>,
    /// Whether the listener serves TLS: fixed at start-up (a reload cannot turn a plain
    /// listener into an HTTPS one).
    tls: bool,
    pub refused: Refusals,
}

/// Requests refused, by reason (`railscope_collector_http_refused_total`).
#[derive(Debug, Default)]
pub struct Refusals {
    /// No credentials, or wrong ones: 401.
    pub unauthenticated: AtomicU64,
    /// Authenticated, but the route asks for a role the caller has not: 403.
    pub forbidden: AtomicU64,
}

impl Refusals {
    pub fn get(&self) -> (u64, u64) {
        (
            self.unauthenticated.load(Ordering::Relaxed),
            self.forbidden.load(Ordering::Relaxed),
        )
    }
}

impl Default for WebAuth {
    fn default() -> Self {
        Self::open()
    }
}

impl fmt::Debug for WebAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebAuth")
            .field("path", &self.path)
            .field("current", &self.current())
            .finish()
    }
}

impl WebAuth {
    /// No web config file: plain HTTP, and every caller is admitted (as admin).
    pub fn open() -> Self {
        Self {
            path: None,
            current: RwLock::new(Arc::new(WebConfig::open())),
            tls: false,
            refused: Refusals::default(),
        }
    }

    /// Reads the web config file at `path` (and the certificates it names).
    pub fn load(path: &Path) -> Result<Self, WebConfigError> {
        let config = WebConfig::load(path)?;
        Ok(Self {
            path: Some(path.to_owned()),
            tls: config.tls.is_some(),
            current: RwLock::new(Arc::new(config)),
            refused: Refusals::default(),
        })
    }

    /// The web config file, if there is one.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The config in effect.
    pub fn current(&self) -> Arc<WebConfig> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether the listener serves HTTPS.
    pub fn serves_tls(&self) -> bool {
        self.tls
    }

    /// Reads the file again and puts it in effect; on failure logs one line naming the file
    /// and keeps the config in effect. Nothing to do without a file.
    pub fn reload(&self) -> Result<(), WebConfigError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let result = WebConfig::load(path).and_then(|config| {
            if config.tls.is_some() != self.tls {
                return Err(WebConfigError {
                    file: path.clone(),
                    field: "tls_server_config".into(),
                    message: format!(
                        "the collector serves {} since it started; a restart changes that",
                        if self.tls { "HTTPS" } else { "plain HTTP" }
                    ),
                });
            }
            Ok(config)
        });
        match result {
            Ok(config) => {
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
                tracing::info!("web config reloaded from {}", path.display());
                Ok(())
            }
            Err(e) => {
                tracing::error!("web config not reloaded, the previous one kept: {e}");
                Err(e)
            }
        }
    }
}
