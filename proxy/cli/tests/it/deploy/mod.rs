//! Offline checks of `deploy/`: the Helm chart, the plain manifests rendered from it, the
//! seccomp profile and the Dockerfile. No cluster, no Docker, no network.
//!
//! - The chart is rendered with a Go text/template engine (gtmpl) and the few Helm
//!   functions the templates use, assembled the way Helm 4 does (documents split, sorted
//!   by kind, `# Source:` headers). The default rendering must equal
//!   `deploy/manifests/ringway.yaml` byte for byte. Every other chart test renders with
//!   this emulation, not with Helm. A real `helm` (on PATH or in `RINGWAY_HELM`;
//!   required under `CI=true`, where `.ci/run` installs it) must produce the same objects
//!   as the committed manifests, and as the emulation for the values the tests use.
//!   `RINGWAY_UPDATE_MANIFESTS=1` rewrites the file from the chart instead of comparing.
//! - Every document of the manifests is deserialized into its typed k8s-openapi object and
//!   serialized back: anything the type does not know (a misspelt or misplaced field) is
//!   reported as a difference.
//! - Invariants: capabilities, RBAC verbs, probes, flags (checked against the help of
//!   the `ringway` binary built in this workspace), drain period versus grace period,
//!   the configuration (validated by `ringway_config`), mounts, update strategies.
//!
//! A module per concern: [`render`] (the gtmpl emulation of Helm and the committed
//! manifests), [`helm`] (the real Helm against both), [`objects`] (strict typed
//! parsing), [`invariants`] (what every rendering must hold), [`values`] (the chart
//! follows its values), [`crds`] and [`admission`] (the bundled mesh CRDs, admitted
//! as the API server does), [`ca_service`] (`ca.mode: service`), [`xds`]
//! (`proxy.meshSource: xds`), [`image`] (seccomp profile, Dockerfile). This module
//! holds the paths and values they share.

mod admission;
mod ca_service;
mod crds;
mod helm;
mod image;
mod invariants;
mod objects;
mod render;
mod values;
mod xds;

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

/// The release name and namespace of the committed manifests.
const RELEASE: &str = "ringway";
const NAMESPACE: &str = "ringway-system";

/// The values of `deploy/manifests/ringway-xds.yaml` (and of `helm template ... --set
/// proxy.meshSource=xds`).
const XDS_VALUES: &str = "proxy: {meshSource: xds}\n";

/// Where the image puts the binary (deploy/Dockerfile).
const BINARY_IN_IMAGE: &str = "/usr/local/bin/ringway";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("proxy/cli/ is two levels below the workspace root")
        .to_path_buf()
}

fn deploy() -> PathBuf {
    root().join("deploy")
}

fn chart_dir() -> PathBuf {
    deploy().join("helm/ringway")
}

fn manifests_path() -> PathBuf {
    deploy().join("manifests/ringway.yaml")
}

/// The chart rendered with [`XDS_VALUES`]: ringway in a cluster that runs the Istio
/// ambient mesh.
fn xds_manifests_path() -> PathBuf {
    deploy().join("manifests/ringway-xds.yaml")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn yaml_to_json(text: &str, what: &str) -> Json {
    serde_norway::from_str::<Json>(text).unwrap_or_else(|e| panic!("{what}: not YAML: {e}"))
}

fn values() -> Json {
    yaml_to_json(&read(&chart_dir().join("values.yaml")), "values.yaml")
}
