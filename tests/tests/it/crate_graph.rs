//! The crate graph drawn in ARCHITECTURE.md ("Crates", between the
//! `crate-graph` markers) is the one cargo builds: every product crate's
//! normal dependencies on ringway crates are exactly the table's, none
//! reaches what the table says it never may (through any path), and the
//! image build (`-p ringway --no-default-features`) carries no test bed, no
//! test CA and no test-only feature. README.md's layout table lists
//! exactly the workspace's members, each under its own crate name, its
//! commands table names exactly the flags the binary's clap definitions
//! have, and unsafe code lives only where ARCHITECTURE.md's crate table
//! says.

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
        if !p["source"].is_null() {
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
    assert!(checked >= 8, "only {checked} crates with integration tests");
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
const KNOWN_CYCLES: &[&str] = &[];

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

/// README.md's "Layout" table, row by row: (path without the trailing `/`,
/// crate name).
fn readme_layout() -> Vec<(String, String)> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let start = readme
        .find("\n## Layout\n")
        .expect("README.md has a Layout section");
    let section = &readme[start + 1..];
    let section = &section[..section[1..].find("\n## ").map_or(section.len(), |e| e + 1)];
    let mut rows = Vec::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // ["", path, crate, concern, ""]
        assert_eq!(cells.len(), 5, "README.md layout row: {line}");
        let path = names(cells[1]).into_iter().next().unwrap();
        let krate = names(cells[2]).into_iter().next().unwrap();
        rows.push((path.trim_end_matches('/').to_owned(), krate));
    }
    rows
}

/// The workspace's members as Cargo.toml lists them, each with its
/// package's name.
fn workspace_members() -> BTreeMap<String, String> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let list = manifest
        .split_once("members = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .expect("Cargo.toml lists the workspace members")
        .0;
    let meta = metadata();
    let packages = meta["packages"].as_array().unwrap();
    list.split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .map(|member| {
            let manifest = root().join(member).join("Cargo.toml");
            let package = packages
                .iter()
                .find(|p| Path::new(p["manifest_path"].as_str().unwrap()) == manifest)
                .unwrap_or_else(|| panic!("no package at {}", manifest.display()));
            (
                member.to_owned(),
                package["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn readme_layout_lists_exactly_the_workspace_members() {
    let rows = readme_layout();
    let listed: BTreeMap<String, String> = rows.iter().cloned().collect();
    assert_eq!(listed.len(), rows.len(), "a path listed twice: {rows:?}");
    assert_eq!(
        listed,
        workspace_members(),
        "README.md's layout table and the workspace's members (Cargo.toml) differ"
    );
}

/// ARCHITECTURE.md's crate table ("Crates", the one with the `unsafe`
/// column), row by row: (crate, path, what the `unsafe` cell says).
fn documented_unsafe() -> Vec<(String, String, String)> {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let header = "| crate | path | concern | `unsafe` |";
    let start = doc
        .find(header)
        .expect("ARCHITECTURE.md has the crate table with its `unsafe` column");
    doc[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            // ["", crate, path, concern, unsafe, ""]
            assert_eq!(cells.len(), 6, "ARCHITECTURE.md crate row: {line}");
            let krate = names(cells[1]).into_iter().next().unwrap();
            let path = names(cells[2]).into_iter().next().unwrap();
            (krate, path, cells[4].to_owned())
        })
        .collect()
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The unsafe code in a file: (line index, line) of each `unsafe` block,
/// fn, impl, trait or extern block, comments left out.
fn unsafe_lines(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .filter_map(|(i, line)| {
            let code = line.split("//").next().unwrap();
            [
                "unsafe {",
                "unsafe fn ",
                "unsafe impl",
                "unsafe trait",
                "unsafe extern",
            ]
            .iter()
            .any(|k| code.contains(k))
            .then(|| (i, code.trim().to_owned()))
        })
        .collect()
}

/// The `unsafe` column of ARCHITECTURE.md's crate table holds: a crate
/// marked `forbidden` forbids unsafe code in its root; any other denies it
/// crate-wide and has unsafe code only in the files it names (each of which
/// has some), every block under a `// SAFETY:` comment, every `unsafe fn`
/// documented with a `# Safety` section.
#[test]
fn unsafe_lives_only_where_architecture_says() {
    let rows = documented_unsafe();
    let listed: BTreeSet<&str> = rows.iter().map(|(k, _, _)| k.as_str()).collect();
    let crates: BTreeSet<&str> = product_crates().iter().map(|(k, _)| *k).collect();
    assert_eq!(
        listed, crates,
        "ARCHITECTURE.md's crate table and the crates differ"
    );
    for (krate, path, cell) in &rows {
        let src = root().join(path).join("src");
        let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let allowed: Vec<PathBuf> = if cell == "forbidden" {
            assert!(
                lib.contains("#![forbid(unsafe_code)]"),
                "{krate}: ARCHITECTURE.md says unsafe is forbidden, its lib.rs does not forbid it"
            );
            Vec::new()
        } else {
            assert!(
                lib.contains("#![deny(unsafe_code)]"),
                "{krate}: unsafe is not denied crate-wide"
            );
            names(cell)
                .into_iter()
                .filter(|n| n.starts_with(path.as_str()))
                .map(|n| root().join(n))
                .collect()
        };
        let mut used = BTreeSet::new();
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            for (i, code) in unsafe_lines(&text) {
                let at = format!("{}:{}: {code}", file.display(), i + 1);
                let place = allowed.iter().find(|a| file.starts_with(a));
                assert!(
                    place.is_some(),
                    "{at}: unsafe code outside what ARCHITECTURE.md names for {krate} ({cell})"
                );
                used.insert(place.unwrap().clone());
                let before = |n: usize| lines[i.saturating_sub(n)..=i].join("\n");
                if code.contains("unsafe fn ") {
                    assert!(
                        before(20).contains("# Safety"),
                        "{at}: no `# Safety` section"
                    );
                }
                if code.contains("unsafe {") {
                    assert!(
                        before(5).contains("SAFETY:"),
                        "{at}: no `// SAFETY:` comment"
                    );
                }
            }
        }
        for a in &allowed {
            assert!(
                used.contains(a),
                "ARCHITECTURE.md says {krate} has unsafe code in {}, and it has none there",
                a.display()
            );
        }
    }
}

/// The long flags of clap's `struct name` in `file` (under `proxy/cli/src`):
/// each field whose `#[arg(..)]` has `long`, as `long = ".."` names it or
/// else as its field name with `-` for `_`.
fn clap_flags(file: &str, name: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join("proxy/cli/src").join(file)).unwrap();
    let start = text
        .find(&format!("struct {name} {{"))
        .unwrap_or_else(|| panic!("no struct {name} in {file}"));
    let body = &text[start..start + text[start..].find("\n}").unwrap()];
    let mut flags = BTreeSet::new();
    // An `#[arg(` attribute still open, and the ones waiting for their field.
    let mut open: Option<String> = None;
    let mut pending: Vec<String> = Vec::new();
    for line in body.lines().skip(1).map(str::trim) {
        if let Some(mut a) = open.take() {
            a.push_str(line);
            if line.ends_with(")]") {
                pending.push(a);
            } else {
                open = Some(a);
            }
            continue;
        }
        if line.is_empty() || line.starts_with("//") {
            continue;
        }
        if line.starts_with("#[arg(") {
            if line.ends_with(")]") {
                pending.push(line.to_owned());
            } else {
                open = Some(line.to_owned());
            }
            continue;
        }
        if line.starts_with("#[") {
            continue;
        }
        let field = line
            .split(':')
            .next()
            .unwrap()
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub ")
            .trim();
        for a in pending.drain(..) {
            let args = &a["#[arg(".len()..a.len() - 2];
            for part in args.split(',').map(str::trim) {
                if part == "long" {
                    flags.insert(field.replace('_', "-"));
                } else if let Some(v) = part.strip_prefix("long = ") {
                    flags.insert(v.trim_matches('"').to_owned());
                }
            }
        }
    }
    flags
}

/// The long flags (`--name`) written in `text`.
fn flags_in(text: &str) -> BTreeSet<String> {
    text.split("--")
        .skip(1)
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
                .collect::<String>()
        })
        .filter(|f| !f.is_empty())
        .collect()
}

