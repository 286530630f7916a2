//! ZDS: how the node agent hands pods to the node proxy, wire-compatible with
//! the reference mesh.
//!
//! One AF_UNIX **SOCK_SEQPACKET** connection per proxy; the agent listens,
//! the proxy connects. One packet is one protobuf message (package
//! `istio.workload.zds`, proto3), no length prefix; a pod's network
//! namespace travels as exactly one SCM_RIGHTS fd, only with `Add`.
//! Receivers read into a 1 KiB buffer and refuse truncated packets.
//!
//! | message | fields |
//! | --- | --- |
//! | `ZdsHello` | version (1): enum { NOT_USED = 0, V1 = 1 } |
//! | `WorkloadInfo` | name (1), namespace (2), service_account (3) |
//! | `AddWorkload` | uid (1), workload_info (2), addresses (1001, ringway's) |
//! | `KeepWorkload` | uid (1) |
//! | `DelWorkload` | uid (2) |
//! | `SnapshotSent` | (empty) |
//! | `WorkloadRequest` | oneof { add = 1; del = 2; snapshot_sent = 3; keep = 5 } |
//! | `Ack` | error (1): empty = success |
//! | `WorkloadResponse` | oneof { ack = 1 } |
//!
//! The message types below are this project's own definitions of that
//! schema; [`Request`] is the validated form a receiver works with.
//!
//! `AddWorkload.addresses` (field 1001, `repeated string`, each an IPv4 or
//! IPv6 address in text form) is ringway's extension: the pod's addresses as
//! the agent knows them (the CNI result, else the pod's status in the API),
//! so the proxy never takes them from the pod's own, pod-writable netns. The
//! high tag cannot collide with fields the reference protocol may add; a
//! receiver that does not know it skips it (proto3), and an agent that does
//! not send it leaves the list empty.

#![forbid(unsafe_code)]

use std::io::{IoSlice, IoSliceMut};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use prost::Message;

/// Default socket path (the reference mesh's is `/var/run/ztunnel/ztunnel.sock`).
pub const DEFAULT_SOCKET: &str = "/var/run/ringway/zds/zds.sock";

/// Receive buffer size: larger packets are refused as truncated.
pub const MAX_PACKET: usize = 1024;

/// Protocol version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Version {
    /// Unset.
    NotUsed = 0,
    /// The only version.
    V1 = 1,
}

/// First message on a connection, proxy -> agent.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ZdsHello {
    /// Protocol version.
    #[prost(enumeration = "Version", tag = "1")]
    pub version: i32,
}

/// Who a workload is.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkloadInfo {
    /// Pod name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Pod namespace.
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// Service account.
    #[prost(string, tag = "3")]
    pub service_account: String,
}

/// Start serving a pod (its netns fd rides along).
#[derive(Clone, PartialEq, prost::Message)]
pub struct AddWorkload {
    /// Pod UID.
    #[prost(string, tag = "1")]
    pub uid: String,
    /// Pod identity.
    #[prost(message, optional, tag = "2")]
    pub workload_info: Option<WorkloadInfo>,
    /// ringway's extension: the pod's IP addresses (text form), from the
    /// agent's own sources. Empty from agents that do not send it.
    #[prost(string, repeated, tag = "1001")]
    pub addresses: Vec<String>,
}

/// The pod exists but its netns is not available now (snapshot only).
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeepWorkload {
    /// Pod UID.
    #[prost(string, tag = "1")]
    pub uid: String,
}

/// Stop serving a pod.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DelWorkload {
    /// Pod UID.
    #[prost(string, tag = "2")]
    pub uid: String,
}

/// End of the snapshot.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SnapshotSent {}

/// Agent -> proxy.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkloadRequest {
    /// The request.
    #[prost(oneof = "workload_request::Payload", tags = "1, 2, 3, 5")]
    pub payload: Option<workload_request::Payload>,
}

