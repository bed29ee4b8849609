//! The direction between the top-level modules of `src/` is data, not memory: every
//! `crate::` path in `src/` (a `use crate::…` or a path written inline) is an import of one
//! top-level module by another, and each must be a line of `tests/layering/allowed.txt`.
//! This test fails on an import not in that table, on a cycle (in the table or in the code),
//! on a module of `src/` that has no line in the table, and when the crate doc's map
//! (`src/lib.rs`) says otherwise than the table.
//!
//! Test code is not counted (as `../shared/tools/layers.py` does not count it): `tests.rs`,
//! `*_tests.rs`, files under a `tests/` folder, and `#[cfg(test)] mod … { … }` blocks.
//! Comments (doc comments included) are not imports either.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use common::rust_files;

type Edges = BTreeMap<(String, String), BTreeSet<String>>;

const ALLOWED: &str = include_str!("layering/allowed.txt");

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The top-level modules: `src/<name>.rs` and `src/<name>/` (not `lib.rs`, `main.rs`).
fn top_modules(src: &Path) -> BTreeSet<String> {
    let mut mods = BTreeSet::new();
    for e in std::fs::read_dir(src).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if e.path().is_dir() {
            mods.insert(name);
        } else if let Some(m) = name.strip_suffix(".rs") {
            if m != "lib" && m != "main" {
                mods.insert(m.to_string());
            }
        }
    }
    mods
}

fn is_test_file(rel: &Path) -> bool {
    let name = rel.file_name().unwrap().to_string_lossy();
    name == "tests.rs"
        || name.ends_with("_tests.rs")
        || rel
            .parent()
            .is_some_and(|p| p.components().any(|c| c.as_os_str() == "tests"))
}

/// `text` without `//` comments and without `#[cfg(test)] mod name { … }` blocks.
fn strip(text: &str) -> String {
    let no_comments: String = text
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = String::new();
    let mut rest = no_comments.as_str();
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        let after = &rest[i + "#[cfg(test)]".len()..];
        let t = after.trim_start();
        let is_mod_block = t.strip_prefix("mod ").is_some_and(|m| {
            let m = m.trim_start();
            let name_len = m
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(m.len());
            m[name_len..].trim_start().starts_with('{')
        });
        if !is_mod_block {
            out.push_str("#[cfg(test)]");
            rest = after;
            continue;
        }
        let open = after.find('{').unwrap();
        let mut depth = 0usize;
        let mut end = after.len();
        for (j, c) in after[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + j + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

fn ident_at(s: &str) -> &str {
    let s = s.trim_start();
    let n = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..n]
}

/// The top-level names a file's code reaches through `crate::`: `crate::a::…` and each item
/// of `crate::{a, b::c, …}`.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        // `vgate_crate::` or `$crate::` are other things.
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1usize;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 1 => {
                        found.insert(ident_at(&item).to_string());
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
                if depth == 1 {
                    item.push(c);
                }
            }
            found.insert(ident_at(&item).to_string());
        } else {
            found.insert(ident_at(rest).to_string());
        }
    }
    found.remove("");
    found
}

/// Every import between top-level modules, with the files that make it.
fn edges(src: &Path) -> Edges {
    let mods = top_modules(src);
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut e = Edges::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap();
        if rel.components().count() == 1
            && (rel == Path::new("lib.rs") || rel == Path::new("main.rs"))
        {
            continue;
        }
        if is_test_file(rel) {
            continue;
        }
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let me = first.strip_suffix(".rs").unwrap_or(&first).to_string();
        let code = strip(&std::fs::read_to_string(&f).unwrap());
        for to in crate_paths(&code) {
            if to != me && mods.contains(&to) {
                e.entry((me.clone(), to))
                    .or_default()
                    .insert(rel.display().to_string());
            }
        }
    }
    e
}

/// The table: each module with what it may import (a module listed with `a ->` imports
/// nothing).
fn parse_allowed(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut t: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap().trim();
        let Some((from, to)) = line.split_once("->") else {
            assert!(line.is_empty(), "allowed.txt: not `from -> to`: {line:?}");
            continue;
        };
        let deps = t.entry(from.trim().to_string()).or_default();
        if !to.trim().is_empty() {
            deps.insert(to.trim().to_string());
        }
    }
    t
}

