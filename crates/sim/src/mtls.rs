//! agnhost's `mtlsserver` and `mtlsclient` in the sim, the pair the PodCertificate mTLS
//! test runs: the client polls `GET /spiffe-echo` every 10 s and logs
//! `Got response body: Client Identity: spiffe://…`. The exchange is a real TLS handshake
//! between the two containers' files (their podCertificate credential bundles and
//! ClusterTrustBundle projections), driven in memory: a certificate the other side does not
//! trust, a key that does not match or a missing file fails as it would between the real
//! binaries.
//!
//! As upstream's server, the server asks for a client certificate without requiring one
//! at the handshake (Go's `RequestClientCert`); its handler then verifies the chain against
//! its SPIFFE trust bundle and answers 401 when there is none, it does not verify, or it
//! has not exactly one URI SAN.

use std::io::{Read, Write};
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

/// One side's files: its credential bundle (a PKCS#8 key and its certificate chain, as the
/// podCertificate projection writes it) and the trust bundle it verifies the peer with.
#[derive(Clone, Debug, Default)]
pub(crate) struct Party {
    pub cred_bundle: String,
    pub trust_bundle: String,
}

/// An answer of the server: status code and body.
pub(crate) type Answer = (u16, String);

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The key and chain of a credential bundle, or Go's message for what is missing.
fn credential(
    bundle: &str,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let mut key = None;
    let mut chain = Vec::new();
    for item in rustls_pemfile::read_all(&mut bundle.as_bytes()) {
        match item {
            Ok(rustls_pemfile::Item::Pkcs8Key(k)) => key = Some(PrivateKeyDer::Pkcs8(k)),
            Ok(rustls_pemfile::Item::X509Certificate(c)) => chain.push(c),
            Ok(_) => {}
            Err(e) => return Err(format!("while parsing credential bundle: {e}")),
        }
    }
    let key = key.ok_or("client credential bundle had no private key")?;
    if chain.is_empty() {
        return Err("client credential bundle had no certificates".into());
    }
    Ok((chain, key))
}

/// The certificates of a trust bundle (what Go's `AppendCertsFromPEM` keeps: the ones
/// that parse).
fn roots(bundle: &str) -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut bundle.as_bytes()).flatten() {
        let _ = roots.add(c);
    }
    roots
}

/// Go's `tls.RequestClientCert`: a certificate is asked for, any offered one is taken
/// (its signature over the handshake is still checked), none is fine too. The handler
/// decides.
#[derive(Debug)]
struct RequestClientCert(Arc<CryptoProvider>);

