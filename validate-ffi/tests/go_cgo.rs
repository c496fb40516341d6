//! Calls the library from Go through cgo (standard library only, as the Go xAgent backend
//! would): builds `tests/go` with the system `go` against the cdylib cargo built for this test
//! run, and runs it over every document fixture of the workspace. Each report returned through
//! the C ABI must equal, byte for byte, the report Rust's `check_text` gives for the same
//! input, and the hot-path verdict `xagent_packet_is_valid` must equal the report's `valid`.
//! Packets also go through `xagent_validate_packet_from` with each sender, against Rust's
//! `check_text_from` with that sender.
//! Skipped, with the reason printed, when `go` is not installed, unless `XAGENT_REQUIRE_GO`
//! is set (`.ci/run` installs `golang-go` and sets it).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use xagent_protocol_types::{PacketType, Role, Routing, Side};
use xagent_protocol_validate::{CardFacts, DocumentKind, check_text_from};

fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().expect("deps directory").to_path_buf();
    assert!(
        dir.join("libxagent_validate_ffi.so").exists(),
        "cdylib not found in {}",
        dir.display()
    );
    dir
}

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn go_available() -> bool {
    Command::new("go").arg("version").output().is_ok_and(|o| o.status.success())
}

/// Wraps a payload fixture in the envelope its type needs.
fn envelope(packet_type: &str, payload: Value) -> Value {
    let mut value = json!({
        "schema": "xagent.connector.packet/v1", "packet_id": "pkt_1", "type": packet_type,
        "time": 1790000000000u64, "payload": payload
    });
    if let Some(spec) = PacketType::spec_of(packet_type) {
        if matches!(spec.role, Role::Request { .. } | Role::Ack { .. }) {
            value["request_id"] = json!("req_1");
        }
        if matches!(spec.role, Role::Ack { .. } | Role::MessageAck) {
            value["reply_to"] = json!("pkt_0");
        }
        if spec.routing == Routing::Channel {
            value["connector_channel_id"] = json!("cch_123");
        }
    }
    value
}

struct Case {
    kind: &'static str,
    document: PathBuf,
    card: Option<PathBuf>,
}

/// Every Card, Descriptor, packet (and wrapped payload) and Skill fixture of the workspace.
fn cases(work: &Path) -> Vec<Case> {
    let root = crate_dir().parent().expect("workspace root");
    let validate_card = root.join("protocol-validate/tests/fixtures/card.json");
    let ffi_card = crate_dir().join("tests/data/card.json");
    let mut out = Vec::new();
    let dirs = [
        ("protocol-types/tests/fixtures/examples", &validate_card),
        ("protocol-validate/tests/fixtures", &validate_card),
        ("validate-ffi/tests/data", &ffi_card),
        ("profile-im/tests/fixtures", &validate_card),
    ];
    for (dir, card) in dirs {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
            .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        paths.sort();
        for path in paths {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
            if name == "SKILL.md" {
                out.push(Case { kind: "skill", document: path, card: Some(card.clone()) });
                continue;
            }
            let Some(value) = std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            else {
                continue;
            };
            let schema = value.get("schema").and_then(Value::as_str).unwrap_or_default();
            if schema == "xagent.connector/v1" {
                out.push(Case { kind: "card", document: path, card: None });
            } else if schema.starts_with("xagent.connection/") {
                out.push(Case { kind: "descriptor", document: path.clone(), card: None });
                out.push(Case { kind: "descriptor", document: path, card: Some(card.clone()) });
            } else if schema == "xagent.connector.packet/v1" {
                out.push(Case { kind: "packet", document: path.clone(), card: None });
                for kind in ["packet@connector", "packet@xagent"] {
                    out.push(Case { kind, document: path.clone(), card: None });
                }
                out.push(Case { kind: "packet", document: path, card: Some(card.clone()) });
            } else if let Some(packet_type) =
                name.strip_prefix("payload--").and_then(|n| n.strip_suffix(".json"))
            {
                let wrapped = work.join(format!("packet-from-{name}"));
                let text = serde_json::to_string_pretty(&envelope(packet_type, value)).unwrap();
                std::fs::write(&wrapped, text).unwrap();
                out.push(Case { kind: "packet", document: wrapped.clone(), card: None });
                for kind in ["packet@connector", "packet@xagent"] {
                    out.push(Case { kind, document: wrapped.clone(), card: None });
                }
                out.push(Case { kind: "packet", document: wrapped, card: Some(card.clone()) });
            }
        }
    }
    out
}

fn rust_report(case: &Case) -> String {
    let text = std::fs::read_to_string(&case.document).unwrap();
    let card = case.card.as_ref().map(|path| {
        let value: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        CardFacts::from_value(&value)
    });
    let (kind, sender) = match case.kind {
        "card" => (DocumentKind::Card, None),
        "descriptor" => (DocumentKind::Descriptor, None),
        "packet" => (DocumentKind::Packet, None),
        "packet@connector" => (DocumentKind::Packet, Some(Side::Connector)),
        "packet@xagent" => (DocumentKind::Packet, Some(Side::Xagent)),
        _ => (DocumentKind::Skill, None),
    };
    check_text_from(kind, &text, card.as_ref(), sender).to_json()
}

/// Builds the Go program against the cdylib in `lib`; returns the binary path.
fn build_go(lib: &Path, out: &Path) -> PathBuf {
    let binary = out.join("validatecheck");
    let cache = out.join("go-cache");
    let output = Command::new("go")
        .args(["build", "-o"])
        .arg(&binary)
        .arg(".")
        .current_dir(crate_dir().join("tests/go"))
        .env("CGO_ENABLED", "1")
        .env("CGO_CFLAGS", format!("-I{}", crate_dir().join("include").display()))
        .env("CGO_LDFLAGS", format!("-L{0} -lxagent_validate_ffi -Wl,-rpath,{0}", lib.display()))
        .env("GOFLAGS", "-mod=mod")
        .env("GO111MODULE", "on")
        .env("GOPROXY", "off")
        .env("GOCACHE", &cache)
        .env("GOPATH", out.join("gopath"))
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
    if !go_available() {
        assert!(
            std::env::var_os("XAGENT_REQUIRE_GO").is_none(),
            "XAGENT_REQUIRE_GO is set but `go` is not installed"
        );
        println!(
            "SKIPPED: `go` is not installed (apt-get install golang-go); the Go cgo check did not run"
        );
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
