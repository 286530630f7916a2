//! The CNI event socket, above the pod model and the socket helpers: one
//! JSON request line in, one JSON response line out ([`super::protocol`]),
//! 5 s deadlines each way. The request is checked and the selection rule
//! applied here; what is enrolled comes from the owner of the state through
//! the narrow [`Pods`] trait.

use std::collections::HashSet;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde_json::{Map, Value};

use super::config::{AgentConfig, Selection, CNI_IO_TIMEOUT, MAX_CNI_HANDLERS};
use super::error::{CheckError, EnrollError, StartError};
use super::lifecycle::Lifecycle;
use super::metrics::AgentMetrics;
use super::pod::Pod;
use super::protocol::{ErrorKind as Kind, Response, MAX_LINE};
use super::sockets::{check_peer, chmod_600, clear_stale, create_parent, temp_path};
use crate::kube::{ByName, SelectError, Selected, UnenrollReason, Verdict};
use crate::result::{PodIp, PodIpError};

const TICK_MS: u16 = 200;

/// Binds the CNI socket (mode 0600, non-blocking).
pub(super) fn bind(path: &Path) -> Result<UnixListener, StartError> {
    let err = |what: &'static str| {
        let path = path.to_path_buf();
        move |source| StartError::Socket { what, path, source }
    };
    create_parent(path)?;
    clear_stale(path, |p| UnixStream::connect(p).is_ok())?;
    let tmp = temp_path(path);
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(err("binding the CNI socket"))?;
    let placed = chmod_600(&tmp)
        .map_err(err("setting the mode of the CNI socket"))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(err("moving the CNI socket to")))
        .and_then(|()| {
            listener
                .set_nonblocking(true)
                .map_err(err("configuring the CNI socket"))
        });
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    tracing::info!(path = %path.display(), "CNI socket listening");
    Ok(listener)
}

/// What a CNI request needs from the owner of the pods.
pub(super) trait Pods: Send + Sync + 'static {
    /// Captures `pod` in `netns` (found at `path`) and hands it to the newest
    /// ready proxy; returns once the proxy acknowledged it.
    fn enroll(&self, pod: Pod, netns: OwnedFd, path: Option<PathBuf>) -> Result<(), EnrollError>;
    /// The UID of the pod enrolled with sandbox `container_id` (by UID when
    /// given).
    fn find(&self, uid: Option<&str>, container_id: &str) -> Option<String>;
    /// The namespace and name of the pod held as `uid`, when one is.
    fn name_of(&self, uid: &str) -> Option<(String, String)>;
    /// Unenrolls `uid` if it is enrolled with sandbox `container_id` and
    /// netns `inode` (each when given). Returns whether it was.
    fn unenroll_matching(
        &self,
        uid: &str,
        container_id: Option<&str>,
        inode: Option<u64>,
    ) -> Result<bool, EnrollError>;
    /// CHECK: the pod is enrolled with this sandbox and netns, a proxy is
    /// ready, and the rules (with the owner tag) are in place.
    fn check(
        &self,
        uid: &str,
        container_id: &str,
        netns_inode: Option<u64>,
    ) -> Result<(), CheckError>;
    /// Whether a proxy has taken the snapshot.
    fn any_ready(&self) -> bool;
    /// GC: unenrolls the pods enrolled through CNI whose sandbox is not in
    /// `valid` and whose network namespace is gone. Returns their UIDs.
    fn gc(&self, valid: &HashSet<String>) -> Vec<String>;
}

/// The CNI event socket's server.
pub(super) struct CniServer {
    pods: Arc<dyn Pods>,
    config: Arc<AgentConfig>,
    lifecycle: Arc<Lifecycle>,
    metrics: Arc<AgentMetrics>,
    /// Requests being served (at most [`MAX_CNI_HANDLERS`]).
    handlers: AtomicUsize,
}

impl std::fmt::Debug for CniServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CniServer")
            .field("handlers", &self.handlers)
            .finish_non_exhaustive()
    }
}

impl CniServer {
    /// A server of `pods` under `config`'s selection rule and peers.
    pub(super) fn new(
        pods: Arc<dyn Pods>,
        config: Arc<AgentConfig>,
        lifecycle: Arc<Lifecycle>,
        metrics: Arc<AgentMetrics>,
    ) -> CniServer {
        CniServer {
            pods,
            config,
            lifecycle,
            metrics,
            handlers: AtomicUsize::new(0),
        }
    }