/// A cycle of `graph`, if it has one (as a path that starts and ends on the same module).
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(n) {
            Some(2) => return None,
            Some(1) => {
                let start = path.iter().position(|p| p == n).unwrap();
                let mut c = path[start..].to_vec();
                c.push(n.to_string());
                return Some(c);
            }
            _ => {}
        }
        state.insert(n.to_string(), 1);
        path.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, state, path) {
                return Some(c);
            }
        }
        path.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        if let Some(c) = visit(n, graph, &mut state, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

/// What is wrong with `found` against `allowed`, one line per problem.
fn violations(found: &Edges, allowed: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut bad = Vec::new();
    for ((from, to), files) in found {
        if !allowed.get(from).is_some_and(|d| d.contains(to)) {
            let files: Vec<_> = files.iter().take(3).cloned().collect();
            bad.push(format!(
                "{from} -> {to} is not in tests/layering/allowed.txt ({})",
                files.join(", ")
            ));
        }
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in found.keys() {
        graph.entry(from.clone()).or_default().insert(to.clone());
    }
    if let Some(c) = find_cycle(&graph) {
        bad.push(format!("the code has a cycle: {}", c.join(" -> ")));
    }
    if let Some(c) = find_cycle(allowed) {
        bad.push(format!("the table has a cycle: {}", c.join(" -> ")));
    }
    bad
}

#[test]
fn imports_between_modules_follow_the_table() {
    let src = src_dir();
    let allowed = parse_allowed(ALLOWED);
    let found = edges(&src);
    assert!(
        found.len() > 20,
        "the checker found only {} imports: it no longer reads src/",
        found.len()
    );
    let bad = violations(&found, &allowed);
    assert!(bad.is_empty(), "layering broken:\n{}", bad.join("\n"));
    for m in top_modules(&src) {
        assert!(
            allowed.contains_key(&m),
            "src/{m} has no line in tests/layering/allowed.txt: decide its layer (`{m} ->` for a leaf)"
        );
    }
}

/// The crate doc's map: rows `//! | `name` | what it owns | `a`, `b` |` (or `—`).
fn doc_map(lib: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut t = BTreeMap::new();
    for line in lib.lines() {
        let Some(row) = line.strip_prefix("//! | `") else {
            continue;
        };
        let cells: Vec<&str> = row.split('|').collect();
        let name = cells[0].trim().trim_end_matches('`').to_string();
        let deps = cells[cells.len() - 2]
            .split(',')
            .map(|d| d.trim().trim_matches('`').to_string())
            .filter(|d| !d.is_empty() && d != "—")
            .collect();
        t.insert(name, deps);
    }
    t
}

#[test]
fn the_crate_doc_map_is_the_table() {
    let lib = std::fs::read_to_string(src_dir().join("lib.rs")).unwrap();
    let doc = doc_map(&lib);
    let table = parse_allowed(ALLOWED);
    assert!(!doc.is_empty(), "src/lib.rs has no layer map");
    for (m, deps) in &table {
        assert_eq!(
            doc.get(m),
            Some(deps),
            "src/lib.rs's map and tests/layering/allowed.txt differ for `{m}`"
        );
    }
    for m in doc.keys() {
        assert!(table.contains_key(m), "`{m}` is in src/lib.rs's map only");
    }
}

/// The checker itself: a forbidden import and a cycle are found, test code is not read.
#[test]
fn the_checker_fails_on_a_forbidden_edge_and_a_cycle() {
    let allowed = parse_allowed("wire ->\nroutes -> wire\nengine -> routes\nengine -> wire\n");
    let mut found = Edges::new();
    found
        .entry(("routes".into(), "wire".into()))
        .or_default()
        .insert("src/routes/mod.rs".into());
    assert!(violations(&found, &allowed).is_empty());
    // The fake edge: the tables reaching into an engine.
    found
        .entry(("routes".into(), "engine".into()))
        .or_default()
        .insert("src/routes/mod.rs".into());
    found
        .entry(("engine".into(), "routes".into()))
        .or_default()
        .insert("src/engine/mod.rs".into());
    let bad = violations(&found, &allowed);
    for want in ["routes -> engine is not", "the code has a cycle"] {
        assert!(bad.iter().any(|b| b.starts_with(want)), "{want}: {bad:?}");
    }
    let cyclic = parse_allowed("a -> b\nb -> a\n");
    assert!(find_cycle(&cyclic).is_some());

    let code = strip(
        "use crate::wire::rtp;\nuse crate::{routes::{Routes, legs}, stats};\n\
         // use crate::engine;\n/// [`crate::edge`]\nlet x = crate::clock::now_ms();\n\
         #[cfg(test)]\nmod tests {\n    use crate::gateway;\n    fn f() { {} }\n}\n\
         #[cfg(test)]\nuse crate::demo;\n",
    );
    let paths = crate_paths(&code);
    let want: BTreeSet<String> = ["wire", "routes", "stats", "clock", "demo"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        paths, want,
        "a #[cfg(test)] item other than a mod block still counts"
    );
}
