//! HTTPS for the collector's API: a listener for `axum::serve` that hands it connections
//! whose TLS handshake is done, with the rustls config current at each accept (a reload
//! takes effect on the next connection, as in Prometheus); and the verifier of the
//! exporter-toolkit's `RequestClientCert` and `RequireAnyClientCert`, which ask for a
//! certificate but trust any.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use rustls::{
    DigitallySignedStruct, DistinguishedName, SignatureScheme,
    client::danger::HandshakeSignatureValid,
    crypto::CryptoProvider,
    server::danger::{ClientCertVerified, ClientCertVerifier},
};
use rustls_pki_types::{CertificateDer, UnixTime};
use tokio::{net::TcpStream, sync::mpsc, task::JoinHandle};
use tokio_rustls::{TlsAcceptor, server::TlsStream};

use super::WebAuth;

/// A handshake not done in this long is dropped: a client that connects and sends nothing
/// must not hold a task forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections waiting for `axum::serve` to take them (it takes them as fast as it can).
const READY_QUEUE: usize = 64;

/// TLS connections for `axum::serve`: a task accepts TCP connections and runs each
/// handshake in a task of its own (a slow client holds up no other), handing the finished
/// ones over; a failed handshake is logged at debug and forgotten.
pub(crate) struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    acceptor: JoinHandle<()>,
}

impl TlsListener {
    pub(crate) fn new(
        listener: tokio::net::TcpListener,
        web: Arc<WebAuth>,
    ) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let (sender, ready) = mpsc::channel(READY_QUEUE);
        let acceptor = tokio::spawn(async move {
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: wait, as axum::serve does.
                        tracing::debug!("HTTPS accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Some(config) = web.current().tls.clone() else {
                    continue;
                };
                let sender = sender.clone();
                tokio::spawn(async move {
                    let handshake = TlsAcceptor::from(config).accept(stream);
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                        Ok(Ok(tls)) => {
                            let _ = sender.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!("TLS handshake with {peer} failed: {e}"),
                        Err(_) => tracing::debug!("TLS handshake with {peer} timed out"),
                    }
                });
            }
        });
        Ok(Self {
            ready,
            local,
            acceptor,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(ready) => ready,
            // The accepting task ended (it never does while the listener lives).
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// Asks for a client certificate and takes any (the exporter-toolkit's
/// `RequestClientCert` when not `mandatory`, `RequireAnyClientCert` when it is): the
/// handshake still proves the client holds the certificate's key.
#[derive(Debug)]
pub(crate) struct AnyClientCert {
    provider: Arc<CryptoProvider>,
    mandatory: bool,
}

impl AnyClientCert {
    pub(crate) fn new(provider: Arc<CryptoProvider>, mandatory: bool) -> Self {
        Self {
            provider,
            mandatory,
        }
    }
}

impl ClientCertVerifier for AnyClientCert {
    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
