//! The module graph of a crate, read from its sources, and its cycles: the
//! check behind "no import cycle inside a crate" (`tests/tests/it/crate_graph.rs`).
//!
//! A node is a module (a file: `lib.rs` is the crate root, `a.rs` and
//! `a/mod.rs` are `a`, `a/b.rs` is `a::b`); an edge says a module's code
//! names an item of another module: through `use`, or a path in code
//! (`crate::a::f()`, `super::T`, `child::g()`). A name re-exported by a
//! module (`pub use b::T`) counts as the module that defines it, and a
//! module's own re-exports are not edges of it (a facade). Test code is left
//! out: `tests.rs` files and `#[cfg(test)] mod ... { ... }` blocks. Code in
//! an inline module (`mod m { ... }` in a file) is read from that module, so
//! its `super::` names the file's own module, and its edges are the file's.
//!
//! It reads paths, not types: a name brought in by a glob (`use a::*`)
//! counts as an edge to `a`, and macros are not expanded. That is enough for
//! the layering the project keeps (one way between modules), and anyone can
//! run it: `cargo test -p ringway-testbed --test it -- crate_graph::`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A crate's modules and which names which.
#[derive(Debug, Default)]
pub struct ModuleGraph {
    /// Module path (`""` for the root) -> its file.
    pub files: BTreeMap<String, PathBuf>,
    /// Module -> the modules it names.
    pub edges: BTreeMap<String, BTreeSet<String>>,
}

impl ModuleGraph {
    /// Reads the crate whose sources are in `src` (its `lib.rs` is the root).
    pub fn read(src: &Path) -> std::io::Result<ModuleGraph> {
        let mut files = BTreeMap::new();
        collect(src, src, &mut files)?;
        // File module -> its code, by the module it is written in (the
        // file's own, or an inline module inside it).
        let mut texts = BTreeMap::new();
        for (m, f) in &files {
            texts.insert(m.clone(), scopes(&strip(&std::fs::read_to_string(f)?), m));
        }
        // Re-exports: (module, name) -> the module the name comes from.
        let modules: BTreeSet<String> = files.keys().cloned().collect();
        let mut reexports: BTreeMap<(String, String), String> = BTreeMap::new();
        for (scope, text) in texts.values().flatten() {
            for (path, alias, public) in use_paths(text) {
                if !public {
                    continue;
                }
                let Some((target, rest)) = resolve(scope, &path, &modules) else {
                    continue;
                };
                let name = alias.or_else(|| path.last().cloned());
                if let (Some(name), true) = (name, rest.len() == 1) {
                    reexports.insert((scope.clone(), name), target);
                }
            }
        }
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (m, parts) in &texts {
            let mut out = BTreeSet::new();
            for (scope, text) in parts {
                let add = |path: &[String], out: &mut BTreeSet<String>| {
                    if let Some((target, rest)) = resolve(scope, path, &modules) {
                        let target = file_module(&follow(&reexports, target, rest), &modules);
                        if target != *m {
                            out.insert(target);
                        }
                    }
                };
                for (path, _, public) in use_paths(text) {
                    // A facade's own re-exports are not its dependencies.
                    if public
                        && reexports.contains_key(&(
                            scope.clone(),
                            path.last().cloned().unwrap_or_default(),
                        ))
                    {
                        continue;
                    }
                    add(&path, &mut out);
                }
                for path in code_paths(&without_uses(text), scope, &modules) {
                    add(&path, &mut out);
                }
            }
            edges.insert(m.clone(), out);
        }
        Ok(ModuleGraph { files, edges })
    }