/// README.md's commands table names every flag of each subcommand (in the
/// rows of that command), and its synopses name no flag the command does
/// not have: the agent's row lacked three once.
#[test]
fn readme_commands_name_exactly_the_flags_each_command_has() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    // The global flags, documented below the table.
    let global: BTreeSet<String> = ["log", "log-format", "help"].map(String::from).into();
    for (command, structs) in [
        ("sandbox", vec![("args.rs", "SandboxArgs")]),
        (
            "proxy",
            vec![("args.rs", "ProxyArgs"), ("xds.rs", "XdsArgs")],
        ),
        ("agent", vec![("args.rs", "AgentArgs")]),
        ("ca", vec![("args.rs", "CaArgs")]),
        ("redirect", vec![("args.rs", "RedirectArgs")]),
    ] {
        let have: BTreeSet<String> = structs
            .iter()
            .flat_map(|(file, name)| clap_flags(file, name))
            .collect();
        assert!(have.len() > 1, "{command}: too few flags read: {have:?}");
        let rows: Vec<&str> = readme
            .lines()
            .filter(|l| l.starts_with(&format!("| `ringway {command} ")))
            .collect();
        assert!(
            !rows.is_empty(),
            "README.md has no row for ringway {command}"
        );
        let named: BTreeSet<String> = rows.iter().flat_map(|r| flags_in(r)).collect();
        let missing: Vec<_> = have.difference(&named).collect();
        assert!(
            missing.is_empty(),
            "README.md's rows for ringway {command} do not name {missing:?}"
        );
        for row in rows {
            let synopsis = row.split(" | ").next().unwrap();
            let unknown: Vec<_> = flags_in(synopsis)
                .into_iter()
                .filter(|f| !have.contains(f) && !global.contains(f))
                .collect();
            assert!(
                unknown.is_empty(),
                "README.md's ringway {command} names flags it does not have: {unknown:?}"
            );
        }
    }
}
