//! The module-layer checker of the crates that keep their modules layered (`server-runtime`,
//! `client-runtime`): one copy, used by each crate's `tests/module_layers.rs`.
//!
//! The sources are read at test time: every `crate::...` and `super::...` path in a file's code
//! (comments, strings and `#[cfg(test)]` modules left out) is an edge from that file to the
//! file of the module it names; a path through a facade's re-export (the crate root's
//! `pub use`, a parent's `pub use child::Item`) lands in the file the item comes from. A
//! parent's own `mod x;` and its re-exports of its children are not edges.
//!
//! Two rules: the file graph has no cycle (a failure names the cycle), and a module never
//! imports one listed above it in the layer table (a failure names both and their rows).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A module path inside the crate (`[]` is the crate root, `["state", "lifecycle"]` a file).
type ModPath = Vec<String>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/a/b.rs` is `[a, b]`, `src/a/mod.rs` is `[a]`, `src/lib.rs` is `[]`.
fn module_path(src: &Path, file: &Path) -> ModPath {
    let relative = file.strip_prefix(src).expect("a file under src/");
    let mut parts: Vec<String> =
        relative.iter().map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// The code of a file with comments, string and char literals blanked (newlines kept).
fn strip(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
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
            && (next == Some('"') || next == Some('#'))
            && !chars.get(i.wrapping_sub(1)).is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // A raw string: r"..." or r#"..."#.
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
            loop {
                if j >= chars.len() {
                    break;
                }
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
            out.push('"');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            out.push('"');
            i += 1;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                let mut j = i + 2;
                while j < chars.len() && chars[j] != '\'' {
                    j += 1;
                }
                out.push_str("' '");
                i = j + 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                out.push_str("' '");
                i += 3;
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Blanks every `#[cfg(test)]` module (inline); returns the names of `#[cfg(test)] mod x;`
/// declarations (files that are test code).
fn drop_test_modules(code: &str) -> (String, Vec<String>) {
    let mut code: Vec<char> = code.chars().collect();
    let mut test_files = Vec::new();
    let marker: Vec<char> = "#[cfg(test)]".chars().collect();
    let mut i = 0;
    while i + marker.len() <= code.len() {
        if code[i..i + marker.len()] != marker[..] {
            i += 1;
            continue;
        }
        let start = i;
        let mut j = i + marker.len();
        let word = |j: &mut usize, code: &[char]| -> String {
            while *j < code.len() && code[*j].is_whitespace() {
                *j += 1;
            }
            let begin = *j;
            while *j < code.len() && (code[*j].is_alphanumeric() || code[*j] == '_') {
                *j += 1;
            }
            code[begin..*j].iter().collect()
        };
        let mut first = word(&mut j, &code);
        if first == "pub" {
            // pub / pub(crate) / pub(super)
            while j < code.len() && code[j].is_whitespace() {
                j += 1;
            }
            if code.get(j) == Some(&'(') {
                while j < code.len() && code[j] != ')' {
                    j += 1;
                }
                j += 1;
            }
            first = word(&mut j, &code);
        }
        if first != "mod" {
            i = j;
            continue;
        }
        let name = word(&mut j, &code);
        while j < code.len() && code[j].is_whitespace() {
            j += 1;
        }
        match code.get(j) {
            Some(';') => {
                test_files.push(name);
                i = j + 1;
            }
            Some('{') => {
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
                let end = j.min(code.len() - 1) + 1;
                for c in &mut code[start..end] {
                    if *c != '\n' {
                        *c = ' ';
                    }
                }
                i = j + 1;
            }
            _ => i = j,
        }
    }
    (code.into_iter().collect(), test_files)
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Parses a use tree (or a plain path) at `*pos` below `prefix`: every leaf path.
fn parse_tree(code: &[char], pos: &mut usize, prefix: ModPath, out: &mut Vec<ModPath>) {
    let mut path = prefix;
    loop {
        while *pos < code.len() && code[*pos].is_whitespace() {
            *pos += 1;
        }
        match code.get(*pos) {
            Some('{') => {
                *pos += 1;
                loop {
                    while *pos < code.len() && (code[*pos].is_whitespace() || code[*pos] == ',') {
                        *pos += 1;
                    }
                    if *pos >= code.len() || code[*pos] == '}' {
                        *pos += 1;
                        return;
                    }
                    let before = *pos;
                    parse_tree(code, pos, path.clone(), out);
                    if *pos == before {
                        *pos += 1;
                    }
                }
            }
            Some('*') => {
                *pos += 1;
                out.push(path);
                return;
            }
            _ => {}
        }
        let begin = *pos;
        while *pos < code.len() && is_ident(code[*pos]) {
            *pos += 1;
        }
        let ident: String = code[begin..*pos].iter().collect();
        let empty = ident.is_empty();
        if !empty && ident != "self" {
            path.push(ident);
        }
        while *pos < code.len() && code[*pos].is_whitespace() {
            *pos += 1;
        }
        if empty || code.get(*pos..*pos + 2) != Some(&[':', ':'][..]) {
            // `as alias` and anything after the path end the leaf.
            if code.get(*pos..*pos + 3) == Some(&['a', 's', ' '][..]) {
                *pos += 3;
                while *pos < code.len() && (code[*pos].is_whitespace() || is_ident(code[*pos])) {
                    *pos += 1;
                }
            }
            out.push(path);
            return;
        }
        *pos += 2;
    }
}

/// Every `crate::` and `super::` path in `code`, made absolute for a file at `module`.
fn crate_paths(code: &str, module: &ModPath) -> Vec<ModPath> {
    let chars: Vec<char> = code.chars().collect();
    let mut paths = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let preceded =
            i > 0 && (is_ident(chars[i - 1]) || chars[i - 1] == '$' || chars[i - 1] == ':');
        let starts = |word: &str| {
            let w: Vec<char> = word.chars().collect();
            chars.get(i..i + w.len()) == Some(&w[..])
        };
        if preceded || !(starts("crate::") || starts("super::")) {
            i += 1;
            continue;
        }
        // A file's own module is `module`; an inline module would be deeper, but only
        // `#[cfg(test)]` ones exist and they are blanked.
        let mut base = module.clone();
        if starts("crate::") {
            base.clear();
            i += "crate::".len();
        } else {
            while chars.get(i..i + 7) == Some(&"super::".chars().collect::<Vec<_>>()[..]) {
                base.pop();
                i += 7;
            }
        }
        let mut pos = i;
        parse_tree(&chars, &mut pos, base, &mut paths);
        i = pos.max(i + 1);
    }
    paths
}