    /// The cycles: sets of two or more modules that name each other,
    /// through any path (strongly connected components), each sorted.
    pub fn cycles(&self) -> Vec<Vec<String>> {
        let nodes: Vec<&String> = self.files.keys().collect();
        let index: BTreeMap<&String, usize> =
            nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let adj: Vec<Vec<usize>> = nodes
            .iter()
            .map(|n| {
                self.edges
                    .get(*n)
                    .into_iter()
                    .flatten()
                    .filter_map(|t| index.get(t).copied())
                    .collect()
            })
            .collect();
        let mut sccs = tarjan(&adj);
        sccs.retain(|c| c.len() > 1);
        let mut out: Vec<Vec<String>> = sccs
            .into_iter()
            .map(|c| {
                let mut v: Vec<String> = c.into_iter().map(|i| display(nodes[i])).collect();
                v.sort();
                v
            })
            .collect();
        out.sort();
        out
    }
}

/// Follows re-exports from `target` along `rest` to where the name is
/// defined.
fn follow(
    reexports: &BTreeMap<(String, String), String>,
    mut target: String,
    mut rest: Vec<String>,
) -> String {
    let mut seen = 0;
    while let Some(first) = rest.first() {
        match reexports.get(&(target.clone(), first.clone())) {
            Some(t) if seen < 8 && *t != target => {
                target = t.clone();
                rest = rest[1..].to_vec();
                seen += 1;
            }
            _ => break,
        }
    }
    target
}

/// The file module that holds `module`: itself, or for an inline module the
/// file it is written in (the longest prefix that is a file module).
fn file_module(module: &str, modules: &BTreeSet<String>) -> String {
    let mut parts: Vec<&str> = module.split("::").collect();
    while !parts.is_empty() && !modules.contains(&parts.join("::")) {
        parts.pop();
    }
    parts.join("::")
}

/// The code of a file module `module`, split by the module it is written
/// in: the file's own code (inline modules blanked out), then each inline
/// module's (`mod name { ... }`, nested ones in turn) as `module::name`.
fn scopes(text: &str, module: &str) -> Vec<(String, String)> {
    let mut own = String::with_capacity(text.len());
    let mut inner = Vec::new();
    let mut rest = text;
    while let Some((at, name, open)) = inline_mod(rest) {
        let mut depth = 0;
        let mut close = rest.len();
        for (k, c) in rest[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = open + k;
                        break;
                    }
                }
                _ => {}
            }
        }
        own.push_str(&rest[..at]);
        own.push(' ');
        let scope = if module.is_empty() {
            name
        } else {
            format!("{module}::{name}")
        };
        inner.extend(scopes(&rest[(open + 1).min(close)..close], &scope));
        rest = &rest[(close + 1).min(rest.len())..];
    }
    own.push_str(rest);
    let mut out = vec![(module.to_owned(), own)];
    out.extend(inner);
    out
}

/// The first inline module of `text`: where `mod` starts, its name, and
/// where its `{` is.
fn inline_mod(text: &str) -> Option<(usize, String, usize)> {
    let mut search = 0;
    while let Some(found) = text[search..].find("mod ") {
        let at = search + found;
        search = at + 4;
        if at > 0 && text[..at].chars().next_back().is_some_and(ident_char) {
            continue;
        }
        let after = &text[at + 4..];
        let name_len = after
            .trim_start()
            .find(|c: char| !ident_char(c))
            .unwrap_or(0);
        let skipped = after.len() - after.trim_start().len();
        let name = &after[skipped..skipped + name_len];
        let next = after[skipped + name_len..].trim_start();
        if !name.is_empty() && next.starts_with('{') {
            let open = text.len() - next.len();
            return Some((at, name.to_owned(), open));
        }
    }
    None
}

fn display(m: &str) -> String {
    if m.is_empty() {
        "crate".to_owned()
    } else {
        m.to_owned()
    }
}

