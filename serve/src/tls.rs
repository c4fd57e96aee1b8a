//! TLS for the services: the PEM files named on a command line, read and checked once, as
//! tonic's server and client configurations (`dlframe serve`, the executors' result servers, the
//! cluster's own calls) and as rustls's (the scheduler, which axum serves; see
//! `cluster/listener.rs`). rustls with the ring provider, TLS 1.2 and 1.3, as tonic's `tls-ring`.
//!
//! Each file is checked to hold a PEM block of its kind before anything is built from it, so
//! that a wrong file is named with its flag (rustls and tonic say only what failed).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// A server's TLS files, and the CA it trusts: for `dlframe serve` the CA of its clients'
/// certificates (mutual TLS), for a cluster's process the CA of the cluster's certificates,
/// which it trusts when it calls another of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: Option<PathBuf>,
}

/// A command's TLS flags as given, before they are checked to go together: `flags` names them.
#[derive(Debug)]
pub(crate) struct TlsFlags {
    flags: Flags<'static>,
    given: (Option<PathBuf>, Option<PathBuf>, Option<PathBuf>),
}

impl TlsFlags {
    /// None given yet, of the flags named by `flags`: (cert, key, ca).
    pub(crate) fn new(flags: Flags<'static>) -> TlsFlags {
        TlsFlags { flags, given: (None, None, None) }
    }

    /// Reads one of the three flags; false for another flag.
    pub(crate) fn flag(
        &mut self,
        flag: &str,
        value: &mut dyn FnMut(&str) -> Result<String, String>,
    ) -> Result<bool, String> {
        let slot = match flag {
            f if f == self.flags.0 => &mut self.given.0,
            f if f == self.flags.1 => &mut self.given.1,
            f if f == self.flags.2 => &mut self.given.2,
            _ => return Ok(false),
        };
        *slot = Some(PathBuf::from(value(flag)?));
        Ok(true)
    }

    /// The files: none of them, or the certificate and key (and the CA where `ca_required`).
    pub(crate) fn files(self, what: &str, ca_required: bool) -> Result<Option<TlsFiles>, String> {
        let (cert_flag, key_flag, ca_flag) = self.flags;
        match self.given {
            (None, None, None) => Ok(None),
            (Some(_), Some(_), None) if ca_required => Err(format!(
                "{what}: {cert_flag} and {key_flag} need {ca_flag}, the CA that signed the others'"
            )),
            (Some(cert), Some(key), ca) => Ok(Some(TlsFiles { cert, key, ca })),
            (_, _, Some(_)) => Err(format!("{what}: {ca_flag} needs {cert_flag} and {key_flag}")),
            _ => Err(format!("{what}: {cert_flag} and {key_flag} go together")),
        }
    }
}

/// The bytes of `path`, which must hold a PEM block of `kind` (`CERTIFICATE`, `PRIVATE KEY`);
/// `flag` names the file in the error.
fn read_pem(path: &Path, flag: &str, kind: &str) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{flag} {}: cannot read it: {e}", path.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    match text.lines().any(|l| l.starts_with("-----BEGIN ") && l.contains(kind)) {
        true => Ok(bytes),
        false => Err(format!("{flag} {}: no PEM {kind} in the file", path.display())),
    }
}

/// The flags a command names its files with: (cert, key, ca).
pub(crate) type Flags<'a> = (&'a str, &'a str, &'a str);

/// A tonic server's TLS: the certificate chain and key, and where `clients_by_ca` and the files
/// name a CA, client certificates required and checked against it (mutual TLS).
pub(crate) fn server_config(
    files: &TlsFiles,
    flags: Flags<'_>,
    clients_by_ca: bool,
) -> Result<ServerTlsConfig, String> {
    let cert = read_pem(&files.cert, flags.0, "CERTIFICATE")?;
    let key = read_pem(&files.key, flags.1, "PRIVATE KEY")?;
    let mut config = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
    if let Some(ca) = files.ca.as_ref().filter(|_| clients_by_ca) {
        config = config.client_ca_root(Certificate::from_pem(read_pem(ca, flags.2, "CERTIFICATE")?));
    }
    Ok(config)
}