    /// Accepts plugin connections until shutdown; one worker per request.
    pub(super) fn accept_loop(self: Arc<Self>, listener: UnixListener) {
        while !self.lifecycle.is_stopping() {
            let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(TICK_MS)) {
                Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(error = %e, "polling the CNI listener");
                    std::thread::sleep(Duration::from_millis(u64::from(TICK_MS)));
                    continue;
                }
            }
            let stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a CNI connection");
                    std::thread::sleep(Duration::from_millis(u64::from(TICK_MS)));
                    continue;
                }
            };
            if self.handlers.fetch_add(1, Ordering::SeqCst) >= MAX_CNI_HANDLERS {
                self.handlers.fetch_sub(1, Ordering::SeqCst);
                tracing::warn!("CNI request refused: {MAX_CNI_HANDLERS} requests in progress");
                let resp = Response::err(
                    Kind::NotReady,
                    format!("node agent busy: {MAX_CNI_HANDLERS} requests in progress"),
                );
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_write_timeout(Some(CNI_IO_TIMEOUT));
                let _ = (&stream).write_all(format!("{}\n", resp.to_line()).as_bytes());
                continue;
            }
            // The slot is given back when the guard drops: after the request,
            // when the handler panics, or with the closure if no thread starts.
            let slot = HandlerSlot(self.clone());
            let spawned = self.lifecycle.spawn_worker("ringway-cni".into(), move || {
                handle(&slot.0, stream);
                drop(slot);
            });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "no thread for a CNI request; dropped");
            }
        }
    }
}

/// One of the [`MAX_CNI_HANDLERS`] request slots, given back on drop (also
/// when a handler panics, so a bad request can never use slots up).
struct HandlerSlot(Arc<CniServer>);

impl Drop for HandlerSlot {
    fn drop(&mut self) {
        self.0.handlers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Why no request line was read.
enum ReadError {
    /// The peer closed without sending anything.
    Empty,
    /// Did not fit in [`MAX_LINE`].
    TooLong,
    /// The deadline passed.
    Timeout,
    /// The socket failed.
    Io(std::io::Error),
}

/// Reads one line (without its newline) within [`CNI_IO_TIMEOUT`] in total.
/// Data closed by EOF instead of a newline counts as the line.
fn read_line(stream: &mut UnixStream) -> Result<String, ReadError> {
    let deadline = Instant::now() + CNI_IO_TIMEOUT;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReadError::Timeout);
        }
        stream.set_read_timeout(Some(left)).map_err(ReadError::Io)?;
        match stream.read(&mut chunk) {
            Ok(0) if buf.is_empty() => return Err(ReadError::Empty),
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                    buf.truncate(pos);
                    break;
                }
                if buf.len() >= MAX_LINE {
                    return Err(ReadError::TooLong);
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(ReadError::Timeout)
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    if buf.len() > MAX_LINE {
        return Err(ReadError::TooLong);
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn handle(srv: &CniServer, mut stream: UnixStream) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(CNI_IO_TIMEOUT));
    // The peer's uid first: nothing it sent is read before it is allowed.
    if let Err(why) = check_peer(&stream, "cni", &srv.config.peer_uids) {
        srv.metrics.refuse("cni", why.reason());
        tracing::warn!(reason = %why, "CNI connection refused");
        let resp = Response::err(Kind::Rejected, why.to_string());
        if stream
            .write_all(format!("{}\n", resp.to_line()).as_bytes())
            .is_ok()
        {
            linger(&mut stream);
        }
        return;
    }
    let resp = match read_line(&mut stream) {
        Ok(line) => dispatch(srv, &line),
        Err(ReadError::Empty) => {
            tracing::debug!("CNI connection closed without a request");
            return;
        }
        Err(ReadError::TooLong) => bad(format!("request longer than {MAX_LINE} bytes")),
        Err(ReadError::Timeout) => bad(format!(
            "no complete request line within {}s",
            CNI_IO_TIMEOUT.as_secs()
        )),
        Err(ReadError::Io(e)) => {
            tracing::warn!(error = %e, "reading a CNI request");
            return;
        }
    };
    if let Err(e) = stream.write_all(format!("{}\n", resp.to_line()).as_bytes()) {
        tracing::warn!(error = %e, "writing the CNI response");
        return;
    }
    linger(&mut stream);
}

/// Closing a unix stream socket with unread input resets the peer, which
/// then loses the response: say we are done, and discard what the client
/// still sends (bounded: 1 s, 1 MiB) until it closes.
fn linger(stream: &mut UnixStream) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut sink = [0u8; 16 * 1024];
    let mut left = 1usize << 20;
    while left > 0 {
        let t = deadline.saturating_duration_since(Instant::now());
        if t.is_zero() || stream.set_read_timeout(Some(t)).is_err() {
            return;
        }
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => return,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

fn bad(msg: String) -> Response {
    tracing::warn!(error = %msg, "bad CNI request");
    Response::err(Kind::BadRequest, msg)
}

fn rejected(msg: String) -> Response {
    tracing::warn!(error = %msg, "CNI request refused");
    Response::err(Kind::Rejected, msg)
}

fn from_enroll(e: EnrollError) -> Response {
    if e.is_retryable() {
        Response::err(Kind::NotReady, e.to_string())
    } else {
        rejected(e.to_string())
    }
}

/// Field access that names exactly what is missing or malformed.
struct Fields<'a> {
    op: &'a str,
    obj: &'a Map<String, Value>,
    prefix: &'static str,
}

impl<'a> Fields<'a> {
    fn name(&self, field: &str) -> String {
        format!("{}{field}", self.prefix)
    }