impl ClientCertVerifier for RequestClientCert {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn client_auth_mandatory(&self) -> bool {
        false
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
            &self.0.signature_verification_algorithms,
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
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The server's TLS configuration from its credential bundle.
pub(crate) fn server_config(server: &Party) -> Result<rustls::ServerConfig, String> {
    let (chain, key) = credential(&server.cred_bundle)?;
    let provider = provider();
    rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(Arc::new(RequestClientCert(provider)))
        .with_single_cert(chain, key)
        .map_err(|e| format!("tls: {e}"))
}

/// What the server answers to `method path` from a client that presented `peer` (leaf
/// first), verified against the server's trust bundle.
pub(crate) fn answer(
    server: &Party,
    method: &str,
    path: &str,
    peer: &[CertificateDer<'_>],
) -> Answer {
    const REQUIRED: &str = "SPIFFE client certificate authentication required\n";
    if path.split('?').next() != Some("/spiffe-echo") {
        return (404, "404 page not found\n".into());
    }
    if method != "GET" && method != "HEAD" {
        return (405, "Method Not Allowed\n".into());
    }
    let Some((leaf, intermediates)) = peer.split_first() else {
        return (401, REQUIRED.into());
    };
    let roots = roots(&server.trust_bundle);
    let verified = (!roots.is_empty())
        .then(|| {
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .ok()
        })
        .flatten()
        .is_some_and(|v| {
            v.verify_client_cert(leaf, intermediates, UnixTime::now())
                .is_ok()
        });
    if !verified {
        return (401, REQUIRED.into());
    }
    let uris: Vec<String> = match x509_parser::parse_x509_certificate(leaf) {
        Ok((_, c)) => c
            .subject_alternative_name()
            .ok()
            .flatten()
            .map(|san| {
                san.value
                    .general_names
                    .iter()
                    .filter_map(|n| match n {
                        x509_parser::extensions::GeneralName::URI(u) => Some((*u).to_owned()),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    match uris.as_slice() {
        [uri] => (200, format!("Client Identity: {uri}")),
        _ => (401, "Malformed SPIFFE certificate\n".into()),
    }
}

/// Serves one connection to the server from a client outside the simulation (the API
/// server's proxies, port-forward): the same handshake and handler over the stream.
pub(crate) async fn serve(io: tokio::io::DuplexStream, server: Party) {
    let Ok(cfg) = server_config(&server) else {
        tracing::warn!("agnhost mtlsserver: the credential bundle does not load");
        return;
    };
    let Ok(stream) = tokio_rustls::TlsAcceptor::from(Arc::new(cfg))
        .accept(io)
        .await
    else {
        return;
    };
    let peer: Vec<CertificateDer<'static>> = stream
        .get_ref()
        .1
        .peer_certificates()
        .map(|p| p.iter().map(|c| c.clone().into_owned()).collect())
        .unwrap_or_default();
    let server = Arc::new(server);
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let (status, body) = answer(&server, req.method().as_str(), req.uri().path(), &peer);
        async move {
            hyper::Response::builder()
                .status(status)
                .header("Content-Type", "text/plain; charset=utf-8")
                .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .await;
}

/// Moves what `from` has to send into `to`; whether anything moved.
fn flight(from: &mut rustls::Connection, to: &mut rustls::Connection) -> Result<bool, Side> {
    let mut wire = Vec::new();
    while from.wants_write() {
        if from.write_tls(&mut wire).is_err() {
            break;
        }
    }
    if wire.is_empty() {
        return Ok(false);
    }
    let mut rest = wire.as_slice();
    while !rest.is_empty() {
        match to.read_tls(&mut rest) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        to.process_new_packets().map_err(Side::Receiver)?;
    }
    Ok(true)
}

/// Which end of a flight failed.
enum Side {
    Receiver(rustls::Error),
}

/// Both directions until neither side has anything to send. `Err((client_failed, e))`.
fn settle(
    client: &mut rustls::Connection,
    server: &mut rustls::Connection,
) -> Result<(), (bool, rustls::Error)> {
    for _ in 0..32 {
        let a = flight(client, server).map_err(|Side::Receiver(e)| (false, e))?;
        let b = flight(server, client).map_err(|Side::Receiver(e)| (true, e))?;
        if !a && !b {
            return Ok(());
        }
    }
    Ok(())
}

/// Go's wording of a TLS failure, as the client's `http.Client.Get` reports it.
fn tls_error(client_failed: bool, e: &rustls::Error) -> String {
    use rustls::{CertificateError, Error};
    if !client_failed {
        // The server refused: the client sees its alert.
        return format!("remote error: tls: {e}");
    }
    match e {
        Error::InvalidCertificate(CertificateError::UnknownIssuer)
        | Error::InvalidCertificate(CertificateError::BadSignature) => {
            "tls: failed to verify certificate: x509: certificate signed by unknown authority"
                .into()
        }
        Error::InvalidCertificate(CertificateError::NotValidForName)
        | Error::InvalidCertificate(CertificateError::NotValidForNameContext { .. }) => {
            "tls: failed to verify certificate: x509: certificate is valid for other names".into()
        }
        Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        ) => "tls: failed to verify certificate: x509: certificate has expired or is not yet valid"
            .into(),
        other => format!("tls: {other}"),
    }
}

/// The client's `GET https://<host><path>`: a handshake with trust in `client`'s trust
/// bundle and `client`'s credential offered, then one HTTP/1.1 request. `Err` holds the
/// error text Go's HTTP client gives after `Get "<url>": `.
pub(crate) fn fetch(
    client: &Party,
    server: &Party,
    host: &str,
    path: &str,
) -> Result<Answer, String> {
    let (chain, key) = credential(&client.cred_bundle)?;
    let ccfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots(&client.trust_bundle))
        .with_client_auth_cert(chain, key)
        .map_err(|e| format!("tls: {e}"))?;
    let name = ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())?;
    let mut c = rustls::Connection::Client(
        rustls::ClientConnection::new(Arc::new(ccfg), name).map_err(|e| e.to_string())?,
    );
    // A server whose credential does not load never listened: the connection is refused.
    let scfg = server_config(server).map_err(|_| "connect: connection refused".to_owned())?;
    let mut s = rustls::Connection::Server(
        rustls::ServerConnection::new(Arc::new(scfg)).map_err(|e| e.to_string())?,
    );
    settle(&mut c, &mut s).map_err(|(who, e)| tls_error(who, &e))?;
    if c.is_handshaking() || s.is_handshaking() {
        return Err("tls: handshake did not complete".into());
    }
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: Go-http-client/1.1\r\nAccept-Encoding: gzip\r\n\r\n");
    c.writer()
        .write_all(request.as_bytes())
        .map_err(|e| e.to_string())?;
    settle(&mut c, &mut s).map_err(|(who, e)| tls_error(who, &e))?;
    let mut got = Vec::new();
    let _ = s.reader().read_to_end(&mut got);
    let got = String::from_utf8_lossy(&got).into_owned();
    let mut words = got.lines().next().unwrap_or("").split(' ');
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let peer: Vec<CertificateDer<'static>> = s
        .peer_certificates()
        .map(|p| p.iter().map(|c| c.clone().into_owned()).collect())
        .unwrap_or_default();
    let (status, body) = answer(server, method, target, &peer);
    let reply = format!(
        "HTTP/1.1 {status} {}\r\nContent-Length: {}\r\n\r\n{body}",
        reason(status),
        body.len()
    );
    s.writer()
        .write_all(reply.as_bytes())
        .map_err(|e| e.to_string())?;
    settle(&mut c, &mut s).map_err(|(who, e)| tls_error(who, &e))?;
    let mut back = Vec::new();
    let _ = c.reader().read_to_end(&mut back);
    let back = String::from_utf8_lossy(&back);
    let (head, body) = back.split_once("\r\n\r\n").unwrap_or((&back, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("malformed HTTP response")?;
    Ok((status, body.to_owned()))
}

/// The reason phrase of the statuses the server answers with.
pub(crate) fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// A CA, and a leaf it signs with a SPIFFE URI and `dns` as its names.
    fn ca() -> (rcgen::Certificate, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        (p.self_signed(&key).unwrap(), key)
    }

    fn leaf(ca: &(rcgen::Certificate, rcgen::KeyPair), dns: &str, uris: &[&str]) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec![dns.to_owned()]).unwrap();
        for u in uris {
            p.subject_alt_names
                .push(rcgen::SanType::URI((*u).try_into().unwrap()));
        }
        p.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        ];
        let issuer = rcgen::Issuer::from_ca_cert_pem(&ca.0.pem(), &ca.1).unwrap();
        let cert = p.signed_by(&key, &issuer).unwrap();
        format!("{}{}", key.serialize_pem(), cert.pem())
    }

    const HOST: &str = "server.ns.svc.cluster.local";

    #[test]
    fn client_and_server_agree_on_the_spiffe_identity() {
        let ca = ca();
        let trust = ca.0.pem();
        let server = Party {
            cred_bundle: leaf(&ca, HOST, &["spiffe://cluster.local/ns/ns/sa/default"]),
            trust_bundle: trust.clone(),
        };
        let client = Party {
            cred_bundle: leaf(&ca, "client", &["spiffe://cluster.local/ns/ns/sa/client"]),
            trust_bundle: trust,
        };
        let got = fetch(&client, &server, HOST, "/spiffe-echo").unwrap();
        assert_eq!(
            got,
            (
                200,
                "Client Identity: spiffe://cluster.local/ns/ns/sa/client".into()
            )
        );
        assert_eq!(
            fetch(&client, &server, HOST, "/other").unwrap(),
            (404, "404 page not found\n".into())
        );
    }

    #[test]
    fn trust_is_checked_both_ways() {
        let (ca1, ca2) = (ca(), ca());
        let server = Party {
            cred_bundle: leaf(&ca1, HOST, &["spiffe://x/server"]),
            trust_bundle: ca1.0.pem(),
        };
        // The client does not trust the server's issuer.
        let stranger = Party {
            cred_bundle: leaf(&ca1, "c", &["spiffe://x/c"]),
            trust_bundle: ca2.0.pem(),
        };
        let e = fetch(&stranger, &server, HOST, "/spiffe-echo").unwrap_err();
        assert!(e.contains("certificate signed by unknown authority"), "{e}");
        // The wrong name.
        let client = Party {
            cred_bundle: leaf(&ca1, "c", &["spiffe://x/c"]),
            trust_bundle: ca1.0.pem(),
        };
        let e = fetch(&client, &server, "other.ns.svc", "/spiffe-echo").unwrap_err();
        assert!(e.contains("valid for other names"), "{e}");
        // A client certificate from another CA: the handshake passes, the handler refuses.
        let foreign = Party {
            cred_bundle: leaf(&ca2, "c", &["spiffe://x/c"]),
            trust_bundle: ca1.0.pem(),
        };
        assert_eq!(
            fetch(&foreign, &server, HOST, "/spiffe-echo").unwrap().0,
            401
        );
        // Two URIs: malformed.
        let two = Party {
            cred_bundle: leaf(&ca1, "c", &["spiffe://x/a", "spiffe://x/b"]),
            trust_bundle: ca1.0.pem(),
        };
        assert_eq!(
            fetch(&two, &server, HOST, "/spiffe-echo").unwrap(),
            (401, "Malformed SPIFFE certificate\n".into())
        );
        // A bundle without its key.
        let keyless = Party {
            cred_bundle: ca1.0.pem(),
            trust_bundle: ca1.0.pem(),
        };
        assert_eq!(
            fetch(&keyless, &server, HOST, "/spiffe-echo").unwrap_err(),
            "client credential bundle had no private key"
        );
    }
}
