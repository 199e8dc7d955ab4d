//! Binding hookline's HTTP listeners (the admin API, metrics, `hookline receive`) with a deep
//! accept queue.

use std::net::SocketAddr;

use tokio::net::TcpListener;

/// How many connections the kernel holds for an HTTP listener of hookline's before it accepts
/// them (capped by `net.core.somaxconn`). `TcpListener::bind` asks for 128, and a burst of new
/// connections met while the process is busy overflows that: the kernel drops the handshake's
/// last packet or the next SYN, and each of those clients waits out a retransmission (200 ms
/// to 1 s) before its request is even read. A delivery stage starting on a backlog opens up to
/// `max_in_flight` connections per endpoint at once, and so may many ingest clients.
pub const LISTEN_BACKLOG: u32 = 1024;

/// Binds `addr` for one of hookline's HTTP servers (the admin API, `hookline receive`) with a
/// [`LISTEN_BACKLOG`] connections deep queue. Call it within the tokio runtime.
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As `TcpListener::bind` does: a restarted hookline rebinds at once, not after the old
    // connections' TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}
