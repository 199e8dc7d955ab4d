//! A TCP proxy a test can cut, to take a shared server away from one test only: every open
//! connection is closed and new ones are closed as soon as they are accepted, until it is
//! restored.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

pub struct TcpProxy {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    accept: AbortHandle,
}

struct Shared {
    upstream: String,
    up: AtomicBool,
    accepted: AtomicUsize,
    refused: AtomicUsize,
    connections: Mutex<Vec<AbortHandle>>,
}

impl TcpProxy {
    /// A proxy to `upstream` on a free loopback port.
    pub async fn start(upstream: &str) -> TcpProxy {
        Self::start_at("127.0.0.1:0", upstream).await
    }

    /// A proxy to `upstream` listening on `listen`, for a server that tells its clients where
    /// to connect (a Kafka listener advertised at the proxy's address).
    pub async fn start_at(listen: &str, upstream: &str) -> TcpProxy {
        let listener = TcpListener::bind(listen)
            .await
            .unwrap_or_else(|e| panic!("bind the proxy to {listen}: {e}"));
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared {
            upstream: upstream.to_owned(),
            up: AtomicBool::new(true),
            accepted: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
            connections: Mutex::new(Vec::new()),
        });
        let accept = tokio::spawn({
            let shared = shared.clone();
            async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    if !shared.up.load(Ordering::SeqCst) {
                        shared.refused.fetch_add(1, Ordering::SeqCst);
                        drop(client);
                        continue;
                    }
                    shared.accepted.fetch_add(1, Ordering::SeqCst);
                    let upstream = shared.upstream.clone();
                    let task = tokio::spawn(async move {
                        let Ok(mut server) = TcpStream::connect(&upstream).await else {
                            return;
                        };
                        let mut client = client;
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    });
                    let mut open = shared.connections.lock().unwrap();
                    open.retain(|h| !h.is_finished());
                    open.push(task.abort_handle());
                }
            }
        })
        .abort_handle();
        TcpProxy {
            addr,
            shared,
            accept,
        }
    }

    /// Closes every proxied connection and refuses new ones.
    pub fn cut(&self) {
        self.shared.up.store(false, Ordering::SeqCst);
        // Aborting a copy task drops both sockets, which closes them.
        for h in self.shared.connections.lock().unwrap().drain(..) {
            h.abort();
        }
    }

    pub fn restore(&self) {
        self.shared.up.store(true, Ordering::SeqCst);
    }

    /// Connections passed on to the upstream so far.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections closed on arrival while cut.
    pub fn refused(&self) -> usize {
        self.shared.refused.load(Ordering::SeqCst)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
        for h in self.shared.connections.lock().unwrap().drain(..) {
            h.abort();
        }
    }
}
