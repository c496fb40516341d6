//! The crate's modules import each other without a circle, and only downwards through the
//! layer table in the crate docs (`src/lib.rs`, "Modules and which way they depend"). The
//! checker is the workspace's one copy, in `xagent_testkit::module_layers`.

use std::path::Path;

#[test]
fn modules_are_layered_without_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    xagent_testkit::module_layers::assert_layered(&src, "client-runtime");
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