/// The `WorkloadRequest` oneof.
pub mod workload_request {
    /// What the agent asks.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Payload {
        /// Serve a pod.
        #[prost(message, tag = "1")]
        Add(super::AddWorkload),
        /// Stop serving a pod.
        #[prost(message, tag = "2")]
        Del(super::DelWorkload),
        /// Snapshot complete.
        #[prost(message, tag = "3")]
        SnapshotSent(super::SnapshotSent),
        /// Known pod without netns.
        #[prost(message, tag = "5")]
        Keep(super::KeepWorkload),
    }
}

/// Success (empty `error`) or failure.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Ack {
    /// Empty on success.
    #[prost(string, tag = "1")]
    pub error: String,
}

/// Proxy -> agent, one per request.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkloadResponse {
    /// The response.
    #[prost(oneof = "workload_response::Payload", tags = "1")]
    pub payload: Option<workload_response::Payload>,
}

/// The `WorkloadResponse` oneof.
pub mod workload_response {
    /// What the proxy answers.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Payload {
        /// The answer.
        #[prost(message, tag = "1")]
        Ack(super::Ack),
    }
}

/// Errors on a ZDS connection; each says what was wrong with the packet.
#[derive(Debug, thiserror::Error)]
pub enum ZdsError {
    /// The peer closed the connection.
    #[error("peer closed the ZDS connection")]
    Closed,
    /// A socket call failed.
    #[error("ZDS socket {op}: {source}")]
    Io {
        /// Which call.
        op: &'static str,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The packet was larger than [`MAX_PACKET`].
    #[error("ZDS packet truncated: larger than {MAX_PACKET} bytes")]
    Truncated,
    /// The ancillary data was truncated (too many fds).
    #[error("ZDS packet carried more file descriptors than one")]
    TooManyFds,
    /// The bytes are not the expected protobuf message.
    #[error("ZDS packet is not a valid {what}: {reason}")]
    Decode {
        /// Expected message.
        what: &'static str,
        /// Decoder's reason.
        reason: String,
    },
    /// A request with no payload.
    #[error("ZDS {what} has no payload")]
    Empty {
        /// Which message.
        what: &'static str,
    },
    /// `Add` without a netns fd.
    #[error("ZDS Add for pod {uid} carried no network namespace fd")]
    AddWithoutFd {
        /// Pod UID.
        uid: String,
    },
    /// An fd on a message other than `Add`.
    #[error("ZDS {what} carried a file descriptor; only Add may")]
    UnexpectedFd {
        /// Which message.
        what: &'static str,
    },
    /// A message without a pod UID.
    #[error("ZDS {what} has an empty uid")]
    EmptyUid {
        /// Which message.
        what: &'static str,
    },
    /// `Add` without workload info.
    #[error("ZDS Add for pod {uid} has no workload_info")]
    MissingWorkloadInfo {
        /// Pod UID.
        uid: String,
    },
    /// Hello with a version this side does not speak.
    #[error("ZDS hello with unsupported version {0}")]
    BadVersion(i32),
    /// `Add` whose `addresses` holds something that is not an IP address.
    #[error("ZDS Add for pod {uid}: addresses[{index}] {value:?} is not an IP address")]
    BadAddress {
        /// Pod UID.
        uid: String,
        /// Position in the list.
        index: usize,
        /// What was sent (at most 64 characters of it).
        value: String,
    },
}

/// A validated agent -> proxy request.
#[derive(Debug)]
pub enum Request {
    /// Serve a pod in this netns.
    Add {
        /// Pod UID.
        uid: String,
        /// Identity.
        info: WorkloadInfo,
        /// The pod's addresses as the agent knows them, deduplicated, in the
        /// order sent; empty when the agent sent none (an older agent).
        addresses: Vec<IpAddr>,
        /// The pod's network namespace.
        netns: OwnedFd,
    },
    /// Keep a pod (snapshot only; netns not available now).
    Keep {
        /// Pod UID.
        uid: String,
    },
    /// Stop serving a pod.
    Del {
        /// Pod UID.
        uid: String,
    },
    /// Snapshot complete.
    SnapshotSent,
}

impl Request {
    /// The message name, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Request::Add { .. } => "Add",
            Request::Keep { .. } => "Keep",
            Request::Del { .. } => "Del",
            Request::SnapshotSent => "SnapshotSent",
        }
    }
}

