//! The DNS server: queries over UDP and TCP (RFC 1035 framing, hickory's codec), answered
//! from the [`Zone`] as CoreDNS answers them: authoritative for `cluster.local` and the
//! reverse zones, with the zone's SOA in the authority section of NXDOMAIN and NODATA
//! answers. Names outside the cluster have no upstream here (the nodes' network reaches
//! nothing beyond the VPC): SERVFAIL, as CoreDNS's `forward` answers when its upstream is
//! unreachable.

use std::net::SocketAddr;
use std::sync::Arc;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME, PTR, SOA, SRV};
use hickory_proto::rr::{Name, RData as HRData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};

use crate::{QType, RData, Rcode, Rr, Zone, CLUSTER_DOMAIN, TTL};

/// What the server serves.
pub struct Server {
    zone: Arc<Zone>,
    /// The SOA serial (the server's start, as CoreDNS's is its zone's last change).
    serial: u32,
}

/// The largest UDP answer without EDNS (RFC 1035).
const UDP_MAX: usize = 512;

impl Server {
    pub fn new(zone: Arc<Zone>) -> Server {
        let serial = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as u32)
            .unwrap_or(1);
        Server { zone, serial }
    }

    /// Serves `udp` and `tcp` until the task is dropped.
    pub async fn serve(self: Arc<Self>, udp: UdpSocket, tcp: TcpListener) {
        let udp = Arc::new(udp);
        let s = self.clone();
        let u = udp.clone();
        let udp_task = tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let Ok((n, peer)) = u.recv_from(&mut buf).await else {
                    continue;
                };
                if let Some(reply) = s.respond(&buf[..n], true) {
                    let _ = u.send_to(&reply, peer).await;
                }
            }
        });
        loop {
            let Ok((mut conn, peer)) = tcp.accept().await else {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            };
            let s = self.clone();
            tokio::spawn(async move {
                if let Err(e) = s.serve_tcp(&mut conn).await {
                    tracing::debug!(%peer, error = %e, "DNS over TCP");
                }
            });
            if udp_task.is_finished() {
                break;
            }
        }
    }

    async fn serve_tcp(&self, conn: &mut tokio::net::TcpStream) -> std::io::Result<()> {
        loop {
            let mut len = [0u8; 2];
            if conn.read_exact(&mut len).await.is_err() {
                return Ok(());
            }
            let mut q = vec![0u8; usize::from(u16::from_be_bytes(len))];
            conn.read_exact(&mut q).await?;
            let Some(reply) = self.respond(&q, false) else {
                return Ok(());
            };
            let n = u16::try_from(reply.len()).unwrap_or(u16::MAX);
            conn.write_all(&n.to_be_bytes()).await?;
            conn.write_all(&reply[..usize::from(n)]).await?;
        }
    }

    /// The reply to the query `bytes` (`None`: not even an id to answer to).
    pub fn respond(&self, bytes: &[u8], udp: bool) -> Option<Vec<u8>> {
        let query = match Message::from_vec(bytes) {
            Ok(q) => q,
            Err(_) => {
                let id = u16::from_be_bytes([*bytes.first()?, *bytes.get(1)?]);
                return Message::error_msg(id, OpCode::Query, ResponseCode::FormErr)
                    .to_vec()
                    .ok();
            }
        };
        let mut reply = Message::response(query.metadata.id, query.metadata.op_code);
        reply.metadata.recursion_desired = query.metadata.recursion_desired;
        reply.metadata.recursion_available = true;
        if query.metadata.message_type != MessageType::Query {
            return None;
        }
        if query.metadata.op_code != OpCode::Query || query.queries.len() != 1 {
            reply.metadata.response_code = if query.metadata.op_code != OpCode::Query {
                ResponseCode::NotImp
            } else {
                ResponseCode::FormErr
            };
            return reply.to_vec().ok();
        }
        let q = query.queries[0].clone();
        reply.add_query(q.clone());
        if let Some(edns) = &query.edns {
            let mut e = edns.clone();
            e.set_max_payload(4096);
            reply.set_edns(e);
        }
        let name = q.name().to_ascii().to_ascii_lowercase();
        let name = name.trim_end_matches('.');
        if !in_zone(name) {
            reply.metadata.response_code = ResponseCode::ServFail;
            return reply.to_vec().ok();
        }
        reply.metadata.authoritative = true;
        let records = match qtype(q.query_type()) {
            Some(QType::Soa) if name == CLUSTER_DOMAIN => vec![self.soa()],
            Some(t) => {
                let a = self.zone.answer(name, t);
                if a.rcode == Rcode::NxDomain {
                    reply.metadata.response_code = ResponseCode::NXDomain;
                }
                a.records.iter().filter_map(record).collect()
            }
            // A type the zone never holds: the name's existence decides NODATA/NXDOMAIN.
            None => {
                let a = self.zone.answer(name, QType::Txt);
                if a.rcode == Rcode::NxDomain {
                    reply.metadata.response_code = ResponseCode::NXDomain;
                }
                Vec::new()
            }
        };
        if records.is_empty() {
            reply.add_authority(self.soa());
        }
        reply.add_answers(records);
        let limit = if udp {
            query
                .edns
                .as_ref()
                .map_or(UDP_MAX, |e| usize::from(e.max_payload()).max(UDP_MAX))
        } else {
            usize::from(u16::MAX)
        };
        let bytes = reply.to_vec().ok()?;
        if bytes.len() <= limit {
            return Some(bytes);
        }
        // Too big for UDP: the header and question with TC set; the client asks over TCP.
        let mut short = Message::response(query.metadata.id, query.metadata.op_code);
        short.metadata = reply.metadata;
        short.metadata.truncation = true;
        short.add_query(q);
        short.to_vec().ok()
    }

    /// `cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. …`
    fn soa(&self) -> Record {
        let zone = fqdn(CLUSTER_DOMAIN);
        let mname = fqdn(&format!("ns.dns.{CLUSTER_DOMAIN}"));
        let rname = fqdn(&format!("hostmaster.{CLUSTER_DOMAIN}"));
        Record::from_rdata(
            zone,
            TTL,
            HRData::SOA(SOA::new(mname, rname, self.serial, 7200, 1800, 86400, TTL)),
        )
    }
}

