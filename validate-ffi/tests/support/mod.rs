//! What the tests that drive the C ABI from Go share: where the cdylib and the crate are, the
//! fixture cases with the reports Rust gives them, and a `go` command set up to build against
//! the cdylib of this test run without touching the network or the user's Go caches.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use xagent_protocol_types::{PacketType, Role, Routing, Side};
use xagent_protocol_validate::{CardFacts, DocumentKind, check_text_from};

/// The directory holding the cdylib cargo built for this test run (`target/<profile>/deps`).
pub fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().expect("deps directory").to_path_buf();
    assert!(
        dir.join("libxagent_validate_ffi.so").exists(),
        "cdylib not found in {}",
        dir.display()
    );
    dir
}

pub fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub fn workspace_root() -> &'static Path {
    crate_dir().parent().expect("workspace root")
}

/// True when `go` can run here. When it cannot, the caller skips with a printed reason,
/// except that a missing `go` fails when `XAGENT_REQUIRE_GO` is set (`.ci/run` sets it).
pub fn go_available(what: &str) -> bool {
    if Command::new("go").arg("version").output().is_ok_and(|o| o.status.success()) {
        return true;
    }
    assert!(
        std::env::var_os("XAGENT_REQUIRE_GO").is_none(),
        "XAGENT_REQUIRE_GO is set but `go` is not installed"
    );
    println!("SKIPPED: `go` is not installed (apt-get install golang-go); {what} did not run");
    false
}

/// A `go` command in `dir` that builds with cgo against the header of this crate and the
/// cdylib in `lib` (found again at run time through the run path), offline (`GOPROXY=off`),
/// with its build cache and module path under `scratch`.
pub fn go_command(dir: &Path, lib: &Path, scratch: &Path) -> Command {
    let mut command = Command::new("go");
    command
        .current_dir(dir)
        .env("CGO_ENABLED", "1")
        .env("CGO_CFLAGS", format!("-I{}", crate_dir().join("include").display()))
        .env("CGO_LDFLAGS", format!("-L{0} -lxagent_validate_ffi -Wl,-rpath,{0}", lib.display()))
        .env("GOFLAGS", "-mod=mod")
        .env("GO111MODULE", "on")
        .env("GOPROXY", "off")
        .env("GOCACHE", scratch.join("go-cache"))
        .env("GOPATH", scratch.join("gopath"));
    command
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

/// One document to validate: `kind` is `card`, `descriptor`, `packet`, `packet@connector`,
/// `packet@xagent` (a packet judged for that sender) or `skill`.
pub struct Case {
    pub kind: &'static str,
    pub document: PathBuf,
    pub card: Option<PathBuf>,
}

/// Every Card, Descriptor, packet (and wrapped payload) and Skill fixture of the workspace.
/// A payload fixture is wrapped in its envelope and written to `work`, as
/// `packet-from-<fixture file name>`.
pub fn cases(work: &Path) -> Vec<Case> {
    let root = workspace_root();
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
            if name.starts_with("SKILL") && name.ends_with(".md") {
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

/// The report Rust's `check_text_from` gives the case, as `to_json` writes it.
pub fn rust_report(case: &Case) -> String {
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
