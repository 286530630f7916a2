//! The proxy's control endpoints, served by [`ControlServer`]s (the shared
//! control server of `ringway-control`: its own thread and current-thread
//! tokio runtime, never a datapath worker; bounded, see [`ControlLimits`]).
//!
//! | port | path | answer |
//! | --- | --- | --- |
//! | 15021 | `GET /healthz/ready` | 200 `ready` once the node agent's snapshot is applied, no pod is pending and (certificate service) no served pod's certificate is awaited after a failure that may pass; 503 with the reason otherwise |
//! | 15020 | `GET /metrics` | Prometheus text 0.0.4, or OpenMetrics when the `Accept` header asks for `application/openmetrics-text` |
//! | 127.0.0.1:15000 | `GET /config_dump`, `POST /logging?level=` | the admin endpoint ([`admin_handler`]) |

use std::sync::Arc;

use hyper::StatusCode;
use ringway_control::{content_type, encode};
pub use ringway_control::{
    readiness_handler, Answer, ControlLimits, ControlServer, Handler, JSON, TEXT,
};

use crate::metrics::Metrics;
use crate::stats::Stats;

/// The metrics handler.
pub fn metrics_handler(metrics: Arc<Metrics>, stats: Arc<Stats>) -> Handler {
    metrics_handler_with(metrics, stats, |_| {})
}

/// [`metrics_handler`] with more metrics: `extend` registers them (the xDS
/// client's, say) beside the proxy's.
pub fn metrics_handler_with(
    metrics: Arc<Metrics>,
    stats: Arc<Stats>,
    extend: impl FnOnce(&mut prometheus_client::registry::Registry),
) -> Handler {
    let mut registry = metrics.registry();
    extend(&mut registry);
    let registry = Arc::new(registry);
    Arc::new(move |method, path, _, openmetrics| match (method, path) {
        (&hyper::Method::GET, "/metrics") | (&hyper::Method::GET, "/stats/prometheus") => {
            // Derived from the datapath's own counters at scrape time, so
            // the workers count each event once.
            metrics.refresh(&stats);
            let body = encode(&registry, openmetrics);
            (StatusCode::OK, content_type(openmetrics), body)
        }
        (_, path) => (
            StatusCode::NOT_FOUND,
            TEXT,
            format!("no such endpoint: {path}\n"),
        ),
    })
}

/// Changes the log filter at run time (the binary's logging implements it).
pub type SetLogLevel = Arc<dyn Fn(&str) -> Result<(), LogLevelError> + Send + Sync>;

/// An error of the logging, as the binary's logging library gives it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a [`SetLogLevel`] did not change the log filter. The admin endpoint
/// answers 400 with `bad log filter "<level>": ` and this message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogLevelError {
    /// The filter does not parse: the parser's reason, as it gave it.
    #[error(transparent)]
    Invalid(BoxError),
    /// The filter parsed but the logging could not take it.
    #[error("the logging cannot take a new filter: {0}")]
    Apply(#[source] BoxError),
    /// This process never set its logging up.
    #[error("logging not initialised")]
    NotInitialised,
}

/// The admin handler (bind it to 127.0.0.1:15000 only):
/// `GET /config_dump` (settings, pods with their listeners, counters, and
/// the reference node proxy's `workloads`, `services`, `policies` and
/// `certificates`: [`crate::config_dump`]) and
/// `POST /logging?level=<tracing filter>`.
pub fn admin_handler(proxy: Arc<crate::Proxy>, set_level: SetLogLevel) -> Handler {
    Arc::new(move |method, path, query, _| match (method, path) {
        (&hyper::Method::GET, "/config_dump") => (StatusCode::OK, JSON, config_dump(&proxy)),
        (&hyper::Method::POST, "/logging") => {
            let level = log_filter_of(query);
            if level.is_empty() {
                return (
                    StatusCode::BAD_REQUEST,
                    TEXT,
                    "POST /logging?level=<filter>, e.g. level=debug or level=info,access=debug\n"
                        .into(),
                );
            }
            set_log_level(&level, &set_level)
        }
        (_, path) => (
            StatusCode::NOT_FOUND,
            TEXT,
            format!("no such endpoint: {path}\n"),
        ),
    })
}