/// Whether the server is authoritative for `name`: the cluster domain and the reverse
/// zones (kubeadm's Corefile: `kubernetes cluster.local in-addr.arpa ip6.arpa`).
fn in_zone(name: &str) -> bool {
    name == CLUSTER_DOMAIN
        || name.ends_with(&format!(".{CLUSTER_DOMAIN}"))
        || name.ends_with("in-addr.arpa")
        || name.ends_with("ip6.arpa")
}

fn qtype(t: RecordType) -> Option<QType> {
    Some(match t {
        RecordType::A => QType::A,
        RecordType::AAAA => QType::Aaaa,
        RecordType::CNAME => QType::Cname,
        RecordType::SRV => QType::Srv,
        RecordType::PTR => QType::Ptr,
        RecordType::TXT => QType::Txt,
        RecordType::MX => QType::Mx,
        RecordType::NS => QType::Ns,
        RecordType::SOA => QType::Soa,
        RecordType::ANY => QType::Any,
        _ => return None,
    })
}

fn fqdn(name: &str) -> Name {
    let n = format!("{}.", name.trim_end_matches('.'));
    Name::from_ascii(&n).unwrap_or_else(|_| Name::root())
}

/// A zone record on the wire.
fn record(r: &Rr) -> Option<Record> {
    let data = match &r.data {
        RData::A(std::net::IpAddr::V4(ip)) => HRData::A(A(*ip)),
        RData::A(std::net::IpAddr::V6(ip)) => HRData::AAAA(AAAA(*ip)),
        RData::Cname(t) => HRData::CNAME(CNAME(fqdn(t))),
        RData::Ptr(t) => HRData::PTR(PTR(fqdn(t))),
        RData::Srv {
            priority,
            weight,
            port,
            target,
        } => HRData::SRV(SRV::new(*priority, *weight, *port, fqdn(target))),
    };
    Some(Record::from_rdata(fqdn(&r.name), r.ttl, data))
}

