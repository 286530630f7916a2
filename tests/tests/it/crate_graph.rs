//! The crate graph drawn in ARCHITECTURE.md ("Crates", between the
//! `crate-graph` markers) is the one cargo builds: every product crate's
//! normal dependencies on ringway crates are exactly the table's, none
//! reaches what the table says it never may (through any path), and the
//! image build (`-p ringway --no-default-features`) carries no test bed, no
//! test CA and no test-only feature.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn cargo(args: &[&str]) -> String {
    // A fork outside run_isolated (see `ringway_testbed::exclusive`).
    let _running = ringway_testbed::exclusive::shared();
    let out = Command::new(env!("CARGO"))
        .args(args)
        .arg("--offline")
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("running cargo {args:?}: {e}"));
    assert!(
        out.status.success(),
        "cargo {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("cargo prints UTF-8")
}

/// The backticked names in a table cell.
fn names(cell: &str) -> BTreeSet<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Row per crate: (depends on, never depends on), from ARCHITECTURE.md.
fn documented() -> BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let start = doc
        .find("<!-- crate-graph:begin -->")
        .expect("ARCHITECTURE.md has the crate-graph:begin marker");
    let end = doc
        .find("<!-- crate-graph:end -->")
        .expect("ARCHITECTURE.md has the crate-graph:end marker");
    let mut rows = BTreeMap::new();
    for line in doc[start..end].lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // ["", crate, depends on, never, ""]
        assert_eq!(cells.len(), 5, "ARCHITECTURE.md crate-graph row: {line}");
        let krate = names(cells[1]).into_iter().next().unwrap();
        // Only what comes before `;` is a plain normal dependency; the rest
        // of the cell explains feature-gated ones.
        let plain = cells[2].split(';').next().unwrap();
        rows.insert(krate, (names(plain), names(cells[3])));
    }
    assert!(rows.len() >= 8, "too few crate-graph rows: {rows:?}");
    rows
}

/// The workspace's packages as cargo reads them.
fn metadata() -> serde_json::Value {
    serde_json::from_str(&cargo(&["metadata", "--format-version", "1", "--no-deps"])).unwrap()
}

#[test]
fn architecture_crate_graph_matches_cargo_metadata() {
    let doc = documented();
    let meta = metadata();
    let packages = meta["packages"].as_array().unwrap();
    let mut seen = BTreeSet::new();
    for p in packages {
        let name = p["name"].as_str().unwrap();
        let local = p["source"].is_null();
        let Some((want, never)) = doc.get(name) else {
            // Every product crate of the workspace has a row; only the test
            // bed and the benches (which nothing ships) may go without.
            assert!(
                !local || matches!(name, "ringway-testbed" | "ringway-benches"),
                "workspace crate {name} is missing from ARCHITECTURE.md's crate graph"
            );
            continue;
        };
        seen.insert(name.to_owned());
        let mut have = BTreeSet::new();
        for d in p["dependencies"].as_array().unwrap() {
            let dep = d["name"].as_str().unwrap();
            let normal = d["kind"].is_null();
            if !normal || !dep.starts_with("ringway") || dep == name {
                continue;
            }
            if d["optional"].as_bool() == Some(true) {
                // An optional product dependency is only allowed for the
                // sandbox feature of the binary, and must be in the table's
                // explanation after `;`.
                assert_eq!(
                    (name, dep),
                    ("ringway", "ringway-testbed"),
                    "{name}: optional dependency on {dep} is not in ARCHITECTURE.md"
                );
                let features = p["features"]["sandbox"].as_array().unwrap();
                assert!(
                    features.iter().any(|f| f == "dep:ringway-testbed"),
                    "ringway-testbed must be reachable only through the `sandbox` feature"
                );
                continue;
            }
            have.insert(dep.to_owned());
        }
        assert_eq!(
            &have, want,
            "ARCHITECTURE.md's crate graph disagrees with {name}'s Cargo.toml"
        );
        assert!(
            have.is_disjoint(never),
            "{name} depends on what it never may: {:?}",
            have.intersection(never).collect::<Vec<_>>()
        );
    }
    let missing: Vec<_> = doc.keys().filter(|k| !seen.contains(*k)).collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names crates cargo does not know: {missing:?}"
    );
}