    fn opt_str(&self, field: &str) -> Result<Option<String>, Response> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(bad(format!(
                "{} request: \"{}\" must be a string",
                self.op,
                self.name(field)
            ))),
        }
    }

    fn str(&self, field: &str) -> Result<String, Response> {
        match self.opt_str(field)? {
            None => Err(bad(format!(
                "{} request has no \"{}\"",
                self.op,
                self.name(field)
            ))),
            Some(s) if s.is_empty() => Err(bad(format!(
                "{} request: \"{}\" is empty",
                self.op,
                self.name(field)
            ))),
            Some(s) => Ok(s),
        }
    }

    fn object(&self, field: &str) -> Result<Fields<'a>, Response> {
        match self.obj.get(field) {
            Some(Value::Object(o)) => Ok(Fields {
                op: self.op,
                obj: o,
                prefix: "pod.",
            }),
            None | Some(Value::Null) => Err(bad(format!(
                "{} request has no \"{}\"",
                self.op,
                self.name(field)
            ))),
            Some(_) => Err(bad(format!(
                "{} request: \"{}\" must be an object",
                self.op,
                self.name(field)
            ))),
        }
    }

    fn array(&self, field: &str) -> Result<Option<&'a Vec<Value>>, Response> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(_) => Err(bad(format!(
                "{} request: \"{}\" must be an array",
                self.op,
                self.name(field)
            ))),
        }
    }
}

/// One request line to one response.
pub(super) fn dispatch(srv: &CniServer, line: &str) -> Response {
    let value: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => return bad(format!("request is not valid JSON: {e}")),
    };
    let Some(obj) = value.as_object() else {
        return bad("request is not a JSON object".into());
    };
    let op = match obj.get("op") {
        Some(Value::String(s)) => s.as_str(),
        None | Some(Value::Null) => return bad("request has no \"op\"".into()),
        Some(_) => return bad("request: \"op\" must be a string".into()),
    };
    let f = Fields {
        op,
        obj,
        prefix: "",
    };
    let span = tracing::info_span!("cni", cni.op = op);
    let _span = span.enter();
    let started = std::time::Instant::now();
    let r = match op {
        "add" => add(srv, &f),
        "del" => del(srv, &f),
        "check" => check(srv, &f),
        "status" => Ok(status(srv)),
        "gc" => gc(srv, &f),
        other => Err(bad(format!(
            "unknown op {other:?} (expected add, del, check, status or gc)"
        ))),
    };
    let resp = r.unwrap_or_else(|resp| resp);
    let outcome = if !resp.ok {
        "error"
    } else if resp.pass_through.is_some() {
        "pass_through"
    } else {
        "ok"
    };
    srv.metrics
        .observe(op, outcome, started.elapsed().as_secs_f64());
    resp
}

