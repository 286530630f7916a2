//! The real Helm (`RINGWAY_HELM`, else `helm` on PATH; required under `CI=true`)
//! against the committed manifests and against the emulation ([`super::render`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::ca_service::CA_SERVICE_VALUES;
use super::objects::documents;
use super::render::render_chart;
use super::{chart_dir, manifests_path, read, xds_manifests_path, NAMESPACE, RELEASE, XDS_VALUES};

/// A real Helm, when there is one: `RINGWAY_HELM`, else `helm` on PATH.
fn real_helm() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("RINGWAY_HELM") {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("helm"))
            .find(|p| p.is_file())
    })
}

/// The real Helm for the tests that run one. Under `CI=true` it must be there
/// (`.ci/run` installs the official Helm release binary, shipped in an npm package):
/// a run without it fails, it never counts as a pass. Outside CI, without one, the
/// test prints a loud SKIPPED line to the process's stderr and returns.
fn required_helm(test: &str) -> Option<PathBuf> {
    let Some(helm) = real_helm() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{test}: no `helm` on PATH and no RINGWAY_HELM under CI=true; .ci/run installs \
             Helm (see its \"helm\" step), so this run is broken, not skippable"
        );
        // Straight to the process's stderr: libtest's capture (which hides
        // `eprintln!` of passing tests) does not hold it back.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "\n!!! SKIPPED {test}: no `helm` on PATH and no RINGWAY_HELM (not under CI, where \
             it is required); the chart was checked against the tests' own gtmpl emulation \
             only\n"
        );
        return None;
    };
    assert!(
        helm.is_file(),
        "RINGWAY_HELM={} is not a file",
        helm.display()
    );
    Some(helm)
}

/// `helm template RELEASE deploy/helm/ringway -n namespace -f overrides`: its
/// stdout, or its stderr as the error.
fn helm_template(helm: &Path, overrides: &str, namespace: &str) -> Result<String, String> {
    // A new private directory per call, never a predictable path.
    let dir = ringway_testbed::TempDir::new("helm-values");
    let values = dir.join("values.yaml");
    std::fs::write(&values, overrides).unwrap();
    // A fork outside run_isolated (see `ringway_testbed::exclusive`).
    let _running = ringway_testbed::exclusive::shared();
    let out = Command::new(helm)
        .args(["template", RELEASE])
        .arg(chart_dir())
        .args(["--namespace", namespace, "--values"])
        .arg(&values)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", helm.display()));
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The committed manifests against a real `helm template` (the two
/// `*_are_the_chart_rendered_*` tests in [`super::render`] compare them with the
/// tests' own gtmpl emulation of Helm only). Required under
/// `CI=true` ([`required_helm`]); a `RINGWAY_HELM` that names no file fails.
#[test]
fn helm_template_agrees_with_the_manifests() {
    let Some(helm) = required_helm("helm_template_agrees_with_the_manifests") else {
        return;
    };
    for (path, set) in [(manifests_path(), ""), (xds_manifests_path(), XDS_VALUES)] {
        let committed = read(&path);
        let out = helm_template(&helm, set, NAMESPACE)
            .unwrap_or_else(|e| panic!("helm template failed: {e}"));
        assert_eq!(
            documents(&out),
            documents(&committed),
            "`helm template` ({}) disagrees with {}",
            helm.display(),
            path.display()
        );
    }
    eprintln!("helm template ({}) agrees", helm.display());
}

/// The other chart tests render with the tests' own gtmpl emulation of Helm
/// ([`render_chart`]); this holds that emulation to a real `helm template` for the
/// values those tests use: the same objects for each accepted set, and a refusal
/// from both, naming the same value, for each refused one. Required under `CI=true`
/// ([`required_helm`]).
#[test]
fn helm_template_agrees_with_the_emulation_for_the_tested_values() {
    let Some(helm) = required_helm("helm_template_agrees_with_the_emulation_for_the_tested_values")
    else {
        return;
    };
    let accepted = [
        "metrics: {enabled: true, serviceMonitor: {enabled: true}}\n\
         priorityClass: {create: true, name: ringway-node-critical}\n",
        "proxy: {seccompProfile: {type: RuntimeDefault}}\nca: {mode: local, secretName: \"\"}\n",
        "proxy: {seccompProfile: {type: Unconfined}}\nca: {mode: local, secretName: \"\"}\n",
        "metrics: {enabled: false}",
        "istioCRDs: {install: true}",
        "proxy: {meshSource: file}",
        "proxy: {hostNetwork: true, updateStrategy: {maxSurge: 0}}",
        "agent: {kube: false, podServiceAccounts: [\"shop=web\", \"bank/vault=vault\"]}\n",
        CA_SERVICE_VALUES,
        "ca: {mode: local}\n",
        "ca: {mode: service}\nproxy: {hostNetwork: true, updateStrategy: {maxSurge: 0}}\n",
        "proxy: {meshSource: xds}\nca: {mode: istiod}\n",
        "proxy: {stateDir: \"\"}",
        "proxy: {stateDir: /var/lib/ringway/tunnels}",
    ];
    for over in accepted {
        let ours = render_chart(over, NAMESPACE).unwrap_or_else(|e| panic!("{over}: {e}"));
        let helms = helm_template(&helm, over, NAMESPACE)
            .unwrap_or_else(|e| panic!("{over}: helm template failed: {e}"));
        assert_eq!(
            documents(&helms),
            documents(&ours),
            "`helm template` disagrees with the emulation for {over:?}"
        );
    }
    let refused = [
        ("proxy: {meshSource: api}", NAMESPACE, "proxy.meshSource"),
        ("", "default", "ringway-system"),
        ("proxy: {hostNetwork: true}", NAMESPACE, "maxSurge"),
        (
            "metrics: {enabled: false, serviceMonitor: {enabled: true}}",
            NAMESPACE,
            "metrics.enabled",
        ),
        ("ca: {mode: remote}", NAMESPACE, "ca.mode"),
        (
            "ca: {mode: service, secretName: \"\"}",
            NAMESPACE,
            "ca.secretName",
        ),
    ];
    for (over, ns, names) in refused {
        let ours = render_chart(over, ns).expect_err(over);
        let helms = helm_template(&helm, over, ns).expect_err(over);
        assert!(
            ours.contains(names) && helms.contains(names),
            "{over:?} in {ns}: both must refuse naming {names}\n  emulation: {ours}\n  helm: {helms}"
        );
    }
}
