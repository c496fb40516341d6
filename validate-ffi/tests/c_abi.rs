//! Calls the library from outside Rust: compiles `tests/c/test_validate.c` with the system C
//! compiler (`$CC`, else `cc`) against the built cdylib and runs it, then runs
//! `tests/python/test_validate.py` (ctypes) with `$PYTHON`, else `python3`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory holding the cdylib cargo built for this test run (`target/<profile>/deps`).
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().expect("deps directory").to_path_buf();
    assert!(dir.join(library_file()).exists(), "{} not found in {}", library_file(), dir.display());
    dir
}

fn library_file() -> &'static str {
    if cfg!(target_os = "macos") {
        "libxagent_validate_ffi.dylib"
    } else if cfg!(windows) {
        "xagent_validate_ffi.dll"
    } else {
        "libxagent_validate_ffi.so"
    }
}

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn c_program_validates_through_the_c_abi() {
    let lib = library_dir();
    let out = std::env::temp_dir().join(format!("xagent_validate_c_test_{}", std::process::id()));
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let status = Command::new(&compiler)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic"])
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg(crate_dir().join("tests").join("c").join("test_validate.c"))
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lxagent_validate_ffi")
        .arg("-o")
        .arg(&out)
        .status()
        .expect("the system C compiler runs");
    assert!(status.success(), "compiling the C test failed");
    let output = Command::new(&out)
        .arg(crate_dir().join("tests").join("data"))
        .output()
        .expect("the C test runs");
    let _ = std::fs::remove_file(&out);
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "C test failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("0 failure(s)"));
}

#[test]
fn python_ctypes_validates_through_the_c_abi() {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let output = Command::new(&python)
        .arg(crate_dir().join("tests").join("python").join("test_validate.py"))
        .env("XAGENT_VALIDATE_LIB", library_dir().join(library_file()))
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "Python test failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("0 failure(s)"));
}
