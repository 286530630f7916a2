//! `PeerAuthentication` objects -> mutual-TLS entries of the file model; an
//! object that cannot be read, or names an unknown mode, is STRICT.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::authorization::{port_entry, Entry};
use super::objects::{
    entry_name, note, object_name, parse_spec, readable_selector, PeerAuthenticationObject,
    PolicyContext, WorkloadSelector, PA,
};
use crate::file::PeerAuthenticationConfig;
use crate::model::ClusterPolicyNote;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct PeerAuthenticationSpec {
    selector: Option<WorkloadSelector>,
    mtls: Option<MtlsSpec>,
    port_level_mtls: BTreeMap<String, MtlsSpec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct MtlsSpec {
    mode: Option<String>,
}

/// One PeerAuthentication -> an entry, or `None` (skipped, noted).
pub(crate) fn peer_authentication(
    obj: &PeerAuthenticationObject,
    cx: &PolicyContext<'_>,
    notes: &mut Vec<ClusterPolicyNote>,
) -> Option<PeerAuthenticationConfig> {
    let object = object_name(PA, &obj.metadata);
    let namespace = obj.metadata.namespace.clone().unwrap_or_default();
    let spec: PeerAuthenticationSpec = match parse_spec(&obj.spec) {
        Ok(spec) => spec,
        Err(e) => {
            let labels = readable_selector(&obj.spec);
            if labels.is_some() && namespace == cx.root_namespace {
                notes.push(note(
                    &object,
                    PA,
                    true,
                    "root-selector",
                    format!("spec: {e}; a PeerAuthentication with a selector in the root namespace is ignored (as by the reference)"),
                ));
                return None;
            }
            // It may have said STRICT: it stays STRICT, over what it could
            // select.
            notes.push(note(
                &object,
                PA,
                false,
                "unreadable-strict",
                format!(
                    "spec: {e}: a PeerAuthentication that cannot be read is STRICT for what it \
                     could select ({})",
                    match &labels {
                        Some(l) => format!("workloads labelled {l:?}"),
                        None if namespace == cx.root_namespace => "the whole mesh".into(),
                        None => format!("every workload of namespace {namespace}"),
                    }
                ),
            ));
            return Some(PeerAuthenticationConfig {
                name: entry_name(&obj.metadata),
                mesh_wide: namespace == cx.root_namespace,
                namespace,
                match_labels: labels,
                mode: "STRICT".into(),
                port_modes: Vec::new(),
                origin: object,
            });
        }
    };
    let labels = spec
        .selector
        .map(|s| s.match_labels)
        .filter(|l| !l.is_empty());
    if labels.is_some() && namespace == cx.root_namespace {
        notes.push(note(
            &object,
            PA,
            true,
            "root-selector",
            "a PeerAuthentication with a selector in the root namespace is ignored (as by the \
             reference)"
                .into(),
        ));
        return None;
    }
    let mode_of = |at: &str, m: Option<&MtlsSpec>, notes: &mut Vec<ClusterPolicyNote>| -> String {
        match m.and_then(|m| m.mode.as_deref()).unwrap_or("UNSET") {
            "DISABLE" => {
                notes.push(note(
                    &object,
                    PA,
                    false,
                    "disable-as-permissive",
                    format!(
                        "{at}: DISABLE is not supported by a node proxy (the mesh's traffic is \
                         always mutual TLS); it is PERMISSIVE"
                    ),
                ));
                "PERMISSIVE".into()
            }
            known @ ("UNSET" | "PERMISSIVE" | "STRICT") => known.to_owned(),
            other => {
                notes.push(note(
                    &object,
                    PA,
                    false,
                    "unknown-mode-strict",
                    format!(
                        "{at}: {other:?} is not UNSET, DISABLE, PERMISSIVE or STRICT (the API's \
                         values): it counts as STRICT"
                    ),
                ));
                "STRICT".into()
            }
        }
    };
    let mut mode = mode_of("mtls.mode", spec.mtls.as_ref(), notes);
    let mut port_modes = Vec::new();
    if labels.is_none() && !spec.port_level_mtls.is_empty() {
        notes.push(note(
            &object,
            PA,
            false,
            "port-level-without-selector",
            "portLevelMtls is ignored without a selector (as by the reference)".into(),
        ));
    } else {
        let mut stricter_everywhere = false;
        for (port, m) in &spec.port_level_mtls {
            let strict_or_unknown = !matches!(
                m.mode.as_deref(),
                None | Some("UNSET" | "PERMISSIVE" | "DISABLE")
            );
            // A port that cannot be read: an entry that may have made it
            // STRICT cannot be placed, so the whole workload is STRICT;
            // one that relaxes a port is left out (the workload's mode
            // stays). Never the whole object.
            let n = match port_entry(port) {
                Entry::Keep(n) => n.parse::<i64>().unwrap_or_default(),
                Entry::Never(why) | Entry::Skip(why) => {
                    let what = if strict_or_unknown {
                        stricter_everywhere = true;
                        "it may say STRICT, so every port of the workload is STRICT"
                    } else {
                        "the entry is skipped (the workload's mode applies to the port)"
                    };
                    notes.push(note(
                        &object,
                        PA,
                        false,
                        if strict_or_unknown {
                            "unreadable-strict"
                        } else {
                            "entry-skipped"
                        },
                        format!("portLevelMtls[{port:?}]: {why}: {what}"),
                    ));
                    continue;
                }
            };
            // With the workload's own mode unset, the reference counts only
            // PERMISSIVE ports as exceptions to an inherited STRICT: a
            // DISABLE port then inherits (stays STRICT under STRICT).
            if matches!(mode.as_str(), "UNSET" | "") && m.mode.as_deref() == Some("DISABLE") {
                notes.push(note(
                    &object,
                    PA,
                    false,
                    "port-disable-inherits",
                    format!(
                        "portLevelMtls[{port}]: DISABLE under an unset mtls.mode is no \
                         exception to an inherited STRICT (as the reference): the port \
                         inherits the enclosing mode"
                    ),
                ));
                port_modes.push((n, "UNSET".to_owned()));
                continue;
            }
            let m = mode_of(&format!("portLevelMtls[{port}]"), Some(m), notes);
            port_modes.push((n, m));
        }
        if stricter_everywhere {
            mode = "STRICT".into();
        }
    }
    Some(PeerAuthenticationConfig {
        name: entry_name(&obj.metadata),
        mesh_wide: namespace == cx.root_namespace,
        namespace,
        match_labels: labels,
        mode,
        port_modes,
        origin: object,
    })
}