/// Sends one message, with `fd` as SCM_RIGHTS when given.
pub fn send(
    sock: BorrowedFd<'_>,
    msg: &impl Message,
    fd: Option<BorrowedFd<'_>>,
) -> Result<(), ZdsError> {
    let bytes = msg.encode_to_vec();
    let iov = [IoSlice::new(&bytes)];
    let fds: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    loop {
        match sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other,
        }
    }
    .map_err(|e| ZdsError::Io {
        op: "send",
        source: e.into(),
    })?;
    Ok(())
}

/// One received packet.
#[derive(Debug)]
pub struct Packet {
    /// The message bytes.
    pub bytes: Vec<u8>,
    /// The fd it carried (adopted by the caller's function), if any.
    pub fd: Option<OwnedFd>,
    /// How many fds arrived (an fd the caller refused to adopt still counts).
    pub fd_count: usize,
}

/// Takes ownership of a raw fd the kernel installed for us with SCM_RIGHTS,
/// or closes it and returns `None`. Taking ownership of a raw fd is an
/// `unsafe` operation, which lives in the caller's syscall layer.
pub type AdoptFd<'a> = &'a dyn Fn(RawFd) -> Option<OwnedFd>;

/// An [`AdoptFd`] for sides that never accept fds: closes them.
pub fn refuse_fd(raw: RawFd) -> Option<OwnedFd> {
    let _ = nix::unistd::close(raw);
    None
}

/// Receives one packet. Every fd that arrived is either adopted or closed,
/// whatever the outcome.
pub fn recv(sock: BorrowedFd<'_>, adopt: AdoptFd<'_>) -> Result<Packet, ZdsError> {
    let mut buf = vec![0u8; MAX_PACKET];
    let mut cmsg = nix::cmsg_space!([RawFd; 4]);
    let mut fds = Vec::new();
    let mut fd_count = 0;
    let (len, flags) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        // A signal arriving mid-wait (EINTR) is not an error: wait again.
        let msg = loop {
            match recvmsg::<()>(
                sock.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Err(nix::errno::Errno::EINTR) => continue,
                other => break other,
            }
        }
        .map_err(|e| ZdsError::Io {
            op: "recv",
            source: e.into(),
        })?;
        if let Ok(cmsgs) = msg.cmsgs() {
            for c in cmsgs {
                if let ControlMessageOwned::ScmRights(v) = c {
                    for raw in v {
                        fd_count += 1;
                        if let Some(fd) = adopt(raw) {
                            fds.push(fd);
                        }
                    }
                }
            }
        }
        (msg.bytes, msg.flags)
    };
    if flags.contains(MsgFlags::MSG_TRUNC) {
        return Err(ZdsError::Truncated);
    }
    if flags.contains(MsgFlags::MSG_CTRUNC) || fd_count > 1 {
        return Err(ZdsError::TooManyFds);
    }
    if len == 0 && fd_count == 0 {
        return Err(ZdsError::Closed);
    }
    buf.truncate(len);
    Ok(Packet {
        bytes: buf,
        fd: fds.pop(),
        fd_count,
    })
}

