//! An endpoint as a `[[remote-write-endpoint]]` table of collector.toml: what the short
//! `--remote-write NAME=URL` form cannot say (TLS, authentication, headers), with Prometheus'
//! `remote_write` fields under the file's kebab-case names. Checked when the file is read, so
//! a bad table is reported at its line; the files it names are read by `run_plan`.

use std::{collections::BTreeMap, path::PathBuf};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{Auth, EndpointConfig, RemoteWriteError, TlsFiles};

/// One `[[remote-write-endpoint]]`, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointTable(pub EndpointConfig);

/// The table's keys (docs/deployment.md, "Remote-write endpoints over https").
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Fields {
    name: String,
    url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ca_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cert_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    insecure_skip_verify: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    basic_auth_user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    basic_auth_password_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bearer_token_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    headers: BTreeMap<String, String>,
}

impl Fields {
    fn into_config(self) -> Result<EndpointConfig, RemoteWriteError> {
        let mut config = EndpointConfig::new(self.name, self.url);
        let fail = |reason: &str| RemoteWriteError::Config {
            spec: format!("{}={}", config.name, config.url),
            reason: reason.to_owned(),
        };
        config.auth = match (
            self.basic_auth_user,
            self.basic_auth_password_file,
            self.bearer_token_file,
        ) {
            (None, None, None) => Auth::None,
            (Some(username), Some(password_file), None) => {
                if username.contains(':') || username.chars().any(char::is_control) {
                    return Err(fail(
                        "basic-auth-user may not hold ':' or control characters",
                    ));
                }
                Auth::Basic {
                    username,
                    password_file,
                }
            }
            (None, None, Some(token_file)) => Auth::Bearer { token_file },
            (_, _, Some(_)) => {
                return Err(fail("basic auth and a bearer token exclude each other"));
            }
            _ => {
                return Err(fail(
                    "basic-auth-user and basic-auth-password-file go together",
                ));
            }
        };
        config.tls = TlsFiles {
            ca_file: self.ca_file,
            cert_file: self.cert_file,
            key_file: self.key_file,
            insecure_skip_verify: self.insecure_skip_verify,
        };
        config.headers = self.headers.into_iter().collect();
        config.validate()?;
        Ok(config)
    }

    fn from_config(c: &EndpointConfig) -> Self {
        let (basic_auth_user, basic_auth_password_file, bearer_token_file) = match &c.auth {
            Auth::None => (None, None, None),
            Auth::Basic {
                username,
                password_file,
            } => (Some(username.clone()), Some(password_file.clone()), None),
            Auth::Bearer { token_file } => (None, None, Some(token_file.clone())),
        };
        Self {
            name: c.name.clone(),
            url: c.url.clone(),
            ca_file: c.tls.ca_file.clone(),
            cert_file: c.tls.cert_file.clone(),
            key_file: c.tls.key_file.clone(),
            insecure_skip_verify: c.tls.insecure_skip_verify,
            basic_auth_user,
            basic_auth_password_file,
            bearer_token_file,
            headers: c.headers.iter().cloned().collect(),
        }
    }
}

impl Serialize for EndpointTable {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Fields::from_config(&self.0).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for EndpointTable {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let fields = Fields::deserialize(deserializer)?;
        fields
            .into_config()
            .map(Self)
            .map_err(serde::de::Error::custom)
    }
}
