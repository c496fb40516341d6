#!/usr/bin/env bash
# A Connector outside the workspace builds with exactly the dependency block docs/AUTHORING.md
# gives ("0. Depending on the crates"): the webhook example (a Tool-less IM Connector with a
# route of its own) becomes the main.rs of a fresh crate in a temporary directory. The only
# change to the block is the checkout's path. The workspace's Cargo.lock and target directory
# are used, as the document suggests, so the crates this run already built are not built again.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd -P)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/acme-connector/src"
python3 - "$ROOT/docs/AUTHORING.md" "$ROOT" > "$WORK/deps.toml" <<'PY'
import sys
text = open(sys.argv[1], encoding="utf-8").read()
section = text.split("## 0. Depending on the crates", 1)[1]
block = section.split("```toml\n", 1)[1].split("```", 1)[0]
if "[dependencies]" not in block or "xagent-server-runtime" not in block:
    sys.exit("docs/AUTHORING.md: no [dependencies] block with xagent-server-runtime in section 0")
print(block.replace("../xagent-connector-rs", sys.argv[2]), end="")
PY
{
  printf '[package]\nname = "acme-connector"\nversion = "0.1.0"\nedition = "2024"\npublish = false\n\n'
  cat "$WORK/deps.toml"
  printf '\n[workspace]\n'
} > "$WORK/acme-connector/Cargo.toml"
cp "$ROOT/server-runtime/examples/webhook_connector.rs" "$WORK/acme-connector/src/main.rs"
cp "$ROOT/Cargo.lock" "$WORK/acme-connector/Cargo.lock"
echo "--- $WORK/acme-connector/Cargo.toml"
cat "$WORK/acme-connector/Cargo.toml"
(cd "$WORK/acme-connector" && cargo build --target-dir "$ROOT/target")
test -x "$ROOT/target/debug/acme-connector"
echo "a Connector outside the workspace builds with docs/AUTHORING.md's dependency lines"
