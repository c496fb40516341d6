//! The crate's modules import each other without a circle, and only downwards through the
//! layer table in the crate docs (`src/main.rs`, "Modules and which way they depend"). The
//! checker is the workspace's one copy, in `xagent_testkit::module_layers`.

use std::path::Path;

use xagent_testkit::module_layers::ModuleGraph;

fn graph() -> ModuleGraph {
    ModuleGraph::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), "xtask")
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
