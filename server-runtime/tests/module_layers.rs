//! The crate's modules import each other without a circle, and only downwards through the
//! layer table in the crate docs (`src/lib.rs`, "Modules and which way they depend"). The
//! checker is the workspace's one copy, in `xagent_testkit::module_layers`.

use std::path::Path;

#[test]
fn modules_are_layered_without_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    xagent_testkit::module_layers::assert_layered(&src, "server-runtime");
}
