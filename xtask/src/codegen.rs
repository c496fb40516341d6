//! `cargo xtask codegen-check`: generate TypeScript types (json-schema-to-typescript) and Python
//! models (datamodel-code-generator, pydantic v2) from `schemas/`, then parse every wire fixture
//! of `protocol-types/tests/fixtures/` with them in each language, serialise it back and compare
//! it with the original. Prints a pass/fail table; fails when any fixture fails in any language.
//!
//! This module only prepares the work and reports: it writes one standalone schema per fixture
//! kind into `target/codegen/schemas/` (taken from the committed schemas, never from the Rust
//! types, so the check exercises exactly what other languages consume) and a manifest; the
//! per-language scripts in `codegen/` do the generating and parsing, and write their results.
//!
//! The generated code lives in `target/codegen/` and is never committed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value, json};

/// Environment variable naming the Python interpreter that has `codegen/requirements.txt`
/// installed (default `python3`).
const PYTHON_ENV: &str = "CODEGEN_PYTHON";

/// One kind of fixture (the part of a file name before `--`) and the schema its documents are
/// parsed with.
struct Kind {
    /// Kind id, also the schema file stem in `target/codegen/schemas/`.
    id: String,
    /// Name of the root type in the generated code (the schema's `title`).
    root: String,
    /// The standalone schema.
    schema: Value,
}

/// Options of `codegen-check`.
#[derive(Debug, Default)]
struct Options {
    /// Skip the TypeScript half.
    no_ts: bool,
    /// Skip the Python half.
    no_py: bool,
}

/// Runs `cargo xtask codegen-check [--only ts|py]`.
pub fn run(root: &Path, args: &[String]) -> Result<ExitCode> {
    let mut options = Options::default();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--only" => match args.next().map(String::as_str) {
                Some("ts") => options.no_py = true,
                Some("py") => options.no_ts = true,
                other => bail!("--only takes `ts` or `py`, got {other:?}"),
            },
            other => {
                bail!("unknown flag {other:?}; usage: cargo xtask codegen-check [--only ts|py]")
            }
        }
    }

    let work = root.join("target").join("codegen");
    let schema_dir = work.join("schemas");
    if schema_dir.exists() {
        std::fs::remove_dir_all(&schema_dir)
            .with_context(|| format!("clearing {}", schema_dir.display()))?;
    }
    std::fs::create_dir_all(&schema_dir)
        .with_context(|| format!("creating {}", schema_dir.display()))?;

    let fixtures = fixtures(root)?;
    let kinds = kinds(root, &fixtures)?;
    for kind in kinds.values() {
        let path = schema_dir.join(format!("{}.schema.json", kind.id));
        write_json(&path, &kind.schema)?;
    }
    let manifest = json!({
        "kinds": kinds.values().map(|k| json!({
            "id": k.id,
            "root": k.root,
            "schema": schema_dir.join(format!("{}.schema.json", k.id)),
        })).collect::<Vec<_>>(),
        "fixtures": fixtures.iter().map(|f| json!({
            "name": f.name,
            "kind": f.kind,
            "path": f.path,
        })).collect::<Vec<_>>(),
    });
    write_json(&work.join("manifest.json"), &manifest)?;
    for language in [Language::TypeScript, Language::Python] {
        let probes = probes(&fixtures, &kinds, language)?;
        let file = work.join(format!("probes-{}.json", language.tag()));
        write_json(&file, &Value::Array(probes))?;
    }

    let mut columns: Vec<(&str, BTreeMap<String, Outcome>)> = Vec::new();
    if !options.no_ts {
        columns.push(("TypeScript", run_typescript(root, &work)?));
    }
    if !options.no_py {
        columns.push(("Python", run_python(root, &work)?));
    }
    Ok(report(&fixtures, &columns))
}

/// One fixture file.
struct Fixture {
    /// `examples/card--minimal` etc.
    name: String,
    /// The kind id it is parsed as.
    kind: String,
    /// Absolute path.
    path: PathBuf,
}

