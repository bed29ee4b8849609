//! The docs keep up with the code: every drop reason and every `check-config` message has its
//! line in docs/troubleshooting.md, and every relative link of the README and docs/ leads to a
//! file (and to a heading of it, when it names one). A new reason or check without its doc line fails here, not in front of an operator.

mod common;

use std::path::{Path, PathBuf};

use common::rust_files;
use vgate::stats::link::LinkDrop;
use vgate::stats::DropReason;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Runs of whitespace as one space, so a doc may wrap a message anywhere.
fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn troubleshooting() -> String {
    read(&repo().join("docs/troubleshooting.md"))
}

#[test]
fn every_drop_reason_has_a_row_in_troubleshooting() {
    let doc = troubleshooting();
    let (channel, link) = doc
        .split_once("### Link drops")
        .expect("docs/troubleshooting.md has a `### Link drops` section");
    let row = |name: &str| format!("| `{name}` |");
    let mut missing: Vec<String> = DropReason::ALL
        .iter()
        .map(|r| r.name())
        .filter(|n| !channel.contains(&row(n)))
        .map(|n| format!("drop reason `{n}`"))
        .collect();
    missing.extend(
        LinkDrop::ALL
            .iter()
            .map(|r| r.name())
            .filter(|n| !link.contains(&row(n)))
            .map(|n| format!("link drop reason `{n}` (under ### Link drops)")),
    );
    assert!(
        missing.is_empty(),
        "docs/troubleshooting.md has no row `| `NAME` | what it means | what to do |` for: {}",
        missing.join(", ")
    );
}

/// The string literals of Rust source, comments and `#[cfg(test)] mod tests` left out, escapes
/// resolved (a `\` line continuation drops the newline and the next line's indent).
fn string_literals(src: &str) -> Vec<String> {
    let src = match src.find("#[cfg(test)]\nmod tests") {
        Some(i) => &src[..i],
        None => src,
    };
    let b: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            '/' if b.get(i + 1) == Some(&'/') => {
                while i < b.len() && b[i] != '\n' {
                    i += 1;
                }
            }
            '/' if b.get(i + 1) == Some(&'*') => {
                i += 2;
                while i + 1 < b.len() && !(b[i] == '*' && b[i + 1] == '/') {
                    i += 1;
                }
                i += 2;
            }
            // A char literal ('"', '\\', 'x'), or a lifetime, which has no closing quote.
            '\'' => {
                if b.get(i + 1) == Some(&'\\') {
                    i += 3;
                    while i < b.len() && b[i] != '\'' {
                        i += 1;
                    }
                    i += 1;
                } else if b.get(i + 2) == Some(&'\'') {
                    i += 3;
                } else {
                    i += 1;
                }
            }
            '"' => {
                let mut s = String::new();
                i += 1;
                while i < b.len() && b[i] != '"' {
                    if b[i] == '\\' {
                        match b.get(i + 1) {
                            Some('\n') => {
                                i += 2;
                                while i < b.len() && (b[i] == ' ' || b[i] == '\t') {
                                    i += 1;
                                }
                                continue;
                            }
                            Some('n') => s.push('\n'),
                            Some('t') => s.push('\t'),
                            Some(c) => s.push(*c),
                            None => {}
                        }
                        i += 2;
                    } else {
                        s.push(b[i]);
                        i += 1;
                    }
                }
                out.push(s);
                i += 1;
            }
            _ => i += 1,
        }
    }
    out
}

/// The text of a message between its `{...}` placeholders.
fn fragments(message: &str) -> Vec<String> {
    let mut frags = vec![String::new()];
    let mut depth = 0;
    for c in message.chars() {
        match c {
            '{' => {
                depth += 1;
                if depth == 1 {
                    frags.push(String::new());
                }
            }
            '}' if depth > 0 => depth -= 1,
            _ if depth == 0 => frags.last_mut().expect("never empty").push(c),
            _ => {}
        }
    }
    frags
}

