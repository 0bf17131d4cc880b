//! A small TCP proxy between the relay and a service, for injecting faults without
//! touching the shared services: cut every connection, refuse new ones, or stall traffic;
//! or move it to another server, as a DNS name or virtual IP moves in a failover.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A proxy listening on an ephemeral loopback port and forwarding to `target`.
pub struct FaultProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    state: Arc<State>,
}

struct State {
    /// Where new connections go (open ones stay where they are).
    target: Mutex<SocketAddr>,
    /// Refuse (close at once) new connections.
    refusing: AtomicBool,
    /// Forward nothing while set.
    stalled: AtomicBool,
    /// Bumped to cut every open connection.
    cuts: watch::Sender<u64>,
    /// Connections accepted so far.
    accepted: AtomicU64,
    /// Connections refused so far (attempts while down).
    refused: AtomicU64,
    /// The local ports of the connections it opened to its targets, so far.
    upstream: Mutex<Vec<u16>>,
}

impl FaultProxy {
    /// Starts a proxy to `target` (a test service's address, [`crate::server_of`]) on the
    /// current runtime.
    pub async fn start(target: SocketAddr) -> Self {
        Self::start_on(std::net::Ipv4Addr::LOCALHOST.into(), target).await
    }

    /// [`FaultProxy::start`], listening on `ip` (an address of this machine's own).
    pub async fn start_on(ip: std::net::IpAddr, target: SocketAddr) -> Self {
        let listener = TcpListener::bind((ip, 0)).await.expect("proxy binds");
        let addr = listener.local_addr().expect("proxy address");
        let state = Arc::new(State {
            target: Mutex::new(target),
            refusing: AtomicBool::new(false),
            stalled: AtomicBool::new(false),
            cuts: watch::channel(0).0,
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            upstream: Mutex::new(Vec::new()),
        });
        let accepting = Arc::clone(&state);
        actix_rt::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if accepting.refusing.load(Ordering::SeqCst) {
                    accepting.refused.fetch_add(1, Ordering::SeqCst);
                    drop(client);
                    continue;
                }
                accepting.accepted.fetch_add(1, Ordering::SeqCst);
                let state = Arc::clone(&accepting);
                let target = *accepting.target.lock().unwrap_or_else(|e| e.into_inner());
                actix_rt::spawn(async move {
                    if let Ok(server) = TcpStream::connect(target).await {
                        if let Ok(local) = server.local_addr() {
                            let mut upstream =
                                state.upstream.lock().unwrap_or_else(|e| e.into_inner());
                            upstream.push(local.port());
                        }
                        pipe(client, server, state).await;
                    }
                });
            }
        });
        Self { addr, state }
    }

    /// Starts a proxy to the server `url` names (its host and port; the scheme's port when
    /// it names none); returns the proxy and `url` pointed at it.
    pub async fn in_front_of(url: &str) -> (Self, String) {
        let mut url = url::Url::parse(url).unwrap_or_else(|error| panic!("{url}: {error}"));
        let host = url.host_str().expect("a URL with a host").to_owned();
        let port = url.port().unwrap_or(match url.scheme() {
            "postgres" | "postgresql" => 5432,
            "mysql" | "mariadb" => 3306,
            "amqp" => 5672,
            other => panic!("no default port known for {other}://"),
        });
        let target = tokio::net::lookup_host((host.as_str(), port))
            .await
            .ok()
            .and_then(|mut addresses| addresses.next())
            .unwrap_or_else(|| panic!("{host}:{port} does not resolve"));
        let proxy = Self::start(target).await;
        url.set_ip_host(proxy.addr.ip()).expect("a host");
        url.set_port(Some(proxy.addr.port())).expect("a port");
        (proxy, url.into())
    }

    /// Sends new connections to `target` from now on; open ones stay with the server they
    /// reached (a DNS name or virtual IP that moved, connections left open).
    pub fn point_at(&self, target: SocketAddr) {
        *self.state.target.lock().unwrap_or_else(|e| e.into_inner()) = target;
    }

    /// Closes every open connection; new ones are accepted again at once.
    pub fn cut(&self) {
        self.state.cuts.send_modify(|n| *n += 1);
    }

    /// Cuts every connection and refuses new ones until [`FaultProxy::restore`].
    pub fn go_down(&self) {
        self.state.refusing.store(true, Ordering::SeqCst);
        self.cut();
    }

    /// Accepts and forwards again.
    pub fn restore(&self) {
        self.state.refusing.store(false, Ordering::SeqCst);
        self.state.stalled.store(false, Ordering::SeqCst);
    }

    /// Keeps connections open but forwards nothing (a hung peer).
    pub fn stall(&self) {
        self.state.stalled.store(true, Ordering::SeqCst);
    }

    /// Connections accepted so far (reconnections show up here).
    pub fn accepted(&self) -> u64 {
        self.state.accepted.load(Ordering::SeqCst)
    }

    /// The local ports of the connections it opened to its targets so far: how the
    /// server tells the proxied clients' sessions from others (`pg_stat_activity`'s
    /// `client_port`).
    pub fn upstream_ports(&self) -> Vec<u16> {
        self.state
            .upstream
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Connections refused so far: each attempt to connect while down.
    pub fn refused(&self) -> u64 {
        self.state.refused.load(Ordering::SeqCst)
    }
}

async fn pipe(client: TcpStream, server: TcpStream, state: Arc<State>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let mut cut = state.cuts.subscribe();
    cut.mark_unchanged();
    let up = copy(client_read, server_write, Arc::clone(&state));
    let down = copy(server_read, client_write, state);
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = cut.changed() => {}
    }
}

async fn copy(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    state: Arc<State>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // A stalled link holds the bytes back until restored or cut.
        while state.stalled.load(Ordering::SeqCst) {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}