/// A tonic client's TLS: servers are trusted when the CA in `files` signed their certificate.
pub(crate) fn client_config(files: &TlsFiles, flags: Flags<'_>) -> Result<ClientTlsConfig, String> {
    let ca = files.ca.as_ref().ok_or_else(|| format!("{} is needed to call the others over TLS", flags.2))?;
    Ok(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read_pem(ca, flags.2, "CERTIFICATE")?)))
}

/// A rustls server configuration of the certificate chain and key in `files` (no client
/// certificates), for a server that tonic does not serve. HTTP/2 only, as gRPC is.
pub(crate) fn rustls_server(files: &TlsFiles, flags: Flags<'_>) -> Result<Arc<rustls::ServerConfig>, String> {
    let cert = read_pem(&files.cert, flags.0, "CERTIFICATE")?;
    let key = read_pem(&files.key, flags.1, "PRIVATE KEY")?;
    let chain = CertificateDer::pem_slice_iter(&cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{} {}: {e}", flags.0, files.cert.display()))?;
    let key = PrivateKeyDer::from_pem_slice(&key)
        .map_err(|e| format!("{} {}: {e}", flags.1, files.key.display()))?;
    let mut config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| {
                format!("{} {} and {} {}: {e}", flags.0, files.cert.display(), flags.1, files.key.display())
            })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// An error and its causes, as one line: tonic's own says only "transport error".
pub(crate) fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAGS: Flags<'static> = ("--tls-cert", "--tls-key", "--tls-ca");

    fn files(given: &[&str], ca_required: bool) -> Result<Option<TlsFiles>, String> {
        let mut flags = TlsFlags::new(FLAGS);
        for pair in given.chunks(2) {
            let mut value = |_: &str| Ok(pair[1].to_string());
            assert!(flags.flag(pair[0], &mut value).unwrap(), "{}", pair[0]);
        }
        assert!(!flags.flag("--other", &mut |_| Ok(String::new())).unwrap());
        flags.files("x", ca_required)
    }

    #[test]
    fn the_flags_go_together() {
        assert_eq!(files(&[], true), Ok(None));
        let e = files(&["--tls-cert", "c", "--tls-key", "k"], true).unwrap_err();
        assert!(e.contains("need --tls-ca"), "{e}");
        assert!(files(&["--tls-cert", "c", "--tls-key", "k"], false).unwrap().is_some());
        let e = files(&["--tls-cert", "c"], false).unwrap_err();
        assert!(e.contains("go together"), "{e}");
        let e = files(&["--tls-ca", "a"], false).unwrap_err();
        assert!(e.contains("--tls-ca needs"), "{e}");
    }

    #[test]
    fn a_wrong_file_is_named_with_its_flag() {
        let dir = std::env::temp_dir().join(format!("dlframe-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let not_pem = dir.join("not.pem");
        std::fs::write(&not_pem, "hello").unwrap();
        let f = TlsFiles { cert: not_pem.clone(), key: not_pem.clone(), ca: Some(dir.join("missing.pem")) };
        let e = rustls_server(&f, FLAGS).unwrap_err();
        assert!(e.starts_with("--tls-cert ") && e.contains("no PEM CERTIFICATE"), "{e}");
        let e = client_config(&f, FLAGS).unwrap_err();
        assert!(e.starts_with("--tls-ca ") && e.contains("missing.pem") && e.contains("cannot read"), "{e}");
        // A certificate block that is not one.
        std::fs::write(&not_pem, "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n")
            .unwrap();
        let key = dir.join("key.pem");
        std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n").unwrap();
        let f = TlsFiles { cert: not_pem, key, ca: None };
        let e = rustls_server(&f, FLAGS).unwrap_err();
        assert!(e.starts_with("--tls-cert "), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
