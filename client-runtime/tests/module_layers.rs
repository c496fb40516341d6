//! The crate's modules import each other without a circle, and only downwards through the
//! layer table in the crate docs (`src/lib.rs`, "Modules and which way they depend"), with the
//! workspace's one checker (`xagent_testkit::module_layers`).

use std::path::Path;

use xagent_testkit::module_layers::ModuleGraph;

fn graph() -> ModuleGraph {
    ModuleGraph::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), "client-runtime")
}

#[test]
fn every_crate_path_resolves_to_a_module() {
    let graph = graph();
    assert!(graph.unresolved().is_empty(), "unresolved paths:\n{}", graph.unresolved().join("\n"));
}

#[test]
fn modules_import_each_other_without_a_cycle() {
    if let Some(cycle) = graph().cycle() {
        panic!("{cycle}");
    }
}

#[test]
fn modules_import_only_their_own_row_and_rows_below_in_the_layer_table() {
    let violations = graph().layer_violations();
    assert!(
        violations.is_empty(),
        "imports against the layer table in lib.rs:\n{}",
        violations.join("\n")
    );
}

#[test]
fn no_source_file_is_over_600_lines() {
    let mut files = Vec::new();
    let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("readable src") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let lines = std::fs::read_to_string(&path).expect("readable").lines().count();
                if lines > 600 {
                    files.push(format!("{} ({lines} lines)", path.display()));
                }
            }
        }
    }
    assert!(files.is_empty(), "files over 600 lines: {files:?}");
}