/// A module's re-exports (`pub use child::{Item, ..}`, `pub(crate) use crate::x::Item`):
/// item name to the path it comes from, made absolute. A path into another crate is left out.
fn reexports(
    code: &str,
    module: &ModPath,
    modules: &BTreeSet<ModPath>,
) -> BTreeMap<String, ModPath> {
    let chars: Vec<char> = code.chars().collect();
    let mut map = BTreeMap::new();
    let mut i = 0;
    while i < chars.len() {
        let rest: String = chars[i..chars.len().min(i + 20)].iter().collect();
        let at_word_start = i == 0 || !is_ident(chars[i - 1]);
        let skip = if !at_word_start || !rest.starts_with("pub") {
            None
        } else if rest.starts_with("pub use ") {
            Some("pub use ".len())
        } else if rest.starts_with("pub(crate) use ") {
            Some("pub(crate) use ".len())
        } else if rest.starts_with("pub(super) use ") {
            Some("pub(super) use ".len())
        } else {
            None
        };
        let Some(skip) = skip else {
            i += 1;
            continue;
        };
        let mut pos = i + skip;
        let mut leaves = Vec::new();
        parse_tree(&chars, &mut pos, Vec::new(), &mut leaves);
        for leaf in leaves {
            let Some((item, from)) = leaf.split_last() else { continue };
            let absolute = matches!(from.first().map(String::as_str), Some("crate" | "super"));
            let mut base = module.clone();
            let mut segments = from.iter().peekable();
            if segments.peek().map(|s| s.as_str()) == Some("crate") {
                base.clear();
                segments.next();
            }
            while segments.peek().map(|s| s.as_str()) == Some("super") {
                base.pop();
                segments.next();
            }
            let start = base.len();
            base.extend(segments.cloned());
            // Only paths into this crate: a relative one must start at a child module.
            let inside = if absolute {
                base.first().is_some_and(|top| modules.contains(&vec![top.clone()]))
            } else {
                base.len() > start && modules.contains(&base[..start + 1].to_vec())
            };
            if inside {
                let mut source = base;
                source.push(item.clone());
                map.insert(item.clone(), source);
            }
        }
        i = pos.max(i + 1);
    }
    map
}

/// The file a path lands in: the longest prefix that is a module file, followed through the
/// re-exports of facades (a parent's `pub use child::Item`, the crate root's) to the file the
/// item is defined in.
fn resolve(
    path: &ModPath,
    modules: &BTreeSet<ModPath>,
    facades: &BTreeMap<ModPath, BTreeMap<String, ModPath>>,
) -> Result<ModPath, String> {
    let mut path = path.clone();
    // A re-export chain longer than this is a loop of re-exports.
    for _ in 0..16 {
        let len = (0..=path.len())
            .rev()
            .find(|len| modules.contains(&path[..*len].to_vec()))
            .unwrap_or(0);
        let module = path[..len].to_vec();
        let reexported = path.get(len).and_then(|item| facades.get(&module)?.get(item));
        match reexported {
            Some(source) => {
                let mut next = source.clone();
                next.extend(path[len + 1..].iter().cloned());
                path = next;
            }
            None if module.is_empty() => {
                return Err(format!("crate::{} names no module or re-export", path.join("::")));
            }
            None => return Ok(module),
        }
    }
    Err(format!("crate::{} is re-exported in a loop", path.join("::")))
}

