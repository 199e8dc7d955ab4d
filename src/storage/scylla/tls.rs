//! TLS to the CQL nodes (`[store.scylla.tls]`): the rustls client settings the driver dials
//! every node with, hookline's own certificate among them when the cluster asks for one.
//!
//! The driver checks a node's certificate against the node's IP address, as it dials it. Many
//! clusters' certificates name the nodes by DNS instead, or carry one name for the whole
//! cluster: `server_name` checks every node's certificate against that name, with the chain
//! and expiry checked as usual.
//!
//! hookline reads the CA, certificate and key files again when they change (a rotation by
//! cert-manager, a Kubernetes secret updated in place): each new connection to a node (at
//! start-up, and whenever the driver reconnects, as after a node's restart) checks the files and
//! uses what they hold then, and [`Watch`] checks them every minute between connections.
//! Connections already open keep the certificates they were made with. A change that cannot be
//! used (a file half written, a key that is not the certificate's) is logged, counted and shown
//! by `hookline_store_tls_files_refused`, and the files read before stay in use until the next
//! change.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::config::{ConfigError, CqlTls, invalid};
use crate::telemetry;

/// The rustls client settings for `tls`: its CAs (or Mozilla's), TLS 1.2 and 1.3, and the
/// name check it asks for. Reads the files it names; their errors name the key. The files are
/// read again when they change (see the module's documentation).
pub fn client_config(tls: &CqlTls) -> Result<(rustls::ClientConfig, Watch), ConfigError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = NodeVerifier::new(tls, provider.clone())?;
    // Mozilla's roots are compiled in: only a CA file is watched.
    let mut watch = Watch(Vec::new());
    if tls.ca_file.is_some() {
        watch
            .0
            .push(Arc::downgrade(&verifier.roots) as Weak<dyn Refresh>);
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("tls", format!("cannot be set up: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier));
    let mut config = match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            let (cert, key) = (cert.clone(), key.clone());
            let files = vec![cert.clone(), key.clone()];
            let own = Arc::new(Reloading::new(
                telemetry::CqlTlsFile::ClientCert,
                files,
                move || certified_key(&cert, &key, &provider),
            )?);
            watch.0.push(Arc::downgrade(&own) as Weak<dyn Refresh>);
            builder.with_client_cert_resolver(Arc::new(OwnCertificate(own)))
        }
        _ => builder.with_no_client_auth(),
    };
    // A resumed session skips both certificate checks, so a connection made after a rotation
    // could go on under the CA and certificate of before. The driver holds a few long-lived
    // connections per node: a full handshake each time costs nothing that matters.
    config.resumption = rustls::client::Resumption::disabled();
    Ok((config, watch))
}

/// How often [`Watch::run`] looks at the files between connections.
pub const WATCH_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// The files behind one TLS setup, for [`Watch::run`].
pub struct Watch(Vec<Weak<dyn Refresh>>);

impl Watch {
    /// Whether any file is watched: with Mozilla's roots and no client certificate, none is,
    /// and no task need run.
    pub fn watches_files(&self) -> bool {
        !self.0.is_empty()
    }

    /// Reads the files again whenever they changed, every `every`, until the TLS settings are
    /// dropped: a rotation that cannot be used shows in `hookline_store_tls_files_refused` (and
    /// its alert) when it happens, not at the next connection, which may come weeks later, as
    /// the old certificate expires.
    pub async fn run(self, every: std::time::Duration) {
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        loop {
            tick.tick().await;
            let mut alive = false;
            for w in &self.0 {
                if let Some(r) = w.upgrade() {
                    r.refresh();
                    alive = true;
                }
            }
            if !alive {
                return;
            }
        }
    }
}

/// Something read from files that [`Watch`] can have read again.
trait Refresh: Send + Sync {
    fn refresh(&self);
}

impl<T: Send + Sync> Refresh for Reloading<T> {
    fn refresh(&self) {
        self.current();
    }
}

/// hookline's certificate and key from `cert` and `key`, checked to belong together.
fn certified_key(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, ConfigError> {
    let chain = certificates(cert, "tls.cert_file")?;
    let shown = key.display();
    // What is wrong with the key is said without its contents: it is secret.
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        invalid(
            "tls.key_file",
            format!("= {shown:?} holds no usable private key: {}", pem_error(&e)),
        )
    })?;
    let expires = chain.first().and_then(|leaf| not_after(leaf));
    let certified = CertifiedKey::from_der(chain, key_der, provider).map_err(|e| {
        invalid(
            "tls.key_file",
            format!("= {shown:?} cannot be used with tls.cert_file: {e}"),
        )
    })?;
    // Read to be used: its expiry is the one that counts from now on.
    if let Some(at) = expires {
        telemetry::cql_client_cert_expiry(at);
    }
    Ok(certified)
}

/// When the DER certificate `cert` stops being valid; `None` if it does not parse (rustls has
/// checked it as far as it needs to).
fn not_after(cert: &CertificateDer<'_>) -> Option<SystemTime> {
    use x509_cert::der::Decode;
    let parsed = x509_cert::Certificate::from_der(cert.as_ref()).ok()?;
    Some(SystemTime::UNIX_EPOCH + parsed.tbs_certificate.validity.not_after.to_unix_duration())
}

