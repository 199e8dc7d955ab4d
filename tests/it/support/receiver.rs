//! A scriptable HTTP/1.1 receiver on 127.0.0.1:0 that records every request.
//!
//! Hand-rolled rather than axum/hyper so it can misbehave on purpose: answer late, send a huge
//! body, answer a TLS handshake with plain text. It understands what hookline sends (requests
//! with `content-length` bodies, keep-alive); it is not a general HTTP server.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// One request as the receiver saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    /// `POST`, ...
    pub method: String,
    /// The request target (path and query).
    pub path: String,
    /// Headers in arrival order, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body bytes exactly as received.
    pub body: Vec<u8>,
}

impl RecordedRequest {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What the receiver answers.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Extra headers (`content-length` is always written by the receiver).
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: ReplyBody,
    /// Wait this long before writing the response head.
    pub delay: Duration,
}

/// A response body: literal bytes, or `len` copies of one byte written in slices (so a 1 MiB body
/// costs no 1 MiB buffer, and a client that hangs up just ends the write).
#[derive(Debug, Clone)]
pub enum ReplyBody {
    /// These bytes.
    Bytes(Vec<u8>),
    /// `len` times `byte`.
    Repeat {
        /// The byte.
        byte: u8,
        /// How many.
        len: usize,
    },
}

impl Reply {
    /// An empty-bodied reply with this status.
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: ReplyBody::Bytes(Vec::new()),
            delay: Duration::ZERO,
        }
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Reply {
        self.body = ReplyBody::Bytes(body.into());
        self
    }

    /// Sets a body of `len` bytes `b'a'`.
    pub fn huge_body(mut self, len: usize) -> Reply {
        self.body = ReplyBody::Repeat { byte: b'a', len };
        self
    }

    /// Answers only after `delay`.
    pub fn delay(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

type Script = Arc<dyn Fn(&RecordedRequest) -> Reply + Send + Sync>;

struct Shared {
    requests: Mutex<Vec<RecordedRequest>>,
    connections: AtomicUsize,
    arrived: Notify,
    script: Script,
}

/// A running receiver; stops when dropped.
pub struct Receiver {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Receiver {
    /// Starts a receiver on 127.0.0.1:0 whose answer to each request is `script(request)`.
    pub async fn start(
        script: impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static,
    ) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        Self::serve(listener, Arc::new(script))
    }

    /// Starts a receiver that gives every request the same reply.
    pub async fn fixed(reply: Reply) -> Receiver {
        Self::start(move |_| reply.clone()).await
    }

    /// Starts a receiver on an already bound listener (e.g. `[::1]` on a chosen port).
    pub fn on(listener: TcpListener, reply: Reply) -> Receiver {
        Self::serve(listener, Arc::new(move |_: &RecordedRequest| reply.clone()))
    }

    fn serve(listener: TcpListener, script: Script) -> Receiver {
        let addr = listener.local_addr().expect("local_addr");
        let shared = Arc::new(Shared {
            requests: Mutex::new(Vec::new()),
            connections: AtomicUsize::new(0),
            arrived: Notify::new(),
            script,
        });
        let task = tokio::spawn({
            let shared = shared.clone();
            async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    shared.connections.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(serve_connection(stream, shared.clone()));
                }
            }
        });
        Receiver { addr, shared, task }
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `http://127.0.0.1:PORT` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// How many TCP connections were accepted (the SSRF tests assert zero).
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` requests arrived, or panics after `timeout`.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<RecordedRequest> {
        tokio::time::timeout(timeout, async {
            loop {
                let notified = self.shared.arrived.notified();
                let seen = self.requests();
                if seen.len() >= n {
                    return seen;
                }
                notified.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{n} requests did not arrive within {timeout:?}"))
    }
}

async fn serve_connection(mut stream: TcpStream, shared: Arc<Shared>) {
    let mut buf = Vec::new();
    loop {
        let Some(request) = read_request(&mut stream, &mut buf).await else {
            if buf.first() == Some(&0x16) {
                // A TLS ClientHello on a plain port: answer like a plain HTTP server would.
                let _ = stream
                    .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
            }
            return;
        };
        let reply = (shared.script)(&request);
        shared.requests.lock().unwrap().push(request);
        shared.arrived.notify_waiters();
        if !reply.delay.is_zero() {
            tokio::time::sleep(reply.delay).await;
        }
        if write_reply(&mut stream, &reply).await.is_err() {
            return;
        }
    }
}

/// Reads one request; `None` at EOF or on anything that is not a plain HTTP/1.1 request.
async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<RecordedRequest> {
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.first() == Some(&0x16) || buf.len() > 64 * 1024 {
            return None;
        }
        let mut chunk = [0u8; 8192];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let method = request_line.next()?.to_owned();
    let path = request_line.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    buf.drain(..head_end + 4);
    while buf.len() < len {
        let mut chunk = [0u8; 8192];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = buf.drain(..len).collect();
    Some(RecordedRequest {
        method,
        path,
        headers,
        body,
    })
}

async fn write_reply(stream: &mut TcpStream, reply: &Reply) -> std::io::Result<()> {
    let len = match &reply.body {
        ReplyBody::Bytes(b) => b.len(),
        ReplyBody::Repeat { len, .. } => *len,
    };
    let mut head = format!(
        "HTTP/1.1 {} Scripted\r\ncontent-length: {len}\r\n",
        reply.status
    );
    for (name, value) in &reply.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    match &reply.body {
        ReplyBody::Bytes(b) => stream.write_all(b).await?,
        ReplyBody::Repeat { byte, len } => {
            let slice = vec![*byte; 64 * 1024];
            let mut left = *len;
            while left > 0 {
                let n = left.min(slice.len());
                stream.write_all(&slice[..n]).await?;
                left -= n;
            }
        }
    }
    stream.flush().await
}
