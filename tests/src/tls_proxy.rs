//! A TLS-terminating proxy in front of a plain service (the local RabbitMQ speaks plain
//! AMQP only), with a throwaway CA made at start: the relay connects with `amqps://` and
//! the CA file, the proxy forwards the decrypted bytes to the service.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::TlsAcceptor;

/// A CA made for one test: its certificate (PEM) and the means to issue server
/// certificates.
pub struct TestCa {
    /// The CA certificate, PEM: what the client is told to trust.
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl TestCa {
    /// A new self-signed CA.
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let certificate = params.self_signed(&key).expect("CA certificate");
        Self {
            pem: certificate.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// Writes the CA certificate to a fresh file and returns its path.
    pub fn write_pem(&self) -> PathBuf {
        let path = std::env::temp_dir().join(format!("{}.pem", crate::unique_name("test_ca")));
        std::fs::write(&path, &self.pem).expect("CA file written");
        path
    }

    /// A server configuration with a certificate for `names` issued by this CA, on the
    /// ring provider (the relay's backend).
    fn server_config(&self, names: &[&str]) -> ServerConfig {
        let key = KeyPair::generate().expect("server key");
        let names = names
            .iter()
            .map(|name| name.to_string())
            .collect::<Vec<_>>();
        let params = CertificateParams::new(names).expect("server params");
        let certificate = params.signed_by(&key, &self.issuer).expect("server cert");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![certificate.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .expect("server certificate accepted")
    }
}

/// A proxy on an ephemeral loopback port that accepts TLS and forwards to `target`.
pub struct TlsProxy {
    /// Where clients connect (with TLS).
    pub addr: SocketAddr,
    /// The CA that issued the proxy's certificate.
    pub ca: TestCa,
}

impl TlsProxy {
    /// Starts a proxy to `target` (the test broker's address, [`crate::server_of`]) on the
    /// current runtime, its certificate naming `localhost` and `127.0.0.1`.
    pub async fn start(target: SocketAddr) -> Self {
        Self::start_naming(target, &["localhost", "127.0.0.1"]).await
    }

    /// [`TlsProxy::start`] with a certificate naming only `names` (DNS names or IP
    /// addresses).
    pub async fn start_naming(target: SocketAddr, names: &[&str]) -> Self {
        let ca = TestCa::new("outbox-relay test CA");
        let acceptor = TlsAcceptor::from(Arc::new(ca.server_config(names)));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy binds");
        let addr = listener.local_addr().expect("proxy address");
        actix_rt::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let _ = client.set_nodelay(true);
                actix_rt::spawn(async move {
                    // A failed handshake (a client that does not trust the CA) just ends
                    // this connection; the client reports it.
                    let Ok(mut client) = acceptor.accept(client).await else {
                        return;
                    };
                    let Ok(mut server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = server.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
            }
        });
        Self { addr, ca }
    }

    /// The test broker's URL (`OUTBOX_TEST_AMQP_URL`: its user, password and vhost) as
    /// `amqps://…@localhost:PORT/…`, through this proxy (its certificate names localhost).
    pub fn amqps_url(&self) -> String {
        self.amqps_url_via("localhost")
    }

    /// [`TlsProxy::amqps_url`] with `host` (a name or an address of this machine) in it.
    pub fn amqps_url_via(&self, host: &str) -> String {
        let mut url = url::Url::parse(&crate::services::amqp_url()).expect("a URL");
        url.set_scheme("amqps").expect("amqps");
        url.set_host(Some(host)).expect("a host");
        url.set_port(Some(self.addr.port())).expect("a port");
        url.into()
    }
}
