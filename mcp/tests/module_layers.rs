//! The bridge's modules import each other without a circle, and only downwards through the
//! layer table in the crate docs (`src/lib.rs`, "Modules and which way they depend"), with the
//! workspace's one checker (`xagent_testkit::module_layers`).

use std::path::Path;

use xagent_testkit::module_layers::ModuleGraph;

fn graph() -> ModuleGraph {
    ModuleGraph::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), "mcp")
}

#[test]
fn module_layer_rule_every_crate_path_resolves_to_a_module() {
    let graph = graph();
    assert!(graph.unresolved().is_empty(), "unresolved paths:\n{}", graph.unresolved().join("\n"));
}

#[test]
fn module_layer_rule_no_import_circle_in_the_bridge() {
    if let Some(cycle) = graph().cycle() {
        panic!("{cycle}");
    }
}

#[test]
fn module_layer_rule_modules_import_only_their_row_and_rows_below() {
    let violations = graph().layer_violations();
    assert!(
        violations.is_empty(),
        "imports against the layer table in lib.rs:\n{}",
        violations.join("\n")
    );
}