/// Decodes and validates an agent -> proxy packet.
pub fn decode_request(bytes: &[u8], fd: Option<OwnedFd>) -> Result<Request, ZdsError> {
    let req = WorkloadRequest::decode(bytes).map_err(|e| ZdsError::Decode {
        what: "WorkloadRequest",
        reason: e.to_string(),
    })?;
    use workload_request::Payload;
    let payload = req.payload.ok_or(ZdsError::Empty {
        what: "WorkloadRequest",
    })?;
    match payload {
        Payload::Add(add) => {
            if add.uid.is_empty() {
                return Err(ZdsError::EmptyUid { what: "Add" });
            }
            let Some(netns) = fd else {
                return Err(ZdsError::AddWithoutFd { uid: add.uid });
            };
            let Some(info) = add.workload_info else {
                return Err(ZdsError::MissingWorkloadInfo { uid: add.uid });
            };
            let addresses = parse_addresses(&add.uid, &add.addresses)?;
            Ok(Request::Add {
                uid: add.uid,
                info,
                addresses,
                netns,
            })
        }
        other => {
            let (what, req) = match other {
                Payload::Del(d) => ("Del", Request::Del { uid: d.uid }),
                Payload::Keep(k) => ("Keep", Request::Keep { uid: k.uid }),
                Payload::SnapshotSent(_) => ("SnapshotSent", Request::SnapshotSent),
                Payload::Add(_) => unreachable!("handled above"),
            };
            if fd.is_some() {
                return Err(ZdsError::UnexpectedFd { what });
            }
            match &req {
                Request::Del { uid } | Request::Keep { uid } if uid.is_empty() => {
                    Err(ZdsError::EmptyUid { what })
                }
                _ => Ok(req),
            }
        }
    }
}

/// The addresses of an `Add`, parsed (IPv4-mapped IPv6 taken as IPv4) and
/// deduplicated; the first one that is not an address is the error.
fn parse_addresses(uid: &str, sent: &[String]) -> Result<Vec<IpAddr>, ZdsError> {
    let mut out: Vec<IpAddr> = Vec::with_capacity(sent.len());
    for (index, text) in sent.iter().enumerate() {
        let ip: IpAddr = text.trim().parse().map_err(|_| ZdsError::BadAddress {
            uid: uid.to_string(),
            index,
            value: text.chars().take(64).collect(),
        })?;
        let ip = ip.to_canonical();
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    Ok(out)
}

/// How the proxy answered a request: what its `Ack` says. A refusal is the
/// proxy's answer, carried as data (its reason is the peer's text, shown as
/// it came), not an error of the connection: those are [`ZdsError`]s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Done: `Ack.error` is empty.
    Ack,
    /// Refused, with the proxy's reason (`Ack.error`).
    Nack(String),
}

/// Decodes a proxy -> agent response into the proxy's [`Answer`].
pub fn decode_response(bytes: &[u8]) -> Result<Answer, ZdsError> {
    let resp = WorkloadResponse::decode(bytes).map_err(|e| ZdsError::Decode {
        what: "WorkloadResponse",
        reason: e.to_string(),
    })?;
    match resp.payload {
        Some(workload_response::Payload::Ack(a)) if a.error.is_empty() => Ok(Answer::Ack),
        Some(workload_response::Payload::Ack(a)) => Ok(Answer::Nack(a.error)),
        None => Err(ZdsError::Empty {
            what: "WorkloadResponse",
        }),
    }
}

/// Decodes the proxy's hello.
pub fn decode_hello(bytes: &[u8]) -> Result<(), ZdsError> {
    let h = ZdsHello::decode(bytes).map_err(|e| ZdsError::Decode {
        what: "ZdsHello",
        reason: e.to_string(),
    })?;
    if h.version != Version::V1 as i32 {
        return Err(ZdsError::BadVersion(h.version));
    }
    Ok(())
}

/// An ack message.
pub fn ack(error: Option<String>) -> WorkloadResponse {
    WorkloadResponse {
        payload: Some(workload_response::Payload::Ack(Ack {
            error: error.unwrap_or_default(),
        })),
    }
}

/// Wraps a request payload.
pub fn request(p: workload_request::Payload) -> WorkloadRequest {
    WorkloadRequest { payload: Some(p) }
}

#[cfg(test)]
mod tests {
    use super::workload_request::Payload;
    use super::*;
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    use std::os::fd::AsFd;

    fn pair() -> (OwnedFd, OwnedFd) {
        socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap()
    }