/// Files under `dir` as modules of the crate rooted at `src`.
fn collect(src: &Path, dir: &Path, out: &mut BTreeMap<String, PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.path());
    for e in entries {
        let p = e.path();
        let name = p
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        if p.is_dir() {
            // Binaries and tests are other crates or test code.
            if name == "bin" && dir == src || name == "tests" {
                continue;
            }
            collect(src, &p, out)?;
            continue;
        }
        let Some(stem) = name.strip_suffix(".rs") else {
            continue;
        };
        if stem == "tests" || (dir == src && stem == "main") {
            continue;
        }
        let rel = p.strip_prefix(src).expect("under src");
        let mut parts: Vec<String> = rel
            .parent()
            .into_iter()
            .flat_map(|d| d.components())
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if !(stem == "lib" && dir == src) && stem != "mod" {
            parts.push(stem.to_owned());
        }
        out.insert(parts.join("::"), p);
    }
    Ok(())
}

/// The text without comments, string and char literals, and test blocks.
fn strip(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 0;
                while i < b.len() {
                    if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                        depth += 1;
                        i += 2;
                    } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            }
            b'r' if (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
                && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')) =>
            {
                // A raw string: r"...", r#"..."#.
                let mut j = i + 1;
                let mut hashes = 0;
                while b.get(j) == Some(&b'#') {
                    hashes += 1;
                    j += 1;
                }
                if b.get(j) != Some(&b'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                j += 1;
                'raw: while j < b.len() {
                    if b[j] == b'"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&b'#')) {
                        j += 1 + hashes;
                        break 'raw;
                    }
                    j += 1;
                }
                out.push_str("\"\"");
                i = j;
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
                out.push_str("\"\"");
            }
            b'\'' => {
                // A char literal ('a', '\n', '\u{..}') or a lifetime ('a).
                let end = if b.get(i + 1) == Some(&b'\\') {
                    b[i + 2..]
                        .iter()
                        .position(|c| *c == b'\'')
                        .map(|p| i + 2 + p)
                } else if b.get(i + 2) == Some(&b'\'') {
                    Some(i + 2)
                } else {
                    None
                };
                match end {
                    Some(e) => {
                        out.push_str("' '");
                        i = e + 1;
                    }
                    None => {
                        out.push('\'');
                        i += 1;
                    }
                }
            }
            c => {
                out.push(c as char);
                i += 1;
            }
        }
    }
    drop_test_blocks(&out)
}

/// Removes `#[cfg(test)] mod name { ... }` blocks.
fn drop_test_blocks(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        let is_mod = trimmed.starts_with("mod ") || trimmed.starts_with("pub mod ");
        let brace = trimmed.find('{');
        let semi = trimmed.find(';');
        match (is_mod, brace, semi) {
            (true, Some(bpos), s) if s.is_none_or(|s| bpos < s) => {
                let start = after.len() - trimmed.len() + bpos;
                let mut depth = 0;
                let mut end = after.len();
                for (k, c) in after[start..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = start + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                rest = &after[end..];
            }
            _ => {
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path of the `use` items of `text`, expanded (`a::{b, c::d}` gives
/// `a::b` and `a::c::d`), with its `as` alias and whether the item is `pub`.
fn use_paths(text: &str) -> Vec<(Vec<String>, Option<String>, bool)> {
    let mut out = Vec::new();
    let mut search = 0;
    while let Some(found) = text[search..].find("use ") {
        let at = search + found;
        search = at + 4;
        if at > 0 && text[..at].chars().next_back().is_some_and(ident_char) {
            continue;
        }
        let before = text[..at].trim_end();
        let line_start = before
            .rfind([';', '}', '{', ']'])
            .map(|p| p + 1)
            .unwrap_or(0);
        let vis = before[line_start..].trim();
        let public = vis.starts_with("pub");
        if !vis.is_empty() && !public {
            continue;
        }
        let Some(end) = text[at..].find(';') else {
            break;
        };
        let tree: String = text[at + 4..at + end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        expand(&tree, &mut Vec::new(), &mut |p, alias| {
            out.push((p, alias, public))
        });
    }
    out
}

/// Expands a use tree into paths (`prefix` so far).
fn expand(tree: &str, prefix: &mut Vec<String>, emit: &mut dyn FnMut(Vec<String>, Option<String>)) {
    let tree = tree.trim().trim_start_matches("::");
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim_end_matches("::").trim();
        let n = prefix.len();
        prefix.extend(
            head.split("::")
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty()),
        );
        let close = tree.rfind('}').unwrap_or(tree.len());
        let inner = &tree[open + 1..close];
        let mut depth = 0;
        let mut start = 0;
        for (k, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&inner[start..k], prefix, emit);
                    start = k + 1;
                }
                _ => {}
            }
        }
        expand(&inner[start..], prefix, emit);
        prefix.truncate(n);
        return;
    }
    if tree.is_empty() {
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((p, a)) => (p.trim(), Some(a.trim().to_owned())),
        None => (tree, None),
    };
    let mut full = prefix.clone();
    full.extend(
        path.split("::")
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty()),
    );
    // `a::{self}` names `a`.
    if full.last().is_some_and(|s| s == "self") {
        full.pop();
    }
    emit(full, alias);
}