/// What a file looked like when last read: its length, modification time and inode (a
/// Kubernetes secret volume swaps a symlink to a new file), or that it could not be seen.
type Stamp = Vec<Option<(u64, SystemTime, u64)>>;

fn stamp(paths: &[PathBuf]) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    paths
        .iter()
        .map(|p| {
            let m = std::fs::metadata(p).ok()?;
            Some((m.len(), m.modified().ok()?, m.ino()))
        })
        .collect()
}

/// A value read from files, read again at its first use after any of them changed. A read that
/// fails keeps the value read before, with a warning, until the files change again.
struct Reloading<T> {
    what: telemetry::CqlTlsFile,
    files: Vec<PathBuf>,
    read: Box<dyn Fn() -> Result<T, ConfigError> + Send + Sync>,
    /// The files' stamp when last read (whether that read was used or not), and the value in
    /// use.
    state: Mutex<(Stamp, Arc<T>)>,
}

impl<T> Reloading<T> {
    /// Reads the value now; its error is the caller's (at start-up, a settings error).
    fn new(
        what: telemetry::CqlTlsFile,
        files: Vec<PathBuf>,
        read: impl Fn() -> Result<T, ConfigError> + Send + Sync + 'static,
    ) -> Result<Reloading<T>, ConfigError> {
        // Stamped before reading: a change during the read is read again at the next use.
        let seen = stamp(&files);
        let value = Arc::new(read()?);
        if !files.is_empty() {
            telemetry::cql_tls_watched(what);
            telemetry::cql_tls_refused(what, false);
        }
        Ok(Reloading {
            what,
            files,
            read: Box::new(read),
            state: Mutex::new((seen, value)),
        })
    }

    /// The value the files hold now, or the last one that could be used.
    fn current(&self) -> Arc<T> {
        let seen = stamp(&self.files);
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.0 != seen {
            state.0 = seen;
            match (self.read)() {
                Ok(value) => {
                    state.1 = Arc::new(value);
                    telemetry::cql_tls_reread(self.what, true);
                    telemetry::cql_tls_refused(self.what, false);
                    tracing::info!(files = ?self.files, "CQL TLS files changed; read again");
                }
                Err(e) => {
                    telemetry::cql_tls_reread(self.what, false);
                    telemetry::cql_tls_refused(self.what, true);
                    tracing::warn!(
                        error = %e,
                        "CQL TLS files changed but cannot be used; keeping the ones read before"
                    );
                }
            }
        }
        state.1.clone()
    }
}

impl<T> std::fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

/// hookline's own certificate, as its files hold it now.
#[derive(Debug)]
struct OwnCertificate(Arc<Reloading<CertifiedKey>>);