    fn add(uid: &str) -> WorkloadRequest {
        request(Payload::Add(AddWorkload {
            uid: uid.into(),
            workload_info: Some(WorkloadInfo {
                name: "n".into(),
                namespace: "ns".into(),
                service_account: "sa".into(),
            }),
            addresses: Vec::new(),
        }))
    }

    #[test]
    fn wire_bytes_match_the_schema() {
        // field 1 (add), LEN: uid (1) "u1", workload_info (2) {name, namespace, service_account}
        let want = [
            0x0a, 0x11, 0x0a, 0x02, b'u', b'1', 0x12, 0x0b, 0x0a, 0x01, b'n', 0x12, 0x02, b'n',
            b's', 0x1a, 0x02, b's', b'a',
        ];
        assert_eq!(add("u1").encode_to_vec(), want);
        // del is field 2 with its uid in field 2; keep is field 5; snapshot_sent field 3
        let del = request(Payload::Del(DelWorkload { uid: "u".into() }));
        assert_eq!(del.encode_to_vec(), [0x12, 0x03, 0x12, 0x01, b'u']);
        let keep = request(Payload::Keep(KeepWorkload { uid: "u".into() }));
        assert_eq!(keep.encode_to_vec(), [0x2a, 0x03, 0x0a, 0x01, b'u']);
        let snap = request(Payload::SnapshotSent(SnapshotSent {}));
        assert_eq!(snap.encode_to_vec(), [0x1a, 0x00]);
        assert_eq!(ack(None).encode_to_vec(), [0x0a, 0x00]);
        assert_eq!(
            ack(Some("x".into())).encode_to_vec(),
            [0x0a, 0x03, 0x0a, 0x01, b'x']
        );
        let hello = ZdsHello {
            version: Version::V1 as i32,
        };
        assert_eq!(hello.encode_to_vec(), [0x08, 0x01]);
    }

    #[test]
    fn addresses_ride_in_field_1001() {
        let mut req = add("u1");
        if let Some(Payload::Add(a)) = &mut req.payload {
            a.addresses = vec!["10.0.0.5".into(), "fd00::5".into()];
        }
        let bytes = req.encode_to_vec();
        // field 1001, LEN: varint key (1001 << 3 | 2) = 0xca 0x3e
        let key = [0xca, 0x3e, 0x08];
        assert!(
            bytes.windows(3).any(|w| w == key),
            "field 1001 not on the wire: {bytes:02x?}"
        );
        let devnull = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        match decode_request(&bytes, Some(devnull)).unwrap() {
            Request::Add { addresses, .. } => assert_eq!(
                addresses,
                vec![
                    "10.0.0.5".parse::<IpAddr>().unwrap(),
                    "fd00::5".parse().unwrap()
                ]
            ),
            other => panic!("{other:?}"),
        }
        // An Add of an agent without the extension decodes with none.
        let devnull = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        match decode_request(&add("u2").encode_to_vec(), Some(devnull)).unwrap() {
            Request::Add { addresses, .. } => assert!(addresses.is_empty()),
            other => panic!("{other:?}"),
        }
        // Mapped IPv6 is the IPv4 address; duplicates collapse; junk is named.
        assert_eq!(
            parse_addresses("u", &["::ffff:10.0.0.5".into(), "10.0.0.5".into()]).unwrap(),
            vec!["10.0.0.5".parse::<IpAddr>().unwrap()]
        );
        let e = parse_addresses("u3", &["10.0.0.5".into(), "10.0.0.0/24".into()]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ZDS Add for pod u3: addresses[1] \"10.0.0.0/24\" is not an IP address"
        );
    }