/// The pod of an add/check request, and the selection rule's answer when
/// finding its uid already asked it.
///
/// A request without `pod.uid` (a runtime that gave no `K8S_POD_UID`) gets
/// it, once the request is known to be well formed, from (in order): the
/// pod's namespace being excluded (passed through: `Err` with the
/// success); the pod held with this sandbox under this namespace and name
/// (a repeated ADD, a CHECK); the API server's pod of that name
/// ([`Selector::select_by_name`](crate::kube::Selector::select_by_name),
/// which also answers the rule). Without the API it is refused, naming
/// what is missing.
fn pod_of(
    srv: &CniServer,
    f: &Fields<'_>,
    container_id: &str,
) -> Result<(Pod, Option<Selected>), Response> {
    let p = f.object("pod")?;
    let name = p.str("name")?;
    let namespace = p.str("namespace")?;
    let uid = p.opt_str("uid")?.filter(|u| !u.is_empty());
    let service_account = p.opt_str("serviceAccount")?.unwrap_or_default();
    let mut ips = Vec::new();
    for (i, v) in f.array("ips")?.into_iter().flatten().enumerate() {
        let s = v
            .as_str()
            .ok_or_else(|| bad(format!("{} request: \"ips\"[{i}] must be a string", f.op)))?;
        let ip: PodIp = s
            .parse()
            .map_err(|e: PodIpError| bad(format!("{} request: \"ips\"[{i}]: {e}", f.op)))?;
        ips.push(ip.addr);
    }
    let (uid, selected) = match uid {
        Some(uid) => (uid, None),
        None => uid_of(srv, f.op, container_id, &namespace, &name)?,
    };
    Ok((
        Pod {
            uid,
            name,
            namespace,
            service_account,
            ips,
            container_id: Some(container_id.to_string()),
        },
        selected,
    ))
}

/// The uid of pod `namespace`/`name` (sandbox `container_id`) of an add or
/// check request that has none (see [`pod_of`]).
fn uid_of(
    srv: &CniServer,
    op: &str,
    container_id: &str,
    namespace: &str,
    name: &str,
) -> Result<(String, Option<Selected>), Response> {
    if srv.config.exclude_namespaces.iter().any(|n| n == namespace) {
        tracing::info!(pod.namespace = %namespace, pod.name = %name, "the selection rule passes the pod over: not captured (no pod uid needed)");
        return Err(Response::pass_through(UnenrollReason::Excluded.to_string()));
    }
    let named = |uid: &str| {
        srv.pods
            .name_of(uid)
            .is_some_and(|(ns, n)| ns == namespace && n == name)
    };
    if let Some(uid) = srv.pods.find(None, container_id).filter(|u| named(u)) {
        return Ok((uid, None));
    }
    let not_ready = |why: String| {
        tracing::warn!(pod.namespace = %namespace, pod.name = %name, %why, "the runtime gave no pod uid and the agent cannot learn it; the runtime is to retry");
        Response::err(
            Kind::NotReady,
            format!("the runtime gave no K8S_POD_UID for pod {namespace}/{name}, and {why}"),
        )
    };
    let selector = match &srv.config.selection {
        Selection::All => {
            return Err(rejected(format!(
                "{op} request for pod {namespace}/{name} has no \"pod.uid\" (the runtime gave no \
                 K8S_POD_UID), and without the Kubernetes API (--kube) the agent cannot learn it"
            )))
        }
        Selection::Kubernetes(selector) => selector,
    };
    match selector.select_by_name(namespace, name, &srv.config.node_name) {
        // A uid held for another pod is refused by the enroll (one uid is
        // one pod), as it is for a uid the runtime gave.
        Ok(ByName::Found { uid, selected }) => Ok((uid, Some(selected))),
        Ok(ByName::Unknown {
            verdict: Verdict::PassThrough(reason),
            why,
        }) => {
            tracing::info!(pod.namespace = %namespace, pod.name = %name, %reason, %why, "the selection rule passes the pod over: not captured (no pod uid needed)");
            Err(Response::pass_through(reason.to_string()))
        }
        Ok(ByName::Unknown {
            verdict: Verdict::Capture,
            why,
        }) => Err(not_ready(format!(
            "{why}: the namespace's pods are captured"
        ))),
        Err(e) => Err(not_ready(format!("the API server cannot say it: {e}"))),
    }
}

/// The selection rule for a pod of an add or check request: `Ok(None)` to
/// capture it, `Ok(Some(response))` when it passes through, `Err` (retry
/// later) when the rule cannot be answered now.
fn selection(srv: &CniServer, pod: &Pod) -> Result<Option<Response>, Response> {
    match selects(&srv.config, pod) {
        Ok(Verdict::Capture) => Ok(None),
        Ok(Verdict::PassThrough(reason)) => {
            tracing::info!(pod.uid = %pod.uid, %reason, "the selection rule passes the pod over: not captured");
            Ok(Some(Response::pass_through(reason.to_string())))
        }
        Err(e) => {
            tracing::warn!(pod.uid = %pod.uid, error = %e, "cannot tell whether to capture the pod: the runtime is to retry");
            Err(Response::err(
                Kind::NotReady,
                format!("cannot tell whether to capture pod {pod}: {e}"),
            ))
        }
    }
}