/// The text with its `use` items blanked (their paths are read by
/// [`use_paths`]).
fn without_uses(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(found) = rest.find("use ") {
        let starts_item = found == 0 || !rest[..found].chars().next_back().is_some_and(ident_char);
        let end = rest[found..].find(';').map(|e| found + e + 1);
        match (starts_item, end) {
            (true, Some(end)) => {
                out.push_str(&rest[..found]);
                rest = &rest[end..];
            }
            _ => {
                out.push_str(&rest[..found + 4]);
                rest = &rest[found + 4..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Paths in code: `crate::a::b`, `super::x`, `self::y`, and `child::z` for
/// a child module of `module`.
fn code_paths(text: &str, module: &str, modules: &BTreeSet<String>) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if !ident_char(chars[i]) || (i > 0 && (ident_char(chars[i - 1]) || chars[i - 1] == ':')) {
            i += 1;
            continue;
        }
        let mut segs = Vec::new();
        let mut j = i;
        loop {
            let s = j;
            while j < chars.len() && ident_char(chars[j]) {
                j += 1;
            }
            segs.push(chars[s..j].iter().collect::<String>());
            if j + 2 < chars.len()
                && chars[j] == ':'
                && chars[j + 1] == ':'
                && ident_char(chars[j + 2])
            {
                j += 2;
            } else {
                break;
            }
        }
        if segs.len() > 1 {
            let first = segs[0].as_str();
            let child = if module.is_empty() {
                first.to_owned()
            } else {
                format!("{module}::{first}")
            };
            if matches!(first, "crate" | "super" | "self") || modules.contains(&child) {
                out.push(segs);
            }
        }
        i = j.max(i + 1);
    }
    out
}

/// The module a path in `module` names, and the segments after it; `None`
/// for a path outside the crate.
fn resolve(
    module: &str,
    path: &[String],
    modules: &BTreeSet<String>,
) -> Option<(String, Vec<String>)> {
    let mut cur: Vec<String> = if module.is_empty() {
        Vec::new()
    } else {
        module.split("::").map(str::to_owned).collect()
    };
    let mut k = 0;
    match path.first()?.as_str() {
        "crate" => {
            cur.clear();
            k = 1;
        }
        "self" => k = 1,
        "super" => {
            while path.get(k).is_some_and(|s| s == "super") {
                cur.pop()?;
                k += 1;
            }
        }
        first => {
            let mut child = cur.clone();
            child.push(first.to_owned());
            if !modules.contains(&child.join("::")) {
                return None;
            }
        }
    }
    while let Some(seg) = path.get(k) {
        let mut next = cur.clone();
        next.push(seg.clone());
        if modules.contains(&next.join("::")) {
            cur = next;
            k += 1;
        } else {
            break;
        }
    }
    Some((cur.join("::"), path[k..].to_vec()))
}

/// Strongly connected components (Tarjan).
fn tarjan(adj: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct St<'a> {
        adj: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut St<'_>, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on[v] = true;
        for &w in &s.adj[v] {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut c = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on[w] = false;
                c.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(c);
        }
    }
    let n = adj.len();
    let mut s = St {
        adj,
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(name: &str, files: &[(&str, &str)]) -> ModuleGraph {
        let dir = crate::TempDir::new(&format!("modgraph-{name}"));
        for (p, text) in files {
            let path = dir.join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        ModuleGraph::read(&dir).unwrap()
    }

    #[test]
    fn sibling_and_parent_cycles_are_found_and_layers_are_not() {
        let g = graph(
            "layers",
            &[
                ("lib.rs", "mod a;\nmod b;\nmod c;\npub use a::A;\n"),
                ("a.rs", "use crate::b::B;\npub struct A;\n"),
                ("b.rs", "pub struct B;\nfn f() { crate::a::g(); }\n"),
                (
                    "c.rs",
                    "use crate::A; // via the re-export: a\nuse std::fmt;\n",
                ),
            ],
        );
        assert_eq!(g.cycles(), [vec!["a".to_owned(), "b".to_owned()]]);
        assert_eq!(g.edges["c"], ["a".to_owned()].into());
        assert!(g.edges[""].is_empty(), "re-exports are a facade");
    }

    #[test]
    fn test_code_comments_and_strings_are_not_edges() {
        let g = graph("test-code", &[
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "pub fn f() {}\n#[cfg(test)]\nmod tests {\n use crate::b::*;\n fn t() { crate::b::g(); }\n}\n"),
            ("b.rs", "use crate::a::f; // crate::a\nconst S: &str = \"crate::a::zz\";\n"),
            ("a/tests.rs", "use crate::b::g;\n"),
        ]);
        assert!(g.cycles().is_empty(), "{:?}", g.edges);
    }

    #[test]
    fn nested_use_trees_children_and_super_are_read() {
        let g = graph(
            "nested",
            &[
                ("lib.rs", "mod x;\nmod y;\n"),
                ("x/mod.rs", "mod inner;\nfn f() { inner::go(); }\n"),
                (
                    "x/inner.rs",
                    "use super::super::{y::{self, Z}};\npub fn go() {}\n",
                ),
                ("y.rs", "pub struct Z;\nfn h() { crate::x::f(); }\n"),
            ],
        );
        assert_eq!(g.edges["x"], ["x::inner".to_owned()].into());
        assert_eq!(g.edges["x::inner"], ["y".to_owned()].into());
        assert_eq!(
            g.cycles(),
            [vec!["x".to_owned(), "x::inner".to_owned(), "y".to_owned()]]
        );
    }
    #[test]
    fn inline_modules_are_read_from_where_they_are() {
        let g = graph(
            "inline",
            &[
                ("lib.rs", "pub mod p;\n"),
                (
                    "p/mod.rs",
                    "pub mod w;\npub mod s;\nimpl T for w::A {}\n",
                ),
                // `super::` in an inline module names the file's own module.
                (
                    "p/w.rs",
                    "pub struct A { k: a::K }\npub struct B;\npub mod a {\n pub enum K { B(super::B) }\n pub mod deep { use super::super::B; }\n}\n",
                ),
                // One `super::` too many for the inline module: the parent.
                ("p/s.rs", "pub mod m {\n fn f() { super::super::g(); }\n}\n"),
            ],
        );
        assert!(g.cycles().is_empty(), "{:?}", g.edges);
        assert!(g.edges["p::w"].is_empty(), "{:?}", g.edges);
        assert_eq!(g.edges["p::s"], ["p".to_owned()].into());
        assert_eq!(
            g.edges["p"],
            ["p::w".to_owned()].into(),
            "children named in code are edges"
        );
    }
}
