//! The bridge's modules import each other without a circle and only downwards through the
//! layer table in the crate docs (`src/lib.rs`, "Modules and which way they depend"), the same
//! rule `server-runtime/tests/module_layers.rs` holds that crate to.
//!
//! The sources are read at test time: every `crate::<module>` in a file's code (comments,
//! string and char literals and `#[cfg(test)]` items left out) is an edge from that file's
//! module to the named one. `lib.rs` is the facade and not checked.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn src() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The code with comments and string/char literals blanked (newlines kept).
fn strip(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let (c, next) = (chars[i], chars.get(i + 1).copied());
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r'
            && matches!(next, Some('"' | '#'))
            && !(i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_'))
        {
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            while j < chars.len() {
                if chars[j] == '"' && (0..hashes).all(|h| chars.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                out.push(blank(chars[j]));
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                if let Some(&inner) = chars.get(i) {
                    out.push(blank(inner));
                }
                i += 1;
            }
            out.push_str("\"\"");
            i += 1;
        } else if c == '\'' && next == Some('\\') {
            let mut j = i + 2;
            while j < chars.len() && chars[j] != '\'' {
                j += 1;
            }
            out.push_str("' '");
            i = j + 1;
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            out.push_str("' '");
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The code without `#[cfg(test)]` items (a `mod tests { ... }` or a `mod x;`).
fn without_tests(code: &str) -> String {
    let mut code: Vec<char> = code.chars().collect();
    let marker: Vec<char> = "#[cfg(test)]".chars().collect();
    let mut i = 0;
    while i + marker.len() <= code.len() {
        if code[i..i + marker.len()] != marker[..] {
            i += 1;
            continue;
        }
        let start = i;
        let mut j = i + marker.len();
        while j < code.len() && code[j] != '{' && code[j] != ';' {
            j += 1;
        }
        if code.get(j) == Some(&'{') {
            let mut depth = 0;
            while j < code.len() {
                match code[j] {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        let end = (j + 1).min(code.len());
        for c in &mut code[start..end] {
            if *c != '\n' {
                *c = ' ';
            }
        }
        i = end;
    }
    code.into_iter().collect()
}

/// Every module named after `crate::` in `code`, including in `use crate::{a, b::c}` groups.
fn imports(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
    };
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = group.split('}').next().unwrap_or_default();
            for item in inner.split(',') {
                let name = ident(item.trim());
                if !name.is_empty() {
                    found.insert(name);
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

/// The layer table of `lib.rs`: each module's row, 0 at the top.
fn layers() -> BTreeMap<String, usize> {
    let lib = read(&src().join("lib.rs"));
    let table = lib
        .split("## Modules and which way they depend")
        .nth(1)
        .unwrap_or_else(|| panic!("lib.rs has no section \"Modules and which way they depend\""));
    let mut rows = BTreeMap::new();
    let mut row = 0;
    for line in table.lines().map(|l| l.trim_start_matches("//!").trim()) {
        if line.starts_with("```") || (line.starts_with("##") && !rows.is_empty()) {
            break;
        }
        let Some(cell) = line.strip_prefix('|').and_then(|l| l.split('|').next()) else {
            continue;
        };
        let names: Vec<&str> = cell.split('`').skip(1).step_by(2).collect();
        if names.is_empty() {
            continue;
        }
        for name in names {
            rows.insert(name.to_owned(), row);
        }
        row += 1;
    }
    rows
}

#[test]
fn module_layer_rule_no_circle_and_no_upward_import_in_the_bridge() {
    let layers = layers();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for entry in std::fs::read_dir(src()).unwrap_or_else(|e| panic!("read src: {e}")) {
        let path = entry.unwrap_or_else(|e| panic!("entry: {e}")).path();
        let Some(name) = path.file_stem().map(|s| s.to_string_lossy().into_owned()) else {
            continue;
        };
        if name == "lib" || path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let code = without_tests(&strip(&read(&path)));
        let mut used = imports(&code);
        used.remove(&name);
        graph.insert(name, used);
    }
    let mut problems = Vec::new();
    for (module, used) in &graph {
        let Some(&row) = layers.get(module) else {
            problems.push(format!("`{module}` is not in the layer table of lib.rs"));
            continue;
        };
        for target in used {
            match layers.get(target) {
                Some(&below) if below > row => {}
                Some(&other) => problems.push(format!(
                    "`{module}` (row {row}) imports `{target}` (row {other}): only rows below may be imported"
                )),
                None if graph.contains_key(target) => {
                    problems.push(format!("`{target}` is not in the layer table of lib.rs"))
                }
                None => {}
            }
        }
    }
    // A circle, named, even if the table were changed to allow it.
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        circles: &mut Vec<String>,
    ) {
        if let Some(start) = path.iter().position(|p| p == node) {
            let mut circle = path[start..].to_vec();
            circle.push(node.to_owned());
            circles.push(circle.join(" -> "));
            return;
        }
        if !done.insert(node.to_owned()) {
            return;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            visit(next, graph, path, done, circles);
        }
        path.pop();
    }
    let mut done = BTreeSet::new();
    let mut circles = Vec::new();
    for module in graph.keys() {
        visit(module, &graph, &mut Vec::new(), &mut done, &mut circles);
    }
    problems.extend(circles.into_iter().map(|c| format!("import circle: {c}")));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(graph.contains_key("link") && graph.contains_key("server"), "{graph:?}");
}

#[test]
fn module_layer_rule_the_checker_sees_code_not_comments_or_strings() {
    let code = without_tests(&strip(
        "use crate::{inbox::Inbox, files};\n// crate::server\nlet s = \"crate::link\";\nfn f() { crate::uris::channel_uri(\"x\"); }\n#[cfg(test)]\nmod tests { use crate::server; }\n",
    ));
    let found: Vec<String> = imports(&code).into_iter().collect();
    assert_eq!(found, ["files", "inbox", "uris"]);
}
