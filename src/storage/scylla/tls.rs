//! TLS to the CQL nodes (`[store.scylla.tls]`): the rustls client settings the driver dials
//! every node with, hookline's own certificate among them when the cluster asks for one.
//!
//! The driver checks a node's certificate against the node's IP address, as it dials it. Many
//! clusters' certificates name the nodes by DNS instead, or carry one name for the whole
//! cluster: `server_name` checks every node's certificate against that name, with the chain
//! and expiry checked as usual.

use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::config::{ConfigError, CqlTls, invalid};

/// The rustls client settings for `tls`: its CAs (or Mozilla's), TLS 1.2 and 1.3, and the
/// name check it asks for. Reads `ca_file`; its errors name the key.
pub fn client_config(tls: &CqlTls) -> Result<rustls::ClientConfig, ConfigError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = match &tls.ca_file {
        Some(path) => ca_roots(path)?,
        None => RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        },
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("tls", format!("cannot be set up: {e}")))?;
    let config = match tls.server_name()? {
        None => builder.with_root_certificates(roots),
        Some(name) => {
            let verifier = FixedName::new(roots, provider, name)?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
        }
    };
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            let chain = certificates(cert, "tls.cert_file")?;
            let shown = key.display();
            // What is wrong with the key is said without its contents: it is secret.
            let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                invalid(
                    "tls.key_file",
                    format!("= {shown:?} holds no usable private key: {}", pem_error(&e)),
                )
            })?;
            config.with_client_auth_cert(chain, key_der).map_err(|e| {
                invalid(
                    "tls.key_file",
                    format!("= {shown:?} cannot be used with tls.cert_file: {e}"),
                )
            })
        }
        _ => Ok(config.with_no_client_auth()),
    }
}

/// What went wrong reading a PEM key file, without its contents.
fn pem_error(e: &rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error;
    match e {
        Error::Io(io) => format!("cannot be read: {io}"),
        Error::NoItemsFound => "no PEM private key in it (-----BEGIN PRIVATE KEY-----)".into(),
        _ => "not a PEM file".into(),
    }
}

/// Every certificate in the PEM file at `path` (config key `key`); at least one.
fn certificates(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let shown = path.display();
    let pem = std::fs::read(path)
        .map_err(|e| invalid(key, format!("= {shown:?} cannot be read: {e}")))?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| invalid(key, format!("= {shown:?} is not a PEM file: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(
            key,
            format!("= {shown:?} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"),
        ));
    }
    Ok(certs)
}

/// Every certificate in the PEM file at `path`, as trust anchors.
fn ca_roots(path: &Path) -> Result<RootCertStore, ConfigError> {
    let key = "tls.ca_file";
    let shown = path.display();
    let certs = certificates(path, key)?;
    let mut roots = RootCertStore::empty();
    for (i, cert) in certs.into_iter().enumerate() {
        roots.add(cert).map_err(|e| {
            invalid(
                key,
                format!("= {shown:?}: certificate {} is not a usable CA: {e}", i + 1),
            )
        })?;
    }
    Ok(roots)
}

/// Checks a node's certificate as rustls does, against one configured name instead of the
/// name the driver dialled (the node's IP address).
#[derive(Debug)]
struct FixedName {
    inner: Arc<WebPkiServerVerifier>,
    name: ServerName<'static>,
}

impl FixedName {
    fn new(
        roots: RootCertStore,
        provider: Arc<CryptoProvider>,
        name: ServerName<'static>,
    ) -> Result<FixedName, ConfigError> {
        let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| invalid("tls.ca_file", format!("cannot be used: {e}")))?;
        Ok(FixedName { inner, name })
    }
}

impl ServerCertVerifier for FixedName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _dialled: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, &self.name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