/// Binds UDP and TCP on `addr`.
pub async fn bind(addr: SocketAddr) -> std::io::Result<(UdpSocket, TcpListener)> {
    Ok((UdpSocket::bind(addr).await?, TcpListener::bind(addr).await?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;
    use kumo_proxy::dataplane::{Dataplane, ServiceEntry};

    fn ask(s: &Server, name: &str, t: RecordType) -> Message {
        let mut q = Message::query();
        q.add_query(Query::query(Name::from_ascii(name).expect("name"), t));
        let bytes = s
            .respond(&q.to_vec().expect("encode"), true)
            .expect("reply");
        Message::from_vec(&bytes).expect("decode")
    }

    #[test]
    fn arbitrary_bytes_get_formerr_or_nothing_and_never_a_panic() {
        let s = Server::new(Arc::new(Zone::new()));
        let mut q = Message::query();
        q.add_query(Query::query(
            Name::from_ascii("kubernetes.default.svc.cluster.local.").expect("name"),
            RecordType::A,
        ));
        let valid = q.to_vec().expect("encode");
        // xorshift: deterministic, no dependency.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..4000 {
            let bytes: Vec<u8> = if round % 2 == 0 {
                let len = (next() % 80) as usize;
                (0..len).map(|_| next() as u8).collect()
            } else {
                // A valid query with a few bytes flipped or cut short.
                let mut b = valid.clone();
                for _ in 0..1 + next() % 4 {
                    let i = (next() as usize) % b.len();
                    b[i] ^= next() as u8;
                }
                b.truncate(1 + (next() as usize) % b.len());
                b
            };
            if let Some(reply) = s.respond(&bytes, round % 3 == 0) {
                let m = Message::from_vec(&reply).expect("every reply decodes");
                assert_eq!(m.metadata.id.to_be_bytes(), [bytes[0], bytes[1]]);
            } else {
                assert!(bytes.len() < 2 || Message::from_vec(&bytes).is_ok());
            }
        }
    }

    #[test]
    fn answers_on_the_wire_as_coredns() {
        let zone = Arc::new(Zone::new());
        zone.set_service(
            "default/hello",
            ServiceEntry {
                records: vec![Rr::new(
                    "hello.default.svc.cluster.local",
                    RData::A([10, 96, 12, 34].into()),
                )],
                ..Default::default()
            },
        );
        let s = Server::new(zone);
        let r = ask(&s, "hello.default.svc.cluster.local.", RecordType::A);
        assert_eq!(r.metadata.response_code, ResponseCode::NoError);
        assert!(r.metadata.authoritative);
        assert_eq!(r.answers.len(), 1);
        assert_eq!(r.answers[0].ttl, 30);
        let r = ask(&s, "nope.default.svc.cluster.local.", RecordType::A);
        assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
        assert_eq!(r.authorities.len(), 1, "the SOA");
        let r = ask(&s, "hello.default.svc.cluster.local.", RecordType::AAAA);
        assert_eq!(
            (r.metadata.response_code, r.answers.len()),
            (ResponseCode::NoError, 0)
        );
        let r = ask(&s, "example.com.", RecordType::A);
        assert_eq!(r.metadata.response_code, ResponseCode::ServFail);
        // Garbage gets FORMERR when it carries an id, nothing otherwise.
        let r = s.respond(&[0x12, 0x34, 0xff], true).expect("formerr");
        let m = Message::from_vec(&r).expect("decode");
        assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
        assert!(s.respond(&[0x12], true).is_none());
    }
}