fn show(module: &ModPath) -> String {
    if module.is_empty() { "lib".into() } else { module.join("::") }
}

/// The module graph of one crate, read from its sources: file-level import edges.
#[derive(Debug)]
pub struct ModuleGraph {
    /// File-level edges (the crate root left out: it is the facade).
    edges: BTreeMap<ModPath, BTreeSet<ModPath>>,
    /// Where each edge was seen (a path in the source), for messages.
    seen: BTreeMap<(ModPath, ModPath), String>,
    lib_source: String,
    unresolved: Vec<String>,
    name: String,
}

impl ModuleGraph {
    /// Reads the crate whose sources are under `src` (`src/lib.rs` or `src/main.rs` and every
    /// file below but `src/bin/`);
    /// `name` is used in messages.
    pub fn read(src: &Path, name: &str) -> Self {
        let mut files = Vec::new();
        rust_files(src, &mut files);
        // `src/bin/` holds other crates (binaries), not modules of this one.
        files.retain(|file| !file.starts_with(src.join("bin")));
        files.sort();
        let mut sources: BTreeMap<ModPath, String> = BTreeMap::new();
        for file in &files {
            let text = std::fs::read_to_string(file)
                .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
            sources.insert(module_path(src, file), text);
        }
        // Test-only files (`#[cfg(test)] mod tests;`) are not part of the graph.
        let mut test_only = BTreeSet::new();
        let mut codes = BTreeMap::new();
        for (module, text) in &sources {
            let (code, test_children) = drop_test_modules(&strip(text));
            for child in test_children {
                // `a.rs` and `a/mod.rs` both declare `a/child.rs`.
                let mut path = module.clone();
                path.push(child);
                test_only.insert(path);
            }
            codes.insert(module.clone(), code);
        }
        let modules: BTreeSet<ModPath> =
            codes.keys().filter(|m| !test_only.contains(*m)).cloned().collect();
        let lib_source = sources.get(&Vec::new()).cloned().unwrap_or_default();
        let facades: BTreeMap<ModPath, BTreeMap<String, ModPath>> = modules
            .iter()
            .map(|module| (module.clone(), reexports(&codes[module], module, &modules)))
            .collect();
        let mut edges: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
        let mut seen = BTreeMap::new();
        let mut unresolved = Vec::new();
        for module in &modules {
            if module.is_empty() {
                continue;
            }
            edges.entry(module.clone()).or_default();
            let code = &codes[module];
            for path in crate_paths(code, module) {
                match resolve(&path, &modules, &facades) {
                    Ok(target) if target != *module && !target.is_empty() => {
                        seen.entry((module.clone(), target.clone()))
                            .or_insert_with(|| format!("crate::{}", path.join("::")));
                        edges.entry(module.clone()).or_default().insert(target);
                    }
                    Ok(_) => {}
                    Err(why) => unresolved.push(format!("{}: {why}", show(module))),
                }
            }
        }
        Self { edges, seen, lib_source, unresolved, name: name.to_owned() }
    }

    /// Paths that name no module (the reader could not place them), one message each.
    pub fn unresolved(&self) -> &[String] {
        &self.unresolved
    }

    /// The first import cycle between files, described edge by edge, or `None`.
    pub fn cycle(&self) -> Option<String> {
        let cycle = find_cycle(&self.edges)?;
        let mut text = format!("the modules of {} import each other in a cycle:\n", self.name);
        for pair in cycle.windows(2) {
            let via =
                self.seen.get(&(pair[0].clone(), pair[1].clone())).cloned().unwrap_or_default();
            let _ = writeln!(text, "  {} -> {} (via {via})", show(&pair[0]), show(&pair[1]));
        }
        Some(text)
    }

    /// Everything against the layer table of the crate docs (`src/lib.rs`, section "Modules
    /// and which way they depend"): modules missing from it, rows naming no module, and imports
    /// of a module listed above the importer. Empty when the crate keeps its layers.
    pub fn layer_violations(&self) -> Vec<String> {
        let table = layer_table(&self.lib_source);
        let top_level: BTreeSet<String> = self.edges.keys().map(|m| m[0].clone()).collect();
        let mut violations = Vec::new();
        for missing in top_level.iter().filter(|m| !table.contains_key(*m)) {
            violations.push(format!("  `{missing}` is missing from the layer table in lib.rs"));
        }
        for stale in table.keys().filter(|m| !top_level.contains(*m)) {
            violations
                .push(format!("  the layer table in lib.rs names `{stale}`, which does not exist"));
        }
        for (from, targets) in &self.edges {
            for to in targets {
                let (Some(a), Some(b)) = (table.get(&from[0]), table.get(&to[0])) else { continue };
                if b.rank > a.rank {
                    let via =
                        self.seen.get(&(from.clone(), to.clone())).cloned().unwrap_or_default();
                    violations.push(format!(
                        "  `{}` ({} layer) imports `{}` ({} layer), which is listed above it (via {via})",
                        show(from),
                        a.layer,
                        show(to),
                        b.layer
                    ));
                }
            }
        }
        violations
    }
}

