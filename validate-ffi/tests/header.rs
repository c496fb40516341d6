//! The committed C header equals what cbindgen generates from the source, so the ABI a C
//! caller compiles against is the one the library exports. `XAGENT_BLESS_HEADER=1` rewrites it.

use std::path::Path;

#[test]
fn committed_header_matches_cbindgen_output() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src").join("lib.rs"))
        .generate()
        .expect("cbindgen generates the header");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let generated = String::from_utf8(generated).expect("the header is UTF-8");
    let path = dir.join("include").join("xagent_validate.h");
    if std::env::var_os("XAGENT_BLESS_HEADER").is_some() {
        std::fs::write(&path, &generated).expect("writing the header");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/xagent_validate.h is out of date; run \
         `XAGENT_BLESS_HEADER=1 cargo test -p xagent-validate-ffi --test header` and commit it"
    );
}
