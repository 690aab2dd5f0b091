//! How the command-line clients (`query`, `export`, `findings`, `stragglers`, `select`) reach
//! a collector whose HTTP API sits behind a web config file (TLS, basic auth): the HTTP
//! client configuration file of Prometheus' own tools (`promtool --http.config.file`), named
//! by `RAILSCOPE_HTTP_CONFIG_FILE`, so no subcommand needs flags of its own:
//!
//! ```yaml
//! basic_auth: { username: alice, password_file: /home/alice/.railscope-password }
//! authorization: { credentials_file: /path/token }   # instead of basic_auth
//! tls_config: { ca_file: /etc/railscope/ca.pem, cert_file: ..., key_file: ..., insecure_skip_verify: false }
//! ```
//!
//! Without the variable the clients connect as before: plain HTTP, no credentials (the
//! collector's own host, on loopback). Secrets come from files, as for remote-write.

use std::{path::PathBuf, time::Duration};

use anyhow::Context as _;
use serde::Deserialize;

use crate::{
    auth::Auth,
    tls::{self, TlsFiles},
};

/// The variable naming the client configuration file.
pub(crate) const HTTP_CONFIG_ENV: &str = "RAILSCOPE_HTTP_CONFIG_FILE";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpConfig {
    basic_auth: Option<BasicAuth>,
    authorization: Option<Authorization>,
    tls_config: Option<TlsConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BasicAuth {
    username: String,
    password_file: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Authorization {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    credentials_file: PathBuf,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsConfig {
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    #[serde(default)]
    insecure_skip_verify: bool,
}

/// An HTTP client for the collector at `collector`, and the `Authorization` header to send.
pub(crate) struct Client {
    pub agent: ureq::Agent,
    authorization: Option<String>,
}

impl Client {
    /// The client `RAILSCOPE_HTTP_CONFIG_FILE` describes (plain, without it); errors name the
    /// file.
    pub(crate) fn from_env(timeout: Duration) -> anyhow::Result<Self> {
        let config = match std::env::var_os(HTTP_CONFIG_ENV) {
            Some(path) => {
                let path = PathBuf::from(path);
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("{HTTP_CONFIG_ENV}={}", path.display()))?;
                let config: HttpConfig = serde_saphyr::from_str(&text)
                    .map_err(|e| anyhow::anyhow!("{HTTP_CONFIG_ENV}={}: {e}", path.display()))?;
                Some((path, config))
            }
            None => None,
        };
        let mut builder = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout));
        let mut authorization = None;
        if let Some((path, config)) = config {
            let name = path.display().to_string();
            let auth = match (config.basic_auth, config.authorization) {
                (Some(_), Some(_)) => {
                    anyhow::bail!("{name}: basic_auth and authorization exclude each other")
                }
                (Some(b), None) => Auth::Basic {
                    username: b.username,
                    password_file: b.password_file,
                },
                (None, Some(a)) => {
                    if a.kind.as_deref().is_some_and(|k| k != "Bearer") {
                        anyhow::bail!("{name}: authorization.type: only Bearer is supported");
                    }
                    Auth::Bearer {
                        token_file: a.credentials_file,
                    }
                }
                (None, None) => Auth::None,
            };
            authorization = auth.header(&name)?.map(|secret| secret.expose().to_owned());
            let tls = config.tls_config.unwrap_or_default();
            let files = TlsFiles {
                ca_file: tls.ca_file,
                cert_file: tls.cert_file,
                key_file: tls.key_file,
                insecure_skip_verify: tls.insecure_skip_verify,
            };
            builder = builder.tls_config(tls::load(&name, &files)?);
        }
        Ok(Self {
            agent: builder.build().into(),
            authorization,
        })
    }

    /// `GET url`, with the credentials.
    pub(crate) fn get(&self, url: &str) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
        let request = self.agent.get(url);
        match &self.authorization {
            Some(value) => request.header("Authorization", value),
            None => request,
        }
    }

    /// `POST url` (with a body to send), with the credentials.
    pub(crate) fn post(&self, url: &str) -> ureq::RequestBuilder<ureq::typestate::WithBody> {
        let request = self.agent.post(url);
        match &self.authorization {
            Some(value) => request.header("Authorization", value),
            None => request,
        }
    }
}