/// Every JSON fixture under `protocol-types/tests/fixtures/{examples,documents}`.
fn fixtures(root: &Path) -> Result<Vec<Fixture>> {
    let base = root.join("protocol-types").join("tests").join("fixtures");
    let mut out = Vec::new();
    for dir in ["examples", "documents"] {
        let path = base.join(dir);
        let entries =
            std::fs::read_dir(&path).with_context(|| format!("reading {}", path.display()))?;
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.with_context(|| format!("reading {}", path.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(stem) = name.strip_suffix(".json") {
                names.push(stem.to_owned());
            }
        }
        names.sort();
        for stem in names {
            let Some((prefix, rest)) = stem.split_once("--") else {
                bail!("fixture {dir}/{stem}.json is not named <kind>--<name>");
            };
            let kind = match prefix {
                "payload" => format!("payload-{rest}"),
                other => other.to_owned(),
            };
            out.push(Fixture {
                name: format!("{dir}/{stem}"),
                kind,
                path: path.join(format!("{stem}.json")),
            });
        }
    }
    Ok(out)
}

fn read_json(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

fn write_json(path: &Path, value: &Value) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let mut text = serde_json::to_string_pretty(value).context("serialising JSON")?;
    text.push('\n');
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// A committed schema with its title replaced by the root type name.
fn whole(schema: &Value, root: &str) -> Result<Value> {
    let mut schema = schema.clone();
    let Some(map) = schema.as_object_mut() else { bail!("a schema file is not an object") };
    map.insert("title".into(), Value::String(root.into()));
    Ok(schema)
}

/// A standalone schema whose root is the `$defs` entry `def` of `schema` (all `$defs` kept, so
/// references still resolve).
fn from_def(schema: &Value, def: &str, root: &str) -> Result<Value> {
    let defs = schema.get("$defs").cloned().unwrap_or_else(|| json!({}));
    let Some(Value::Object(body)) = defs.get(def).cloned() else {
        bail!("the schema has no $defs/{def}");
    };
    Ok(standalone(body, defs, root))
}

fn standalone(body: Map<String, Value>, defs: Value, root: &str) -> Value {
    let mut out = Map::new();
    out.insert("$schema".into(), json!("https://json-schema.org/draft/2020-12/schema"));
    out.insert("title".into(), Value::String(root.into()));
    for (key, value) in body {
        if key != "title" {
            out.insert(key, value);
        }
    }
    out.insert("$defs".into(), defs);
    Value::Object(out)
}

/// `chat.message.ack` -> `ChatMessageAck`.
fn pascal(wire: &str) -> String {
    let mut out = String::new();
    for part in wire.split(['.', '_', '-']) {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            out.extend(first.to_uppercase());
            out.push_str(chars.as_str());
        }
    }
    out
}

/// The schema of every kind that occurs in `fixtures`. Kinds with a top-level schema file use
/// it; the others use a `$defs` entry of one (a Tool of the Card, a `message.push` file, the
/// arguments of `tool.invoke`) or the HTTP body schemas; a Profile declaration is the fragment of
/// a Card (`supports`) and of a Descriptor (`connection.target_type`, `connection.profiles`)
/// that the Profile texts print.
fn kinds(root: &Path, fixtures: &[Fixture]) -> Result<BTreeMap<String, Kind>> {
    let schemas = root.join("schemas");
    let card = read_json(&schemas.join("xagent.connector.v1.schema.json"))?;
    let descriptor = read_json(&schemas.join("xagent.connection.v2.schema.json"))?;
    let packet = read_json(&schemas.join("xagent.connector.packet.v1.schema.json"))?;
    let packet_defs = packet.get("$defs").cloned().unwrap_or_else(|| json!({}));

    let mut out = BTreeMap::new();
    for fixture in fixtures {
        if out.contains_key(&fixture.kind) {
            continue;
        }
        let (root_name, schema) = match fixture.kind.as_str() {
            "card" => ("ConnectorCard".to_owned(), whole(&card, "ConnectorCard")?),
            "descriptor" => {
                ("ConnectionDescriptor".to_owned(), whole(&descriptor, "ConnectionDescriptor")?)
            }
            // The discriminated union of every known packet type.
            "packet" => ("Packet".to_owned(), from_def(&packet, "KnownPacket", "Packet")?),
            // The envelope alone: the first decoding step, payload left generic.
            "envelope" => {
                let mut envelope = whole(&packet, "Envelope")?;
                if let Some(map) = envelope.as_object_mut() {
                    map.remove("allOf");
                }
                ("Envelope".to_owned(), envelope)
            }
            "card-tool" => ("CardTool".to_owned(), from_def(&card, "CardTool", "CardTool")?),
            "push-file" => ("PushFile".to_owned(), from_def(&packet, "PushFile", "PushFile")?),
            "tool-arguments" => {
                let arguments = packet
                    .pointer("/$defs/ToolInvoke/properties/arguments")
                    .and_then(Value::as_object)
                    .cloned()
                    .context("the packet schema has no $defs/ToolInvoke/properties/arguments")?;
                let mut body = arguments;
                body.remove("default");
                ("ToolArguments".to_owned(), standalone(body, packet_defs.clone(), "ToolArguments"))
            }
            "health" => {
                let health = read_json(&schemas.join("http").join("health.schema.json"))?;
                ("HealthResponse".to_owned(), whole(&health, "HealthResponse")?)
            }
            "upload" => {
                let upload = read_json(&schemas.join("http").join("upload.schema.json"))?;
                ("UploadResponse".to_owned(), whole(&upload, "UploadResponse")?)
            }
            "profile-declaration" => {
                let profiles = descriptor
                    .pointer("/$defs/Connection/properties/profiles")
                    .cloned()
                    .context("the descriptor schema has no Connection.profiles")?;
                let mut defs = card.get("$defs").cloned().unwrap_or_else(|| json!({}));
                if let (Some(defs), Some(Value::Object(extra))) =
                    (defs.as_object_mut(), descriptor.get("$defs"))
                {
                    for (key, value) in extra {
                        defs.entry(key.clone()).or_insert_with(|| value.clone());
                    }
                }
                let body = json!({
                    "type": "object",
                    "description": "The part of a Card and of a Descriptor a Profile text declares.",
                    "properties": {
                        "supports": { "$ref": "#/$defs/Supports" },
                        "connection": {
                            "title": "ProfileConnection",
                            "type": "object",
                            "properties": {
                                "target_type": { "$ref": "#/$defs/TargetType" },
                                "profiles": profiles
                            },
                            "required": ["target_type", "profiles"],
                            "additionalProperties": true
                        }
                    },
                    "required": ["supports"],
                    "additionalProperties": true
                });
                let Value::Object(body) = body else { bail!("unreachable: a literal object") };
                ("ProfileDeclaration".to_owned(), standalone(body, defs, "ProfileDeclaration"))
            }
            other => match other.strip_prefix("payload-") {
                Some(packet_type) => {
                    let path = schemas.join("packets").join(format!("{packet_type}.schema.json"));
                    if !path.exists() {
                        bail!("no schema for the payload of {packet_type:?} ({})", path.display());
                    }
                    let name = format!("{}Payload", pascal(packet_type));
                    (name.clone(), whole(&read_json(&path)?, &name)?)
                }
                None => bail!(
                    "fixture {} has kind {other:?}, which codegen-check does not know; map it in \
                     xtask/src/codegen.rs",
                    fixture.name
                ),
            },
        };
        out.insert(
            fixture.kind.clone(),
            Kind { id: fixture.kind.clone(), root: root_name, schema },
        );
    }
    Ok(out)
}

/// A target language; what its generated types can express differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Language {
    TypeScript,
    Python,
}