/// The selection rule for `pod` (see [`Selection::selects`]).
fn selects(config: &AgentConfig, pod: &Pod) -> Result<Verdict, SelectError> {
    config.selection.selects(pod, &config.exclude_namespaces)
}

/// The selection rule for `pod`, with its service account when known (see
/// [`Selection::select`]).
fn select(config: &AgentConfig, pod: &Pod) -> Result<Selected, SelectError> {
    config
        .selection
        .select(pod, &config.exclude_namespaces, &config.service_accounts)
}

fn add(srv: &CniServer, f: &Fields<'_>) -> Result<Response, Response> {
    let container_id = f.str("containerId")?;
    let netns = f.str("netns")?;
    let (mut pod, known) = pod_of(srv, f, &container_id)?;
    tracing::info!(pod.uid = %pod.uid, pod.name = %pod.name, pod.namespace = %pod.namespace, container_id = %container_id, netns = %netns, "CNI ADD");
    let selected = match known.map_or_else(|| select(&srv.config, &pod), Ok) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(pod.uid = %pod.uid, error = %e, "cannot tell whether to capture the pod: the runtime is to retry");
            return Err(Response::err(
                Kind::NotReady,
                format!("cannot tell whether to capture pod {pod}: {e}"),
            ));
        }
    };
    if let Verdict::PassThrough(reason) = selected.verdict {
        tracing::info!(pod.uid = %pod.uid, %reason, "the selection rule passes the pod over: not captured");
        return Ok(Response::pass_through(reason.to_string()));
    }
    // The pod's identity: never a guess, never the request's word alone.
    let Some(sa) = selected.service_account else {
        return Err(match srv.config.selection {
            Selection::All => rejected(format!(
                "no service account is configured for pod {pod}: without the Kubernetes API \
                 the agent takes it from --pod-service-account {ns}=SA or {ns}/{name}=SA, \
                 and never guesses one",
                ns = pod.namespace,
                name = pod.name
            )),
            Selection::Kubernetes(_) => {
                tracing::warn!(pod.uid = %pod.uid, "the API server has no pod of this uid: its service account is unknown; the runtime is to retry");
                Response::err(
                    Kind::NotReady,
                    format!(
                        "the Kubernetes API server has no pod {}/{} with uid {}: its service account is unknown",
                        pod.namespace, pod.name, pod.uid
                    ),
                )
            }
        });
    };
    if !pod.service_account.is_empty() && pod.service_account != sa {
        return Err(rejected(format!(
            "the request says pod {pod} runs as service account {:?}, the agent knows {sa:?}",
            pod.service_account
        )));
    }
    pod.service_account = sa;
    let fd =
        ringway_redirect::open_netns(Path::new(&netns)).map_err(|e| rejected(e.to_string()))?;
    Ok(
        match srv.pods.enroll(pod, fd, Some(PathBuf::from(&netns))) {
            Ok(()) => Response::ok(),
            Err(e) => from_enroll(e),
        },
    )
}

fn del(srv: &CniServer, f: &Fields<'_>) -> Result<Response, Response> {
    let container_id = f.str("containerId")?;
    let netns = f.opt_str("netns")?.filter(|s| !s.is_empty());
    let uid = match f.obj.get("pod") {
        Some(Value::Object(_)) => f.object("pod")?.opt_str("uid")?,
        _ => None,
    }
    .filter(|s| !s.is_empty());
    tracing::info!(pod.uid = uid.as_deref().unwrap_or(""), container_id = %container_id, netns = netns.as_deref().unwrap_or(""), "CNI DEL");
    // The namespace the runtime means, when it still exists.
    let netns_inode = netns
        .as_deref()
        .and_then(|p| std::fs::metadata(p).ok())
        .map(|m| m.ino());
    match srv.pods.find(uid.as_deref(), &container_id) {
        Some(uid) => match srv
            .pods
            .unenroll_matching(&uid, Some(&container_id), netns_inode)
        {
            Ok(_) => Ok(Response::ok()),
            Err(e) => Ok(from_enroll(e)),
        },
        None => {
            // Not enrolled here; a netns that still carries this pod's rules
            // (state lost some other way) is cleaned up all the same.
            if let (Some(uid), Some(path)) = (uid.as_deref(), netns.as_deref()) {
                remove_stray_rules(srv, uid, Path::new(path));
            }
            Ok(Response::ok())
        }
    }
}