    #[test]
    fn round_trip_over_seqpacket() {
        let (a, b) = pair();
        send(
            a.as_fd(),
            &request(Payload::Del(DelWorkload { uid: "p1".into() })),
            None,
        )
        .unwrap();
        let p = recv(b.as_fd(), &refuse_fd).unwrap();
        match decode_request(&p.bytes, p.fd).unwrap() {
            Request::Del { uid } => assert_eq!(uid, "p1"),
            other => panic!("{other:?}"),
        }
        send(b.as_fd(), &ack(Some("no listeners".into())), None).unwrap();
        let p = recv(a.as_fd(), &refuse_fd).unwrap();
        assert_eq!(
            decode_response(&p.bytes).unwrap(),
            Answer::Nack("no listeners".into())
        );
        send(a.as_fd(), &ack(None), None).unwrap();
        let p = recv(b.as_fd(), &refuse_fd).unwrap();
        assert_eq!(decode_response(&p.bytes).unwrap(), Answer::Ack);
    }

    #[test]
    fn malformed_packets_are_named() {
        let (a, b) = pair();
        // garbage
        nix::sys::socket::send(a.as_raw_fd(), &[0xff, 0xff, 0xff], MsgFlags::empty()).unwrap();
        let p = recv(b.as_fd(), &refuse_fd).unwrap();
        let e = decode_request(&p.bytes, p.fd).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("ZDS packet is not a valid WorkloadRequest:"),
            "{e}"
        );
        // truncated: more than 1 KiB
        nix::sys::socket::send(a.as_raw_fd(), &[0u8; 2000], MsgFlags::empty()).unwrap();
        let e = recv(b.as_fd(), &refuse_fd).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ZDS packet truncated: larger than 1024 bytes"
        );
        // empty payload
        let e =
            decode_request(&WorkloadRequest { payload: None }.encode_to_vec(), None).unwrap_err();
        assert_eq!(e.to_string(), "ZDS WorkloadRequest has no payload");
        // Add without fd
        let e = decode_request(&add("u9").encode_to_vec(), None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ZDS Add for pod u9 carried no network namespace fd"
        );
        // Add without workload info
        let bare = request(Payload::Add(AddWorkload {
            uid: "u8".into(),
            workload_info: None,
            addresses: Vec::new(),
        }));
        let devnull = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let e = decode_request(&bare.encode_to_vec(), Some(devnull)).unwrap_err();
        assert_eq!(e.to_string(), "ZDS Add for pod u8 has no workload_info");
        // fd on a Del
        let devnull = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let del = request(Payload::Del(DelWorkload { uid: "u".into() }));
        let e = decode_request(&del.encode_to_vec(), Some(devnull)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ZDS Del carried a file descriptor; only Add may"
        );
        // empty uid
        let del = request(Payload::Del(DelWorkload { uid: String::new() }));
        let e = decode_request(&del.encode_to_vec(), None).unwrap_err();
        assert_eq!(e.to_string(), "ZDS Del has an empty uid");
        // bad hello
        let e = decode_hello(&ZdsHello { version: 7 }.encode_to_vec()).unwrap_err();
        assert_eq!(e.to_string(), "ZDS hello with unsupported version 7");
        decode_hello(&[0x08, 0x01]).unwrap();
        // response without payload
        let e = decode_response(&[]).unwrap_err();
        assert_eq!(e.to_string(), "ZDS WorkloadResponse has no payload");
    }

    #[test]
    fn fds_are_counted_and_two_are_refused() {
        let (a, b) = pair();
        let f1 = std::fs::File::open("/dev/null").unwrap();
        send(a.as_fd(), &add("u1"), Some(f1.as_fd())).unwrap();
        let p = recv(b.as_fd(), &refuse_fd).unwrap();
        assert_eq!(p.fd_count, 1);
        assert!(p.fd.is_none(), "refuse_fd closes what arrives");
        let f2 = std::fs::File::open("/dev/null").unwrap();
        let fds = [f1.as_raw_fd(), f2.as_raw_fd()];
        let bytes = add("u2").encode_to_vec();
        sendmsg::<()>(
            a.as_raw_fd(),
            &[IoSlice::new(&bytes)],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .unwrap();
        let e = recv(b.as_fd(), &refuse_fd).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ZDS packet carried more file descriptors than one"
        );
        drop(a);
        assert!(matches!(recv(b.as_fd(), &refuse_fd), Err(ZdsError::Closed)));
    }
}