impl ResolvesClientCert for OwnCertificate {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current())
    }

    fn has_certs(&self) -> bool {
        true
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

/// The chain and expiry check of rustls's own verifier under `roots`.
fn webpki(
    roots: RootCertStore,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, ConfigError> {
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| invalid("tls.ca_file", format!("cannot be used: {e}")))
}

/// Checks a node's certificate as rustls does, under the CAs `ca_file` holds now (or
/// Mozilla's), against `server_name` when set and otherwise the name the driver dialled (the
/// node's IP address).
#[derive(Debug)]
struct NodeVerifier {
    roots: Arc<Reloading<Arc<WebPkiServerVerifier>>>,
    name: Option<ServerName<'static>>,
    provider: Arc<CryptoProvider>,
}

impl NodeVerifier {
    fn new(tls: &CqlTls, provider: Arc<CryptoProvider>) -> Result<NodeVerifier, ConfigError> {
        let name = tls.server_name()?;
        let p = provider.clone();
        let roots = match tls.ca_file.clone() {
            Some(path) => {
                Reloading::new(telemetry::CqlTlsFile::Ca, vec![path.clone()], move || {
                    webpki(ca_roots(&path)?, p.clone())
                })?
            }
            // Compiled in: no file, so never read again.
            None => Reloading::new(telemetry::CqlTlsFile::Ca, Vec::new(), move || {
                let roots = RootCertStore {
                    roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
                };
                webpki(roots, p.clone())
            })?,
        };
        Ok(NodeVerifier {
            roots: Arc::new(roots),
            name,
            provider,
        })
    }
}

impl ServerCertVerifier for NodeVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        dialled: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let name = self.name.as_ref().unwrap_or(dialled);
        self.roots
            .current()
            .verify_server_cert(end_entity, intermediates, name, ocsp_response, now)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `text` to `path` as a rotation does: a new file renamed over the old one.
    fn rotate(path: &Path, text: &str) {
        let next = path.with_extension("next");
        std::fs::write(&next, text).unwrap();
        std::fs::rename(&next, path).unwrap();
    }

    /// A file's text, refused when it says "bad".
    fn reader(path: PathBuf) -> impl Fn() -> Result<String, ConfigError> + Send + Sync {
        move || {
            let text = std::fs::read_to_string(&path).map_err(|e| invalid("f", e.to_string()))?;
            if text.contains("bad") {
                return Err(invalid("f", "is bad"));
            }
            Ok(text)
        }
    }

    #[test]
    fn a_changed_file_is_read_again_and_an_unusable_change_keeps_the_last_good_one() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let counted = recorder.handle();
        let _local = metrics::set_default_local_recorder(&recorder);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.pem");
        rotate(&path, "one");
        let r = Reloading::new(
            telemetry::CqlTlsFile::Ca,
            vec![path.clone()],
            reader(path.clone()),
        )
        .unwrap();
        assert_eq!(*r.current(), "one");
        rotate(&path, "two");
        assert_eq!(*r.current(), "two", "a file renamed over the old one");
        std::fs::write(&path, "bad").unwrap();
        assert_eq!(
            *r.current(),
            "two",
            "an unusable change keeps the last good value"
        );
        std::fs::remove_file(&path).unwrap();
        assert_eq!(*r.current(), "two", "a file gone keeps the last good value");
        // Written in place, same length: a new modification time.
        std::fs::write(&path, "six").unwrap();
        assert_eq!(*r.current(), "six");
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, "ten").unwrap();
        assert_eq!(*r.current(), "ten", "rewritten in place, same length");
        let text = counted.render();
        assert!(
            text.contains("hookline_store_tls_files_refused{file=\"ca\"} 0\n"),
            "the files in use are the ones on disk: {text}"
        );
        for (outcome, n) in [("used", 3), ("refused", 2)] {
            let series = format!(
                "hookline_store_tls_rereads_total{{file=\"ca\",outcome=\"{outcome}\"}} {n}\n"
            );
            assert!(text.contains(&series), "no {series} in {text}");
        }
    }

    #[test]
    fn a_file_that_cannot_be_read_at_start_is_the_callers_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.pem");
        std::fs::write(&path, "bad").unwrap();
        let e = Reloading::new(telemetry::CqlTlsFile::Ca, vec![path.clone()], reader(path))
            .unwrap_err();
        assert_eq!(e.to_string(), "store.scylla.f is bad");
    }

    #[test]
    fn an_unchanged_file_is_not_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.pem");
        rotate(&path, "one");
        let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (counted, read) = (reads.clone(), reader(path.clone()));
        let r = Reloading::new(telemetry::CqlTlsFile::Ca, vec![path.clone()], move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            read()
        })
        .unwrap();
        for _ in 0..5 {
            assert_eq!(*r.current(), "one");
        }
        assert_eq!(reads.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn the_watch_reports_an_unusable_rotation_without_a_connection_and_ends_with_it() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let counted = recorder.handle();
        let _local = metrics::set_default_local_recorder(&recorder);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("client.pem");
        rotate(&path, "one");
        let r = Arc::new(
            Reloading::new(
                telemetry::CqlTlsFile::ClientCert,
                vec![path.clone()],
                reader(path.clone()),
            )
            .unwrap(),
        );
        let watch = Watch(vec![Arc::downgrade(&r) as Weak<dyn Refresh>]);
        // On this thread: the local recorder counts what the watch reports.
        let watching = tokio::spawn(watch.run(std::time::Duration::from_millis(10)));
        let refused =
            |v: u8| format!("hookline_store_tls_files_refused{{file=\"client_cert\"}} {v}\n");
        assert!(counted.render().contains(&refused(0)));
        rotate(&path, "bad");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !counted.render().contains(&refused(1)) {
            assert!(std::time::Instant::now() < deadline, "{}", counted.render());
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(*r.current(), "one", "the last good value stays in use");
        rotate(&path, "two");
        while !counted.render().contains(&refused(0)) {
            assert!(std::time::Instant::now() < deadline, "{}", counted.render());
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        drop(r);
        tokio::time::timeout(std::time::Duration::from_secs(5), watching)
            .await
            .expect("the watch ends once its TLS settings are dropped")
            .unwrap();
    }

    #[test]
    fn only_settings_with_files_are_watched() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/storage/scylla/testdata");
        let mozilla = CqlTls::default();
        let (_, watch) = client_config(&mozilla).unwrap();
        assert!(!watch.watches_files(), "Mozilla's roots are compiled in");
        let with_cert = CqlTls {
            cert_file: Some(dir.join("expires-2036.pem")),
            key_file: Some(dir.join("expires-2036.key")),
            ..mozilla.clone()
        };
        let (_, watch) = client_config(&with_cert).unwrap();
        assert!(watch.watches_files(), "the client certificate's files");
    }

    #[test]
    fn the_client_certificates_expiry_is_shown_when_it_is_read() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let counted = recorder.handle();
        let _local = metrics::set_default_local_recorder(&recorder);
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/storage/scylla/testdata");
        let provider = rustls::crypto::ring::default_provider();
        certified_key(
            &dir.join("expires-2036.pem"),
            &dir.join("expires-2036.key"),
            &provider,
        )
        .expect("the test certificate and its key");
        // notAfter 2036-01-01T00:00:00Z.
        let text = counted.render();
        assert!(
            text.contains("hookline_store_tls_cert_expiry_timestamp_seconds 2082758400\n"),
            "{text}"
        );
    }
}