fn remove_stray_rules(srv: &CniServer, uid: &str, path: &Path) {
    let Ok(fd) = ringway_redirect::open_netns(path) else {
        return;
    };
    if let Ok(Some(tag)) = ringway_redirect::read_tag(fd.as_fd()) {
        if tag.uid == uid {
            match ringway_redirect::remove(fd.as_fd(), &srv.config.capture) {
                Ok(()) => {
                    tracing::info!(pod.uid = %uid, "removed the rules of a pod the agent did not hold")
                }
                Err(e) => tracing::warn!(pod.uid = %uid, error = %e, "removing stray rules failed"),
            }
        }
    }
}

fn check(srv: &CniServer, f: &Fields<'_>) -> Result<Response, Response> {
    let container_id = f.str("containerId")?;
    let netns = f.str("netns")?;
    let (pod, _) = pod_of(srv, f, &container_id)?;
    let inode = std::fs::metadata(&netns).ok().map(|m| m.ino());
    Ok(match srv.pods.check(&pod.uid, &container_id, inode) {
        Ok(()) => Response::ok(),
        Err(CheckError::Unknown) => match selection(srv, &pod)? {
            // Not held because the rule passes it over: as the ADD left it.
            Some(pass) => pass,
            None => Response::err(
                Kind::UnknownContainer,
                format!("container {container_id} (pod {}) is not enrolled", pod.uid),
            ),
        },
        Err(e @ CheckError::NotReady) => Response::err(Kind::NotReady, e.to_string()),
        Err(CheckError::Failed(m)) => rejected(m),
    })
}

fn status(srv: &CniServer) -> Response {
    if srv.lifecycle.is_stopping() {
        Response::err(Kind::NotReady, "node agent is shutting down")
    } else if srv.pods.any_ready() {
        Response::ok()
    } else {
        Response::err(Kind::NotReady, "no node proxy is ready")
    }
}

fn gc(srv: &CniServer, f: &Fields<'_>) -> Result<Response, Response> {
    let Some(list) = f.array("validAttachments")? else {
        return Err(bad("gc request has no \"validAttachments\"".into()));
    };
    let mut valid = HashSet::new();
    for (i, a) in list.iter().enumerate() {
        let cid = a
            .get("containerId")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                bad(format!(
                    "gc request: \"validAttachments\"[{i}] has no \"containerId\""
                ))
            })?;
        valid.insert(cid.to_string());
    }
    let removed = srv.pods.gc(&valid);
    tracing::info!(valid = valid.len(), removed = ?removed, "CNI GC");
    Ok(Response::ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No pods: enough for the server's own bookkeeping.
    struct NoPods;

    impl Pods for NoPods {
        fn enroll(&self, _: Pod, _: OwnedFd, _: Option<PathBuf>) -> Result<(), EnrollError> {
            Err(EnrollError::ShuttingDown)
        }
        fn find(&self, _: Option<&str>, _: &str) -> Option<String> {
            None
        }
        fn name_of(&self, _: &str) -> Option<(String, String)> {
            None
        }
        fn unenroll_matching(
            &self,
            _: &str,
            _: Option<&str>,
            _: Option<u64>,
        ) -> Result<bool, EnrollError> {
            Ok(false)
        }
        fn check(&self, _: &str, _: &str, _: Option<u64>) -> Result<(), CheckError> {
            Err(CheckError::Unknown)
        }
        fn any_ready(&self) -> bool {
            false
        }
        fn gc(&self, _: &HashSet<String>) -> Vec<String> {
            Vec::new()
        }
    }

    #[test]
    fn adversarial_a_panicking_handler_gives_its_slot_back() {
        let srv = Arc::new(CniServer::new(
            Arc::new(NoPods),
            Arc::new(AgentConfig::default()),
            Arc::default(),
            Arc::default(),
        ));
        srv.handlers.fetch_add(1, Ordering::SeqCst);
        let slot = HandlerSlot(srv.clone());
        let t = std::thread::spawn(move || {
            let _slot = slot;
            panic!("a handler bug");
        });
        assert!(t.join().is_err());
        assert_eq!(srv.handlers.load(Ordering::SeqCst), 0);
    }
}
