//! A tiny authoritative DNS server on 127.0.0.1:0 (UDP) for resolver tests: answers A and AAAA
//! from a fixed table, NXDOMAIN for names it does not know.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

/// A running DNS server; stops when dropped.
pub struct DnsServer {
    addr: SocketAddr,
    queries: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DnsServer {
    /// Serves `records`: name (no trailing dot, any case) to its addresses; A queries get the
    /// IPv4 ones, AAAA queries the IPv6 ones.
    pub async fn start<'a>(records: impl IntoIterator<Item = (&'a str, Vec<IpAddr>)>) -> DnsServer {
        let table: HashMap<String, Vec<IpAddr>> = records
            .into_iter()
            .map(|(n, a)| (n.trim_end_matches('.').to_ascii_lowercase(), a))
            .collect();
        let socket = UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("bind udp 127.0.0.1:0");
        let addr = socket.local_addr().unwrap();
        let queries = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let queries = queries.clone();
            async move {
                let mut buf = [0u8; 4096];
                loop {
                    let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
                        continue;
                    };
                    queries.fetch_add(1, Ordering::SeqCst);
                    if let Some(answer) = answer(&table, &buf[..n]) {
                        let _ = socket.send_to(&answer, peer).await;
                    }
                }
            }
        });
        DnsServer {
            addr,
            queries,
            task,
        }
    }

    /// Where to point `--dns-server`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many queries arrived.
    pub fn queries(&self) -> usize {
        self.queries.load(Ordering::SeqCst)
    }
}

fn answer(table: &HashMap<String, Vec<IpAddr>>, packet: &[u8]) -> Option<Vec<u8>> {
    let request = Message::from_vec(packet).ok()?;
    let query = request.queries().first()?.clone();
    let mut response = Message::new();
    response
        .set_id(request.id())
        .set_message_type(MessageType::Response)
        .set_op_code(request.op_code())
        .set_recursion_desired(request.recursion_desired())
        .set_recursion_available(true)
        .set_authoritative(true)
        .add_query(query.clone());
    let name = query.name().to_ascii();
    match table.get(name.trim_end_matches('.').to_ascii_lowercase().as_str()) {
        None => {
            response.set_response_code(ResponseCode::NXDomain);
        }
        Some(addrs) => {
            for addr in addrs {
                let rdata = match (query.query_type(), addr) {
                    (RecordType::A, IpAddr::V4(a)) => RData::A(A(*a)),
                    (RecordType::AAAA, IpAddr::V6(a)) => RData::AAAA(AAAA(*a)),
                    _ => continue,
                };
                response.add_answer(Record::from_rdata(query.name().clone(), 60, rdata));
            }
        }
    }
    response.to_vec().ok()
}
