//! The crate's top-level modules form a graph without cycles: no module imports one that
//! imports it back, directly or through others. Read from the sources (comments and
//! `#[cfg(test)]` modules left out), so the check needs no tool beyond `cargo test`.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Removes `//` comments and the bodies of `#[cfg(test)] mod … { … }` blocks.
fn production_code(text: &str) -> String {
    let no_comments: String = text
        .lines()
        .map(|l| match l.find("//") {
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = String::new();
    let mut rest = no_comments.as_str();
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        let Some(open) = after.find('{') else { break };
        let header = &after[..open];
        if !header.contains("mod ") || header.contains(';') {
            // An item other than an inline module: keep it.
            out.push_str("#[cfg(test)]");
            rest = &after["#[cfg(test)]".len()..];
            continue;
        }
        let mut depth = 0usize;
        let mut end = after.len();
        for (j, ch) in after[open..].char_indices() {
            match ch {
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

fn top_module(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.trim_end_matches(".rs").to_string();
    (!matches!(name.as_str(), "lib" | "main" | "testing")).then_some(name)
}

fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            // Test-only directories inside modules.
            if p.file_name().is_some_and(|n| n == "tests") {
                continue;
            }
            walk(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Module → the modules its production code names as `crate::<module>`.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let Some(top) = top_module(&src, &f) else {
            continue;
        };
        let code = production_code(&std::fs::read_to_string(&f).unwrap());
        let entry = g.entry(top.clone()).or_default();
        let mut rest = code.as_str();
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            // `crate::{a::x, b::y}` names several.
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for part in group[..end].split(',') {
                    let m: String = part
                        .trim()
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    if !m.is_empty() && m != top {
                        entry.insert(m);
                    }
                }
                continue;
            }
            let m: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if !m.is_empty() && m != top {
                entry.insert(m);
            }
        }
    }
    g
}

/// Every cycle's modules (strongly connected components with more than one module).
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(n) = stack.pop() {
            for m in g.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    stack.push(m.clone());
                }
            }
        }
        seen
    };
    let mut out: Vec<Vec<String>> = Vec::new();
    let mut placed = BTreeSet::new();
    for n in g.keys() {
        if placed.contains(n) {
            continue;
        }
        let from_n = reach(n);
        let scc: Vec<String> = from_n
            .iter()
            .filter(|m| *m != n && reach(m).contains(n))
            .cloned()
            .chain(std::iter::once(n.clone()))
            .collect();
        if scc.len() > 1 {
            placed.extend(scc.iter().cloned());
            out.push(scc);
        }
    }
    out
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let g = graph();
    assert!(g.len() > 15, "modules found: {:?}", g.keys());
    let found = cycles(&g);
    let detail: Vec<String> = found
        .iter()
        .map(|c| {
            let edges: Vec<String> = c
                .iter()
                .flat_map(|a| {
                    g[a].iter()
                        .filter(|b| c.contains(b))
                        .map(move |b| format!("{a}→{b}"))
                })
                .collect();
            edges.join(" ")
        })
        .collect();
    assert!(found.is_empty(), "module cycles: {detail:#?}");
}

#[test]
fn the_check_finds_a_cycle_and_ignores_comments_and_tests() {
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), ["b".to_string()].into()),
        ("b".to_string(), ["c".to_string()].into()),
        ("c".to_string(), ["a".to_string()].into()),
        ("d".to_string(), ["a".to_string()].into()),
    ]
    .into();
    let found = cycles(&g);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].len(), 3);
    let code = production_code(
        "use crate::x; // crate::y\n#[cfg(test)]\nmod tests {\n    use crate::z;\n    fn f() { {} }\n}\nuse crate::w;",
    );
    assert!(code.contains("crate::x") && code.contains("crate::w"));
    assert!(!code.contains("crate::y") && !code.contains("crate::z"));
}
