//! The node API's TLS: the serving certificate (`tlsCertFile`/`tlsPrivateKeyFile`, or a
//! self-signed pair made once under `--root-dir`, as kubelet makes one under its cert dir),
//! `tlsMinVersion` and `tlsCipherSuites` honoured or refused by name, and client certificates
//! asked for but checked by the authenticator ([`super::auth::X509`]), so that a certificate
//! from another CA gets kubelet's 401 rather than a failed handshake.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};

/// What the TLS settings of the configuration say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// `tlsCertFile` and `tlsPrivateKeyFile`; `None`: the self-signed pair.
    pub cert_and_key: Option<(PathBuf, PathBuf)>,
    /// `tlsMinVersion` (`VersionTLS12`, `VersionTLS13`; empty: TLS 1.2).
    pub min_version: String,
    /// `tlsCipherSuites` by Go's names (empty: rustls's defaults).
    pub cipher_suites: Vec<String>,
}

/// Go's names of the cipher suites rustls has, as kubelet's `tlsCipherSuites` takes them.
const SUITES: [(&str, rustls::CipherSuite); 9] = [
    (
        "TLS_AES_128_GCM_SHA256",
        rustls::CipherSuite::TLS13_AES_128_GCM_SHA256,
    ),
    (
        "TLS_AES_256_GCM_SHA384",
        rustls::CipherSuite::TLS13_AES_256_GCM_SHA384,
    ),
    (
        "TLS_CHACHA20_POLY1305_SHA256",
        rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        rustls::CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
];

/// The crypto provider with the TLS 1.2 suites `names` asks for (all of rustls's when empty)
/// and every TLS 1.3 suite: as in Go, whose `tls.Config.CipherSuites` kubelet fills from
/// `tlsCipherSuites`, the list does not apply to TLS 1.3 (so `tlsMinVersion: VersionTLS13` with
/// TLS 1.2 names starts, as kubelet does).
///
/// Errors: a name rustls does not have (CBC and RSA key exchange suites among them), naming it
/// and the setting.
pub fn provider(names: &[String]) -> Result<CryptoProvider, String> {
    let mut p = rustls::crypto::ring::default_provider();
    if names.is_empty() {
        return Ok(p);
    }
    let mut wanted = Vec::new();
    for n in names {
        let Some((_, suite)) = SUITES.iter().find(|(go, _)| go == n) else {
            return Err(format!(
                "tlsCipherSuites: {n:?} is not supported by nodelet (supported: {})",
                SUITES.map(|(go, _)| go).join(", ")
            ));
        };
        wanted.push(*suite);
    }
    p.cipher_suites
        .retain(|s| s.version() == &rustls::version::TLS13 || wanted.contains(&s.suite()));
    Ok(p)
}

/// TLS 1.3 alone.
static TLS13_ONLY: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];

/// The protocol versions of `tlsMinVersion`.
///
/// Errors: TLS 1.0 and 1.1 (rustls has neither) or an unknown name.
pub fn versions(min: &str) -> Result<&'static [&'static rustls::SupportedProtocolVersion], String> {
    match min {
        "" | "VersionTLS12" => Ok(rustls::ALL_VERSIONS),
        "VersionTLS13" => Ok(TLS13_ONLY),
        "VersionTLS10" | "VersionTLS11" => Err(format!(
            "tlsMinVersion: {min} is not supported by nodelet (TLS 1.2 is the oldest it speaks); use VersionTLS12 or VersionTLS13"
        )),
        other => Err(format!(
            "tlsMinVersion: {other:?} is not a TLS version (VersionTLS12, VersionTLS13)"
        )),
    }
}

/// A client certificate is asked for, never required; its chain is checked by the
/// authenticator. The handshake's own signature is checked here, so that the client holds the
/// certificate's key.
#[derive(Debug)]
struct AskForClientCert(WebPkiSupportedAlgorithms);

impl ClientCertVerifier for AskForClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
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
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// The self-signed pair's files under `root_dir` (kubelet's `<cert-dir>/kubelet.crt`).
pub fn self_signed_paths(root_dir: &Path) -> (PathBuf, PathBuf) {
    let dir = root_dir.join("pki");
    (dir.join("nodelet.crt"), dir.join("nodelet.key"))
}