/// The files that check the config: they place errors in the file (`Spanned`) and return the
/// config's `Invalid`. Found by content, so moving them does not lose them.
fn config_check_files() -> Vec<PathBuf> {
    let mut all = Vec::new();
    rust_files(&repo().join("src"), &mut all);
    let mut files: Vec<PathBuf> = all
        .into_iter()
        .filter(|p| !p.ends_with("config/tests.rs"))
        .filter(|p| {
            let t = read(p);
            t.contains("Spanned") && t.contains("Invalid")
        })
        .collect();
    files.sort();
    files
}

#[test]
fn every_check_config_message_is_in_troubleshooting() {
    let files = config_check_files();
    assert!(
        files.len() >= 2,
        "found only {files:?} as config checks (files using Spanned and Invalid)"
    );
    let doc = squash(&troubleshooting());
    let mut checked = 0;
    let mut missing = Vec::new();
    for f in &files {
        for lit in string_literals(&read(f)) {
            // Messages are sentences; keys, values and format pieces are not.
            let text: String = fragments(&lit).concat();
            if text.matches(' ').count() < 3 {
                continue;
            }
            let trim: &[char] = &[' ', ';', ':', ',', '.', '(', ')'];
            let longest = fragments(&lit)
                .iter()
                .map(|s| squash(s.trim_matches(trim)))
                .max_by_key(|s| s.len())
                .unwrap_or_default();
            checked += 1;
            if !doc.contains(&longest) {
                missing.push(format!(
                    "{}: {lit:?} (looked for {longest:?})",
                    f.strip_prefix(repo()).unwrap_or(f).display()
                ));
            }
        }
    }
    assert!(
        checked >= 50,
        "only {checked} check-config messages found: did the checks move out of files that use Spanned and Invalid?"
    );
    assert!(
        missing.is_empty(),
        "check-config messages without their line in docs/troubleshooting.md (quote the message, say what to do):\n{}",
        missing.join("\n")
    );
}

/// The anchors GitHub gives a page's headings: lower case, spaces as `-`, punctuation dropped.
fn headings(page: &str) -> Vec<String> {
    let mut in_code = false;
    page.lines()
        .filter(|l| {
            if l.starts_with("```") {
                in_code = !in_code;
            }
            !in_code && l.starts_with('#')
        })
        .map(|l| {
            l.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect()
        })
        .collect()
}

#[test]
fn relative_links_of_the_readme_and_docs_lead_to_files() {
    let mut pages = vec![repo().join("README.md")];
    for e in std::fs::read_dir(repo().join("docs")).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "md") {
            pages.push(e.path());
        }
    }
    let mut broken = Vec::new();
    for page in &pages {
        let text = read(page);
        for (i, _) in text.match_indices("](") {
            let rest = &text[i + 2..];
            let Some(end) = rest.find(')') else { continue };
            let target = &rest[..end];
            if target.starts_with("http") || target.contains(' ') {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
            let dir = page.parent().expect("a page is in a directory");
            let file = if path.is_empty() {
                page.clone()
            } else {
                dir.join(path)
            };
            let ok = file.exists()
                && (anchor.is_empty()
                    || file.extension().is_none_or(|x| x != "md")
                    || headings(&read(&file)).iter().any(|h| h == anchor));
            if !ok {
                broken.push(format!(
                    "{}: {target}",
                    page.strip_prefix(repo()).unwrap_or(page).display()
                ));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "links to nothing:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_message_scanner_reads_rust_strings() {
    let src = "let c = '\"'; let q = '\\''; let l: &'a str; // \"not this\"\n/* \"nor this\" */ \
               invalid(x, \"k\", format!(\"port {p} is \\\"in\\\" use; pick \\\n    another\"));\n\
               #[cfg(test)]\nmod tests { \"test text\" }";
    assert_eq!(
        string_literals(src),
        ["k", "port {p} is \"in\" use; pick another"]
    );
    assert_eq!(fragments("a {x} b {{y}} c"), ["a ", " b ", " c"]);
}