/// The whole check of a crate's `tests/module_layers.rs`: every `crate::` path resolves, no
/// two files import each other in a circle, and nothing imports a module listed above it in
/// the layer table. Panics with every finding.
pub fn assert_layered(src: &Path, name: &str) {
    let graph = ModuleGraph::read(src, name);
    assert!(graph.unresolved().is_empty(), "unresolved paths:\n{}", graph.unresolved().join("\n"));
    if let Some(cycle) = graph.cycle() {
        panic!("{cycle}");
    }
    let violations = graph.layer_violations();
    assert!(
        violations.is_empty(),
        "imports against the layer table of {name}:\n{}",
        violations.join("\n")
    );
}

/// A cycle in the graph, if any, as the list of its modules (first repeated at the end).
fn find_cycle(edges: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Option<Vec<ModPath>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &ModPath,
        edges: &BTreeMap<ModPath, BTreeSet<ModPath>>,
        marks: &mut BTreeMap<ModPath, Mark>,
        stack: &mut Vec<ModPath>,
    ) -> Option<Vec<ModPath>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = stack.iter().position(|m| m == node).unwrap_or(0);
                let mut cycle = stack[from..].to_vec();
                cycle.push(node.clone());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.clone(), Mark::Open);
        stack.push(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, marks, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        marks.insert(node.clone(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in edges.keys() {
        if let Some(cycle) = visit(node, edges, &mut marks, &mut Vec::new()) {
            return Some(cycle);
        }
    }
    None
}

/// One row of the layer table: its layer's name, its rank (higher is further up) and modules.
#[derive(Debug)]
struct Row {
    layer: String,
    rank: usize,
}

/// The layer table of the crate docs: top-level module name to its row. Layers are the bold
/// headings of the "Modules and which way they depend" section, top first; within a layer,
/// rows are listed top first too, and modules named in one row share it.
fn layer_table(lib_source: &str) -> BTreeMap<String, Row> {
    let docs: Vec<&str> = lib_source
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("//!"))
        .map(str::trim)
        .collect();
    let start = docs
        .iter()
        .position(|l| l.starts_with("## Modules and which way they depend"))
        .expect("lib.rs docs have a section `## Modules and which way they depend`");
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut layer = String::new();
    for line in &docs[start + 1..] {
        if line.starts_with("## ") {
            break;
        }
        if let Some(heading) = line.strip_prefix("**") {
            layer = heading.split(['*', ':', '.']).next().unwrap_or_default().trim().to_owned();
            continue;
        }
        let Some(row) = line.strip_prefix('|') else { continue };
        let first = row.split('|').next().unwrap_or_default();
        let names: Vec<String> = first.split('`').skip(1).step_by(2).map(str::to_owned).collect();
        if !names.is_empty() {
            rows.push((layer.clone(), names));
        }
    }
    let count = rows.len();
    let mut table = BTreeMap::new();
    for (index, (layer, names)) in rows.into_iter().enumerate() {
        for name in names {
            let previous =
                table.insert(name.clone(), Row { layer: layer.clone(), rank: count - index });
            assert!(previous.is_none(), "module `{name}` is listed twice in the layer table");
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reader_finds_imports_in_use_trees_and_paths_and_skips_tests_and_comments() {
        let code = "use crate::{a::B, c::{self, d::E as F}};\n// crate::x::y\nlet s = \"crate::z\";\nsuper::super::w::f();\n#[cfg(test)]\nmod tests { use crate::t; }\nfn g() -> crate::h::H<'_> { '}' }\n";
        let (code, _) = drop_test_modules(&strip(code));
        let module = vec!["m".to_owned(), "n".to_owned()];
        let mut found: Vec<String> =
            crate_paths(&code, &module).iter().map(|p| p.join("::")).collect();
        found.sort();
        assert_eq!(found, ["a::B", "c", "c::d::E", "h::H", "w::f"]);
        let cycle = find_cycle(&BTreeMap::from([
            (vec!["a".to_owned()], BTreeSet::from([vec!["b".to_owned()]])),
            (vec!["b".to_owned()], BTreeSet::from([vec!["a".to_owned()]])),
        ]));
        assert_eq!(cycle.map(|c| c.len()), Some(3));
    }
}