/// Every crate reachable from `package` through normal dependencies, as
/// cargo resolves them for building that package alone.
fn closure(package: &str, extra: &[&str]) -> BTreeSet<String> {
    let mut args = vec!["tree", "-p", package, "-e", "normal", "--prefix", "none"];
    args.extend_from_slice(extra);
    cargo(&args)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn no_product_crate_reaches_what_it_never_may() {
    for (krate, (_, never)) in documented() {
        let extra: &[&str] = if krate == "ringway" {
            &["--no-default-features"]
        } else {
            &[]
        };
        let reach = closure(&krate, extra);
        let bad: Vec<_> = never.intersection(&reach).collect();
        assert!(
            bad.is_empty(),
            "{krate} reaches {bad:?} through its normal dependencies (cargo tree -p {krate} -e normal)"
        );
        assert!(
            !reach.contains("ringway-testbed") && !reach.contains("ringway-benches"),
            "{krate} reaches the test bed or the benches: {reach:?}"
        );
    }
}

#[test]
fn the_image_build_has_no_test_code() {
    // What `cargo build -p ringway --no-default-features` (deploy/Dockerfile)
    // compiles, with the features each crate is built with.
    let tree = cargo(&[
        "tree",
        "-p",
        "ringway",
        "--no-default-features",
        "-e",
        "normal,features",
        "--prefix",
        "none",
    ]);
    for forbidden in [
        "ringway-testbed",
        "ringway-benches",
        "ringway-identity feature \"testing\"",
        "ringway-cni feature \"testing\"",
        "ringway-redirect feature \"testing\"",
        "ringway-xds feature \"testing\"",
        "tower-test",
    ] {
        assert!(
            !tree.contains(forbidden),
            "the image build compiles {forbidden}:\n{tree}"
        );
    }
    // And the default build (`cargo run -- sandbox`) does reach the test bed,
    // so the check above is not vacuous.
    let with_sandbox = cargo(&["tree", "-p", "ringway", "-e", "normal", "--prefix", "none"]);
    assert!(with_sandbox.contains("ringway-testbed"));
}

/// Crates whose integration tests are laid out elsewhere than here: the
/// benches' `tests/` are report drivers, kept with the benches.
const OWN_TEST_LAYOUT: &[&str] = &["ringway-benches"];

/// One integration-test binary per crate, at most, and it is `it`
/// (`<crate>/tests/it/main.rs`, a module per area): every test file linking
/// the whole tree again is what the layout avoids. A new `tests/*.rs` file
/// or `tests/*/main.rs` directory is a second binary: make it a module of
/// `it` instead.
#[test]
fn each_crate_has_at_most_one_integration_test_binary() {
    let meta = metadata();
    let mut checked = 0;
    for p in meta["packages"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        if !p["source"].is_null() || OWN_TEST_LAYOUT.contains(&name) {
            continue;
        }
        let tests: Vec<(&str, &str)> = p["targets"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["kind"].as_array().unwrap().iter().any(|k| k == "test"))
            .map(|t| (t["name"].as_str().unwrap(), t["src_path"].as_str().unwrap()))
            .collect();
        assert!(
            tests.len() <= 1,
            "{name} has {} integration-test binaries (one per crate: tests/it/main.rs with a module each): {tests:?}",
            tests.len()
        );
        if let Some((test, path)) = tests.first() {
            assert!(
                *test == "it" && path.ends_with("/tests/it/main.rs"),
                "{name}'s integration-test binary is {test} ({path}), not tests/it/main.rs"
            );
            checked += 1;
        }
    }
    assert!(checked >= 7, "only {checked} crates with integration tests");
}

/// The product crates' source directories.
fn product_crates() -> Vec<(&'static str, PathBuf)> {
    [
        ("ringway", "proxy/cli/src"),
        ("ringway-proxy", "proxy/src"),
        ("ringway-control", "proxy/control/src"),
        ("ringway-identity", "proxy/identity/src"),
        ("ringway-hbone", "proxy/hbone/src"),
        ("ringway-ca", "proxy/ca/src"),
        ("ringway-grpc", "proxy/grpc/src"),
        ("ringway-xds", "proxy/xds/src"),
        ("ringway-cni", "cni/src"),
        ("ringway-zds", "cni/zds/src"),
        ("ringway-redirect", "redirect/src"),
        ("ringway-config", "config/src"),
        ("ringway-testbed", "tests/src"),
        ("ringway-benches", "benches/src"),
    ]
    .into_iter()
    .map(|(c, p)| (c, root().join(p)))
    .collect()
}

/// The cycles that remain to be taken apart, exactly: a new one fails this
/// test, and so does one that is gone but still listed (remove it). The
/// goal is an empty list.
const KNOWN_CYCLES: &[&str] = &["ringway-benches: crosscheck <-> report <-> suite"];

/// No module of a crate names, through any path, a module that names it
/// back, beyond [`KNOWN_CYCLES`]: each crate reads as layers with arrows
/// one way (the module graph from the sources: `ringway_testbed::modgraph`).
#[test]
fn no_module_cycles_within_any_crate() {
    let mut found = Vec::new();
    for (krate, src) in product_crates() {
        let g = ringway_testbed::modgraph::ModuleGraph::read(&src)
            .unwrap_or_else(|e| panic!("reading {}: {e}", src.display()));
        assert!(!g.files.is_empty(), "{krate}: no modules read");
        for c in g.cycles() {
            found.push(format!("{krate}: {}", c.join(" <-> ")));
        }
    }
    let known: Vec<String> = KNOWN_CYCLES.iter().map(|c| c.to_string()).collect();
    let new: Vec<&String> = found.iter().filter(|c| !known.contains(c)).collect();
    let gone: Vec<&String> = known.iter().filter(|c| !found.contains(c)).collect();
    assert!(
        new.is_empty() && gone.is_empty(),
        "import cycles inside crates changed.\nnew (take them apart):\n{}\ngone (remove them from KNOWN_CYCLES):\n{}",
        new.iter().map(|c| c.as_str()).collect::<Vec<_>>().join("\n"),
        gone.iter().map(|c| c.as_str()).collect::<Vec<_>>().join("\n")
    );
}