/// Makes the self-signed serving pair once (kubelet's behaviour when no certificate is
/// configured): subject CN `system:node:<node>`, the node name and `ips` as SANs, and (as
/// nodelet's `address` is loopback by default, unlike kubelet's) `localhost`, 127.0.0.1 and ::1,
/// so that `curl --cacert <root-dir>/pki/nodelet.crt https://127.0.0.1:10250/…` verifies; valid
/// for one year from now. An existing pair is kept.
///
/// Errors: the pair cannot be made or written, naming the path.
pub fn ensure_self_signed(
    root_dir: &Path,
    node_name: &str,
    ips: &[std::net::IpAddr],
) -> Result<(PathBuf, PathBuf), String> {
    let (crt, key) = self_signed_paths(root_dir);
    if crt.exists() && key.exists() {
        return Ok((crt, key));
    }
    let mut names = vec![node_name.to_owned()];
    if node_name != "localhost" {
        names.push("localhost".to_owned());
    }
    let mut params = rcgen::CertificateParams::new(names)
        .map_err(|e| format!("self-signed certificate for {node_name:?}: {e}"))?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("system:node:{node_name}"),
    );
    let loopback = [
        std::net::IpAddr::from([127, 0, 0, 1]),
        std::net::IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
    ];
    let mut seen = std::collections::BTreeSet::new();
    params.subject_alt_names.extend(
        ips.iter()
            .chain(&loopback)
            .filter(|ip| seen.insert(**ip))
            .map(|ip| rcgen::SanType::IpAddress(*ip)),
    );
    let now = crate::clock::wall_now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let day = |secs: u64| {
        let d = k8s_openapi::jiff::Timestamp::from_second(secs as i64)
            .unwrap_or_default()
            .to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC)
            .date();
        rcgen::date_time_ymd(i32::from(d.year()), d.month() as u8, d.day() as u8)
    };
    params.not_before = day(now.as_secs().saturating_sub(86_400));
    params.not_after = day(now.as_secs() + 365 * 86_400);
    let pair = rcgen::KeyPair::generate().map_err(|e| format!("self-signed key: {e}"))?;
    let cert = params
        .self_signed(&pair)
        .map_err(|e| format!("self-signed certificate: {e}"))?;
    let dir = crt.parent().unwrap_or(root_dir);
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    write_private(&key, pair.serialize_pem().as_bytes())?;
    std::fs::write(&crt, cert.pem()).map_err(|e| format!("{}: {e}", crt.display()))?;
    Ok((crt, key))
}

/// Writes `bytes` to `path`, readable by its owner only.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(bytes))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The server's TLS configuration: the certificate chain and key in PEM files `crt` and `key`,
/// the versions and suites of `settings`, HTTP/1.1 only (upgrades need it; the API server's
/// client to the node speaks nothing else).
///
/// Errors: a file that cannot be read or holds no certificate or key (naming it and its
/// setting), a version or suite refused.
pub fn server_config(
    crt: &Path,
    key: &Path,
    settings: &TlsSettings,
) -> Result<Arc<ServerConfig>, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(crt)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| format!("tlsCertFile {}: {e}", crt.display()))?;
    if chain.is_empty() {
        return Err(format!("tlsCertFile {}: no certificate", crt.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("tlsPrivateKeyFile {}: {e}", key.display()))?;
    let provider = Arc::new(provider(&settings.cipher_suites)?);
    let verifier = Arc::new(AskForClientCert(provider.signature_verification_algorithms));
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions(&settings.min_version)?)
        .map_err(|e| format!("tlsMinVersion / tlsCipherSuites: {e}"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| format!("tlsCertFile / tlsPrivateKeyFile: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_suites_are_honoured_or_refused_by_name() {
        assert_eq!(versions("VersionTLS13").unwrap().len(), 1);
        assert!(versions("VersionTLS11")
            .unwrap_err()
            .contains("tlsMinVersion"));
        let tls13 = |p: &CryptoProvider| {
            p.cipher_suites
                .iter()
                .filter(|s| s.version() == &rustls::version::TLS13)
                .count()
        };
        let p = provider(&["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".into()]).unwrap();
        assert_eq!(
            tls13(&p),
            3,
            "TLS 1.3's suites whatever the list (Go's rule)"
        );
        assert_eq!(p.cipher_suites.len(), 4, "and the one TLS 1.2 suite named");
        let p = provider(&["TLS_AES_128_GCM_SHA256".into()]).unwrap();
        assert_eq!(
            (tls13(&p), p.cipher_suites.len()),
            (3, 3),
            "no TLS 1.2 suite"
        );
        let e = provider(&["TLS_RSA_WITH_AES_128_CBC_SHA".into()]).unwrap_err();
        assert!(e.contains("TLS_RSA_WITH_AES_128_CBC_SHA") && e.contains("tlsCipherSuites"));
    }

    #[test]
    fn the_self_signed_pair_is_made_once_and_serves() {
        let dir = tempfile::tempdir().unwrap();
        let ips = ["10.0.0.10".parse().unwrap()];
        let (crt, key) = ensure_self_signed(dir.path(), "node1", &ips).unwrap();
        let first = std::fs::read(&crt).unwrap();
        ensure_self_signed(dir.path(), "node1", &ips).unwrap();
        assert_eq!(std::fs::read(&crt).unwrap(), first, "kept");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
            0o600
        );
        server_config(&crt, &key, &TlsSettings::default()).unwrap();
        let der = CertificateDer::pem_file_iter(&crt)
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        let (_, parsed) = x509_parser::parse_x509_certificate(der.as_ref()).unwrap();
        assert_eq!(
            parsed
                .subject()
                .iter_common_name()
                .next()
                .unwrap()
                .as_str()
                .unwrap(),
            "system:node:node1"
        );
        let sans = parsed.subject_alternative_name().unwrap().unwrap();
        let names: Vec<String> = sans
            .value
            .general_names
            .iter()
            .map(|n| format!("{n}"))
            .collect();
        for want in ["node1", "localhost", "0a:00:00:0a", "7f:00:00:01"] {
            assert!(
                names.iter().any(|n| n.contains(want)),
                "{want} in {names:?}"
            );
        }
    }
}
