//! TLS of an `https://` endpoint (a remote-write TSDB for the collector, the collector for
//! the clients): whom railscope trusts (the system's roots, or a CA file when the endpoint's
//! certificate comes from a private CA) and, optionally, the client certificate it shows
//! (mutual TLS). Everything is read once at start-up, so a missing or
//! unreadable file is one error naming it there, not a failure on every request later.
//!
//! The stack is rustls with ring (ureq's `rustls` feature): no OpenSSL, no aws-lc-rs. A
//! certificate that does not verify is never accepted silently: each request fails with
//! reason `tls` and is retried (see `client.rs`), until the operator fixes the CA or the
//! certificate. Only `insecure-skip-verify`, set explicitly, turns verification off, and the
//! collector says so in its log at start-up.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, OnceLock},
};

use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig};

use crate::endpoint::EndpointError;

/// The TLS settings of one endpoint as configured (paths, not their content).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TlsFiles {
    /// PEM CA certificates to verify the endpoint's certificate with, instead of the
    /// system's roots.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (chain) shown to the endpoint; with `key_file`.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file` (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// Accept any certificate: for a test bench only.
    pub insecure_skip_verify: bool,
}

impl TlsFiles {
    /// Whether anything is set (which makes sense only for an https endpoint).
    pub fn is_set(&self) -> bool {
        self.ca_file.is_some()
            || self.cert_file.is_some()
            || self.key_file.is_some()
            || self.insecure_skip_verify
    }
}

/// The TLS configuration of `endpoint`, its files read and parsed.
pub fn load(endpoint: &str, files: &TlsFiles) -> Result<TlsConfig, EndpointError> {
    let roots = match &files.ca_file {
        Some(path) => {
            let certs = certificates(endpoint, "ca-file", path)?;
            RootCerts::Specific(Arc::new(certs))
        }
        None => system_roots().map_err(|reason| EndpointError::Config {
            endpoint: endpoint.to_owned(),
            reason,
        })?,
    };
    let client_cert = match (&files.cert_file, &files.key_file) {
        (Some(cert), Some(key)) => {
            let chain = certificates(endpoint, "cert-file", cert)?;
            let key = private_key(endpoint, key)?;
            Some(ClientCert::new_with_certs(&chain, key))
        }
        (None, None) => None,
        _ => {
            return Err(EndpointError::Config {
                endpoint: endpoint.to_owned(),
                reason: "cert-file and key-file go together".into(),
            });
        }
    };
    if files.insecure_skip_verify {
        tracing::warn!(
            endpoint,
            "insecure-skip-verify is set: the endpoint's certificate is NOT verified"
        );
    }
    Ok(TlsConfig::builder()
        .root_certs(roots)
        .client_cert(client_cert)
        .disable_verification(files.insecure_skip_verify)
        .build())
}

/// The system's trust store (Debian: /etc/ssl/certs, from `ca-certificates`; `SSL_CERT_FILE`
/// and `SSL_CERT_DIR` are honoured), read once per process: operators add their private CA
/// there as for any other tool (`update-ca-certificates`), rather than trusting a list built
/// into the binary.
fn system_roots() -> Result<RootCerts, String> {
    static ROOTS: OnceLock<Result<RootCerts, String>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            if found.certs.is_empty() {
                let why = found
                    .errors
                    .first()
                    .map_or_else(String::new, |e| format!(" ({e})"));
                return Err(format!(
                    "no CA certificates in the system's trust store{why}: install \
                     ca-certificates, or give the endpoint a ca-file"
                ));
            }
            let certs: Vec<Certificate<'static>> = found
                .certs
                .iter()
                .map(|c| Certificate::from_der(c.as_ref()).to_owned())
                .collect();
            Ok(RootCerts::Specific(Arc::new(certs)))
        })
        .clone()
}

fn read(endpoint: &str, what: &'static str, path: &Path) -> Result<Vec<u8>, EndpointError> {
    std::fs::read(path).map_err(|e| EndpointError::File {
        endpoint: endpoint.to_owned(),
        what,
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// Every certificate of a PEM file; none is an error (a key file or a DER file given by
/// mistake).
fn certificates(
    endpoint: &str,
    what: &'static str,
    path: &Path,
) -> Result<Vec<Certificate<'static>>, EndpointError> {
    let pem = read(endpoint, what, path)?;
    let bad = |reason: String| EndpointError::File {
        endpoint: endpoint.to_owned(),
        what,
        path: path.to_owned(),
        reason,
    };
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        if let PemItem::Certificate(c) = item.map_err(|e| bad(e.to_string()))? {
            certs.push(c);
        }
    }
    if certs.is_empty() {
        return Err(bad(
            "no PEM certificate (-----BEGIN CERTIFICATE-----) in it".into(),
        ));
    }
    Ok(certs)
}

fn private_key(endpoint: &str, path: &Path) -> Result<PrivateKey<'static>, EndpointError> {
    let pem = read(endpoint, "key-file", path)?;
    PrivateKey::from_pem(&pem).map_err(|e| EndpointError::File {
        endpoint: endpoint.to_owned(),
        what: "key-file",
        path: path.to_owned(),
        reason: format!("no PEM private key in it ({e})"),
    })
}
