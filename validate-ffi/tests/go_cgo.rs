//! Calls the library from Go through cgo (standard library only, as the Go xAgent backend
//! would): builds `tests/go` with the system `go` against the cdylib cargo built for this test
//! run, and runs it over every document fixture of the workspace. Each report returned through
//! the C ABI must equal, byte for byte, the report Rust's `check_text` gives for the same
//! input, and the hot-path verdict `xagent_packet_is_valid` must equal the report's `valid`.
//! Packets also go through `xagent_validate_packet_from` with each sender, against Rust's
//! `check_text_from` with that sender.
//! Skipped, with the reason printed, when `go` is not installed, unless `XAGENT_REQUIRE_GO`
//! is set (`.ci/run` installs `golang-go` and sets it).

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::{cases, crate_dir, go_available, go_command, library_dir, rust_report};

/// Builds the Go program against the cdylib in `lib`; returns the binary path.
fn build_go(lib: &Path, out: &Path) -> PathBuf {
    let binary = out.join("validatecheck");
    let output = go_command(&crate_dir().join("tests/go"), lib, out)
        .args(["build", "-o"])
        .arg(&binary)
        .arg(".")
        .output()
        .expect("go build runs");
    assert!(
        output.status.success(),
        "go build failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    binary
}

#[test]
fn go_program_gets_the_rust_reports_byte_for_byte_through_cgo() {
    if !go_available("the Go cgo check") {
        return;
    }
    let lib = library_dir();
    let work = std::env::temp_dir().join(format!("xagent_validate_go_{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let cases = cases(&work);
    assert!(cases.len() >= 40, "only {} fixture cases", cases.len());
    let mut manifest = String::new();
    for (i, case) in cases.iter().enumerate() {
        let expected = work.join(format!("expected-{i}.json"));
        std::fs::write(&expected, rust_report(case)).unwrap();
        let card = case.card.as_ref().map_or("-".to_owned(), |p| p.display().to_string());
        manifest.push_str(&format!(
            "{}\t{}\t{}\t{}\n",
            case.kind,
            case.document.display(),
            card,
            expected.display()
        ));
    }
    let manifest_path = work.join("manifest.tsv");
    std::fs::write(&manifest_path, manifest).unwrap();
    let binary = build_go(&lib, &work);
    // The cdylib of this test run, not an older copy elsewhere on the loader's path: cargo puts
    // target/debug (where `cargo build` leaves its own copy) on LD_LIBRARY_PATH, which the
    // loader searches before the binary's run path.
    let output = Command::new(&binary)
        .arg("check")
        .arg(&manifest_path)
        .env("LD_LIBRARY_PATH", &lib)
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let _ = std::fs::remove_dir_all(&work);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "Go check failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains(&format!("{} fixture(s), 0 failure(s)", cases.len())), "{stdout}");
}