impl Language {
    fn tag(self) -> &'static str {
        match self {
            Self::TypeScript => "ts",
            Self::Python => "py",
        }
    }
}

/// Keywords a generated type cannot be expected to enforce: value ranges, lengths, patterns,
/// conditionals and negations. Everything else (`type`, `required`, `enum`, `const`, `oneOf`,
/// `anyOf`, `allOf`, `$ref`, `properties`, `items`) is structure a type must carry.
const VALUE_LEVEL: &[&str] = &[
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minItems",
    "maxItems",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "minProperties",
    "maxProperties",
    "propertyNames",
    "dependentRequired",
    "dependentSchemas",
    "if",
    "then",
    "else",
    "not",
];

/// The structural part of a schema: what the types generated for `language` must enforce. For
/// Python, a member forbidden by a `false` schema is allowed (pydantic models cannot say
/// "absent"; the generator types it `Any`), and every object is open (we generate with
/// `extra="allow"` so unknown members survive a round trip).
fn structural(schema: &Value, language: Language) -> Value {
    match schema {
        Value::Object(map) => {
            let mut out = Map::new();
            for (key, value) in map {
                if VALUE_LEVEL.contains(&key.as_str()) {
                    continue;
                }
                let value = match key.as_str() {
                    "properties" | "$defs" | "patternProperties" => match value {
                        Value::Object(children) => Value::Object(
                            children
                                .iter()
                                .map(|(name, child)| {
                                    let child = match (language, child) {
                                        (Language::Python, Value::Bool(false))
                                            if key == "properties" =>
                                        {
                                            Value::Bool(true)
                                        }
                                        _ => structural(child, language),
                                    };
                                    (name.clone(), child)
                                })
                                .collect(),
                        ),
                        other => other.clone(),
                    },
                    "additionalProperties" if language == Language::Python => Value::Bool(true),
                    "items" | "additionalProperties" | "unevaluatedProperties" => {
                        structural(value, language)
                    }
                    "allOf" | "anyOf" | "oneOf" | "prefixItems" => match value {
                        Value::Array(items) => {
                            Value::Array(items.iter().map(|i| structural(i, language)).collect())
                        }
                        other => other.clone(),
                    },
                    _ => value.clone(),
                };
                out.insert(key.clone(), value);
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// Every JSON pointer below the root of a document.
fn pointers(value: &Value, prefix: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let pointer = format!("{prefix}/{}", key.replace('~', "~0").replace('/', "~1"));
                out.push(pointer.clone());
                pointers(child, &pointer, out);
            }
        }
        Value::Array(items) => {
            for (index, child) in items.iter().enumerate() {
                let pointer = format!("{prefix}/{index}");
                out.push(pointer.clone());
                pointers(child, &pointer, out);
            }
        }
        _ => {}
    }
}

/// Single-change mutations of a document: drop a member, put an unknown string where a string
/// was, put a number where something else was.
fn mutations(document: &Value) -> Vec<(String, Value)> {
    let mut all = Vec::new();
    pointers(document, "", &mut all);
    let mut out = Vec::new();
    for pointer in &all {
        let Some((parent, last)) = pointer.rsplit_once('/') else { continue };
        let key = last.replace("~1", "/").replace("~0", "~");
        let mut dropped = document.clone();
        let removed = match dropped.pointer_mut(parent) {
            Some(Value::Object(map)) => map.remove(&key).is_some(),
            Some(Value::Array(items)) => match key.parse::<usize>() {
                Ok(index) if index < items.len() => {
                    items.remove(index);
                    true
                }
                _ => false,
            },
            _ => false,
        };
        if removed {
            out.push((format!("without {pointer}"), dropped));
        }
        let current = document.pointer(pointer);
        if current.is_some_and(Value::is_string) {
            let mut unknown = document.clone();
            if let Some(slot) = unknown.pointer_mut(pointer) {
                *slot = json!("zz-not-a-known-value");
                out.push((format!("{pointer} = \"zz-not-a-known-value\""), unknown));
            }
        }
        if !current.is_some_and(Value::is_number) {
            let mut number = document.clone();
            if let Some(slot) = number.pointer_mut(pointer) {
                *slot = json!(12345);
                out.push((format!("{pointer} = 12345"), number));
            }
        }
    }
    out
}

/// Documents the generated types of `language` must reject: mutations of each fixture that the
/// structural part of its schema rejects. A generated type that accepts one is looser than the
/// schema (a lost `required`, enum, `const`, union or member type).
fn probes(
    fixtures: &[Fixture],
    kinds: &BTreeMap<String, Kind>,
    language: Language,
) -> Result<Vec<Value>> {
    let mut validators = BTreeMap::new();
    for kind in kinds.values() {
        let schema = structural(&kind.schema, language);
        let validator = jsonschema::validator_for(&schema)
            .map_err(|e| anyhow::anyhow!("compiling the structural schema of {}: {e}", kind.id))?;
        validators.insert(kind.id.clone(), validator);
    }
    let mut out = Vec::new();
    for fixture in fixtures {
        let Some(validator) = validators.get(&fixture.kind) else { continue };
        let document = read_json(&fixture.path)?;
        for (index, (what, mutated)) in mutations(&document).into_iter().enumerate() {
            if validator.is_valid(&mutated) {
                continue;
            }
            out.push(json!({
                "fixture": fixture.name,
                "kind": fixture.kind,
                "id": index,
                "what": what,
                "document": mutated,
            }));
        }
    }
    Ok(out)
}

/// The result of one fixture in one language.
#[derive(Clone, Debug)]
struct Outcome {
    ok: bool,
    detail: String,
}

/// Reads `{"<fixture name>": {"ok": bool, "detail": "..."}}` written by a language script.
fn read_results(path: &Path) -> Result<BTreeMap<String, Outcome>> {
    let value = read_json(path)?;
    let Some(map) = value.as_object() else { bail!("{} is not an object", path.display()) };
    let mut out = BTreeMap::new();
    for (name, result) in map {
        let ok = result.get("ok").and_then(Value::as_bool).unwrap_or(false);
        let detail = result.get("detail").and_then(Value::as_str).unwrap_or_default().to_owned();
        out.insert(name.clone(), Outcome { ok, detail });
    }
    Ok(out)
}

fn run_script(
    mut command: Command,
    what: &str,
    results: &Path,
) -> Result<BTreeMap<String, Outcome>> {
    if results.exists() {
        std::fs::remove_file(results).with_context(|| format!("removing {}", results.display()))?;
    }
    println!("== {what}");
    let status = command.status().with_context(|| format!("starting the {what} check"))?;
    if !results.exists() {
        bail!("the {what} check wrote no results ({status}); see its output above");
    }
    read_results(results)
}

fn run_typescript(root: &Path, work: &Path) -> Result<BTreeMap<String, Outcome>> {
    let dir = root.join("codegen");
    let tsx = dir.join("node_modules").join(".bin").join("tsx");
    if !tsx.exists() {
        bail!("codegen/node_modules is missing: run `npm ci --prefix codegen` first");
    }
    // The harness itself must type-check under --strict too.
    let tsc = dir.join("node_modules").join(".bin").join("tsc");
    let status = Command::new(tsc)
        .current_dir(&dir)
        .args(["-p", "."])
        .status()
        .context("starting tsc on the TypeScript harness")?;
    if !status.success() {
        bail!("the TypeScript harness in codegen/ts does not type-check ({status})");
    }
    let mut command = Command::new(tsx);
    command.current_dir(&dir).arg(dir.join("ts").join("check.ts")).arg(work);
    run_script(command, "TypeScript", &work.join("ts-results.json"))
}

fn run_python(root: &Path, work: &Path) -> Result<BTreeMap<String, Outcome>> {
    let python = std::env::var(PYTHON_ENV).unwrap_or_else(|_| "python3".to_owned());
    let probe = Command::new(&python)
        .args(["-c", "import datamodel_code_generator, pydantic"])
        .output()
        .with_context(|| format!("starting {python}"))?;
    if !probe.status.success() {
        bail!(
            "{python} lacks datamodel-code-generator or pydantic: run `{python} -m pip install -r \
             codegen/requirements.txt` (or set {PYTHON_ENV} to an interpreter that has them)"
        );
    }
    let mut command = Command::new(&python);
    command.current_dir(root).arg(root.join("codegen").join("py").join("check.py")).arg(work);
    run_script(command, "Python", &work.join("py-results.json"))
}

/// Prints the table and returns the exit code.
fn report(fixtures: &[Fixture], columns: &[(&str, BTreeMap<String, Outcome>)]) -> ExitCode {
    let width = fixtures.iter().map(|f| f.name.len()).max().unwrap_or(8).max(8);
    let mut header = format!("{:width$}", "fixture");
    for (language, _) in columns {
        header.push_str(&format!("  {language:10}"));
    }
    println!("\n{header}");
    let mut failures = Vec::new();
    for fixture in fixtures {
        let mut line = format!("{:width$}", fixture.name);
        for (language, results) in columns {
            let cell = match results.get(&fixture.name) {
                Some(outcome) if outcome.ok => "pass",
                Some(outcome) => {
                    failures.push(format!("{} [{language}]: {}", fixture.name, outcome.detail));
                    "FAIL"
                }
                None => {
                    failures.push(format!("{} [{language}]: no result reported", fixture.name));
                    "MISSING"
                }
            };
            line.push_str(&format!("  {cell:10}"));
        }
        println!("{line}");
    }
    if failures.is_empty() {
        println!(
            "\nall {} fixtures round-trip in {}",
            fixtures.len(),
            columns.iter().map(|(l, _)| *l).collect::<Vec<_>>().join(" and ")
        );
        ExitCode::SUCCESS
    } else {
        eprintln!("\n{} failure(s):", failures.len());
        for failure in &failures {
            eprintln!("  {failure}");
        }
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pascal_case_of_wire_types() {
        assert_eq!(pascal("chat.message.ack"), "ChatMessageAck");
        assert_eq!(pascal("connection.descriptor.get"), "ConnectionDescriptorGet");
        assert_eq!(pascal("ping"), "Ping");
    }

    #[test]
    fn from_def_keeps_defs_and_retitles() {
        let schema = json!({
            "$defs": { "A": { "type": "object", "title": "old", "properties": { "b": { "$ref": "#/$defs/B" } } }, "B": { "type": "string" } }
        });
        let out = from_def(&schema, "A", "Root").expect("def exists");
        assert_eq!(out["title"], "Root");
        assert_eq!(out["type"], "object");
        assert_eq!(out["$defs"]["B"]["type"], "string");
        assert!(from_def(&schema, "Missing", "Root").is_err());
    }

    #[test]
    fn structural_schema_drops_value_level_keywords_only() {
        let schema = json!({
            "type": "object",
            "required": ["a"],
            "properties": {
                "a": { "type": "string", "minLength": 3, "enum": ["xyz"] },
                "pattern": { "type": "string", "pattern": "^x$" },
                "gone": false
            },
            "if": { "required": ["a"] },
            "then": { "required": ["b"] }
        });
        let ts = structural(&schema, Language::TypeScript);
        assert_eq!(ts["required"], json!(["a"]));
        assert_eq!(ts["properties"]["a"], json!({ "type": "string", "enum": ["xyz"] }));
        assert_eq!(ts["properties"]["pattern"], json!({ "type": "string" }));
        assert_eq!(ts["properties"]["gone"], json!(false));
        assert!(ts.get("if").is_none() && ts.get("then").is_none());
        let py = structural(&schema, Language::Python);
        assert_eq!(py["properties"]["gone"], json!(true));
    }

    #[test]
    fn mutations_cover_drops_unknown_strings_and_wrong_types() {
        let document = json!({ "a": "x", "b": [1] });
        let whats: Vec<String> = mutations(&document).into_iter().map(|(w, _)| w).collect();
        assert!(whats.contains(&"without /a".to_owned()));
        assert!(whats.contains(&"/a = \"zz-not-a-known-value\"".to_owned()));
        assert!(whats.contains(&"/b = 12345".to_owned()));
        assert!(whats.contains(&"without /b/0".to_owned()));
        assert!(!whats.contains(&"/b/0 = 12345".to_owned()), "numbers are not replaced by numbers");
    }

    #[test]
    fn every_fixture_kind_has_a_schema() {
        let root = crate::workspace_root();
        let fixtures = fixtures(&root).expect("fixtures are listed");
        assert!(fixtures.len() > 30, "found {} fixtures", fixtures.len());
        let kinds = kinds(&root, &fixtures).expect("every kind maps to a schema");
        for fixture in &fixtures {
            assert!(kinds.contains_key(&fixture.kind), "{}", fixture.name);
        }
    }
}
