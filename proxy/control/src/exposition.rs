//! The exposition: a registry encoded as the scraper asked, with
//! prometheus-client's own encoders (never edited as text).

use prometheus_client::registry::Registry;

/// Encodes `registry` with prometheus-client's own encoders: OpenMetrics
/// text when `openmetrics`, else Prometheus text 0.0.4. The exposition is
/// never edited as text.
pub fn encode(registry: &Registry, openmetrics: bool) -> String {
    let mut out = String::new();
    let done = if openmetrics {
        prometheus_client::encoding::text::encode(&mut out, registry)
    } else {
        prometheus_client::encoding::prometheus_text::encode(&mut out, registry)
    };
    match done {
        Ok(()) => out,
        Err(e) => {
            tracing::error!(error = %e, "cannot encode the metrics");
            String::new()
        }
    }
}

/// The `Content-Type` of what [`encode`] returns.
pub fn content_type(openmetrics: bool) -> &'static str {
    if openmetrics {
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    } else {
        prometheus_client::encoding::prometheus_text::CONTENT_TYPE
    }
}