/// `POST /logging` with a non-empty `level`: 200 once set, 400 with the
/// reason when not.
fn set_log_level(level: &str, set_level: &SetLogLevel) -> Answer {
    match set_level(level) {
        Ok(()) => (StatusCode::OK, TEXT, format!("log level: {level}\n")),
        Err(e) => (
            StatusCode::BAD_REQUEST,
            TEXT,
            format!("bad log filter {level:?}: {e}\n"),
        ),
    }
}

/// The `level` of a `/logging` query string, decoded as
/// `application/x-www-form-urlencoded` (`%XX` escapes, `+` for a space; a
/// malformed escape is kept as it came, bytes that are not UTF-8 become
/// U+FFFD); the first one when several are given, empty when none is.
fn log_filter_of(query: &str) -> String {
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "level")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

fn config_dump(proxy: &crate::Proxy) -> String {
    let pods: Vec<serde_json::Value> = proxy
        .pods()
        .into_iter()
        .map(|p| {
            serde_json::json!({
                "uid": p.uid,
                "name": p.identity.name,
                "namespace": p.identity.namespace,
                "serviceAccount": p.identity.service_account,
                "ips": p.ips.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(),
                "netnsInode": p.netns_inode,
                "listeners": p.listeners.iter().map(|(k, a)| format!("{k} {a}")).collect::<Vec<_>>(),
                "authorizedFlows": p.authorized_flows,
            })
        })
        .collect();
    let st = proxy.stats();
    let mesh = proxy.mesh().map(|m| {
        serde_json::json!({
            "origin": m.origin(),
            "revision": format!("{:016x}", m.revision()),
            "trustDomain": m.trust_domain(),
            "workloads": m.workloads().map(|w| serde_json::json!({
                "uid": w.uid,
                "name": w.name,
                "namespace": w.namespace,
                "serviceAccount": w.service_account,
                "ips": w.ips.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(),
                "node": w.node,
                "tunnel": w.tunnel,
                "healthy": w.healthy,
            })).collect::<Vec<_>>(),
            "services": m.services().map(|s| serde_json::json!({
                "hostname": s.hostname,
                "namespace": s.namespace,
                "vips": s.vips.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(),
                "ports": s.ports.iter().map(|(p, t)| (p.to_string(), *t)).collect::<std::collections::BTreeMap<_, _>>(),
                "endpoints": m.endpoint_uids(s),
            })).collect::<Vec<_>>(),
            "policies": m.policies().map(|p| serde_json::json!({
                "name": p.qualified_name().as_ref(),
                "action": p.action.to_string(),
                "rules": p.rules.len(),
                "origin": p.origin.as_deref().unwrap_or("file"),
                "matchLabels": p.match_labels,
            })).collect::<Vec<_>>(),
            "peerAuthentications": m.peer_authentications().iter().map(|p| serde_json::json!({
                "name": p.name.as_ref(),
                "origin": p.origin,
                "meshWide": p.mesh_wide,
                "matchLabels": p.match_labels,
                "mode": p.mode.to_string(),
                "portLevelMtls": p.port_modes.iter().map(|(port, m)| (port.to_string(), m.to_string())).collect::<std::collections::BTreeMap<_, _>>(),
            })).collect::<Vec<_>>(),
            "clusterPolicyNotes": m.cluster_policy_notes().iter().map(|n| serde_json::json!({
                "object": n.object,
                "skipped": n.skipped,
                "reason": n.code,
                "detail": n.reason,
            })).collect::<Vec<_>>(),
        })
    });
    let mesh_now = proxy.mesh();
    let ids = proxy.identities();
    let mut dump = serde_json::json!({
        "settings": serde_json::to_value(proxy.settings()).unwrap_or_default(),
        "datapath": proxy.backend().to_string(),
        "pods": pods,
        "mesh": mesh,
        "hbone": {
            "enabled": proxy.hbone_enabled(),
            "poolConnections": proxy.hbone_connections(),
            "poolStreams": proxy.hbone_streams(),
            "poolConnectionsOpened": proxy.hbone_connections_opened(),
        },
        "stats": {
            "accepted": st.accepted,
            "active": st.active,
            "connectFailed": st.connect_failed,
            "refused": st.refused,
            "sameNode": st.same_node,
            "bytesToUpstream": st.bytes_to_upstream,
            "bytesToClient": st.bytes_to_client,
        },
    });
    // The reference node proxy's sections, for `istioctl ztunnel-config`.
    if let Some(obj) = dump.as_object_mut() {
        obj.extend(crate::config_dump::reference_sections(
            mesh_now.as_deref(),
            ids.as_deref(),
        ));
    }
    serde_json::to_string_pretty(&dump).unwrap_or_default() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each refusal names what was wrong: the parser's reason for a filter
    /// that does not parse, the logging's own otherwise.
    #[test]
    fn logging_answers_name_what_was_wrong() {
        let set: SetLogLevel = Arc::new(|level: &str| match level {
            "info" => Ok(()),
            "info[" => Err(LogLevelError::Invalid("unbalanced [".into())),
            "gone" => Err(LogLevelError::Apply("the subscriber is gone".into())),
            _ => Err(LogLevelError::NotInitialised),
        });
        for (level, code, body) in [
            ("info", 200, "log level: info\n"),
            ("info[", 400, "bad log filter \"info[\": unbalanced [\n"),
            (
                "gone",
                400,
                "bad log filter \"gone\": the logging cannot take a new filter: \
                 the subscriber is gone\n",
            ),
            (
                "debug",
                400,
                "bad log filter \"debug\": logging not initialised\n",
            ),
        ] {
            let (status, kind, text) = set_log_level(level, &set);
            assert_eq!((status.as_u16(), kind, text.as_str()), (code, TEXT, body));
        }
    }

    /// The `/logging` query is form-decoded as a browser, curl
    /// `--data-urlencode` or a hand-typed URL sends it.
    #[test]
    fn logging_level_is_form_decoded_whatever_the_client_sent() {
        for (query, level) in [
            // As typed: commas and `=` need no escape in a query.
            ("level=info,access=debug", "info,access=debug"),
            // Escaped by a client that escapes everything.
            ("level=info%2Caccess%3Ddebug", "info,access=debug"),
            ("level=info%2caccess%3ddebug", "info,access=debug"),
            // Directives with spans and fields: brackets, braces, quotes.
            (
                "level=ringway_proxy%5Bconn%7Bpod.uid%3D%22a%22%7D%5D%3Dtrace",
                "ringway_proxy[conn{pod.uid=\"a\"}]=trace",
            ),
            // `+` is a space in a form; an escaped `+` is a plus.
            ("level=info,+access=debug", "info, access=debug"),
            ("level=a%2Bb", "a+b"),
            // Among other parameters, in any order; the first `level` wins.
            ("x=1&level=warn&y=2", "warn"),
            ("level=warn&level=debug", "warn"),
            // A malformed escape is kept as sent, not dropped or guessed.
            ("level=info%2", "info%2"),
            ("level=%ZZdebug", "%ZZdebug"),
            // Bytes that are not UTF-8 cannot smuggle anything through.
            ("level=%FFdebug", "\u{FFFD}debug"),
            // An escaped `&` or `=` is part of the value, not a separator.
            ("level=a%26b%3Dc", "a&b=c"),
            // No level: empty (the handler answers 400).
            ("", ""),
            ("level", ""),
            ("level=", ""),
            ("levels=debug", ""),
            ("&&=&", ""),
        ] {
            assert_eq!(log_filter_of(query), level, "query {query:?}");
        }
    }
}
