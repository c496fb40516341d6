#!/usr/bin/env bash
# The README's C section works as written: its app.c and its build lines, run from the
# repository's root exactly as printed there (build the library, compile and link, start the
# program, validate a Card). Fails if the program cannot start (no rpath: exit 127), if the
# valid Card is reported invalid, or if the invalid one is reported valid.
set -euo pipefail
cd "$(dirname "$0")/.."
[ ! -e app.c ] && [ ! -e app ] || { echo "app.c or app exists in the root; remove it first" >&2; exit 1; }
trap 'rm -f app.c app' EXIT
python3 - README.md > .ci-readme-c.sh <<'PY'
import sys
text = open(sys.argv[1], encoding="utf-8").read()
section = text.split("### The validators from C", 1)[1].split("\n### ", 1)[0]
program = section.split("A whole program, `app.c`", 1)[1].split("```c\n", 1)[1].split("```", 1)[0]
commands = section.split("From the repository's root", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
open("app.c", "w", encoding="utf-8").write(program)
print("set -euxo pipefail")
print(commands, end="")
PY
trap 'rm -f app.c app .ci-readme-c.sh' EXIT
OUT=$(bash .ci-readme-c.sh)
echo "$OUT"
echo "$OUT" | grep -q '"abi":' || { echo "the program did not print the library version" >&2; exit 1; }
echo "$OUT" | grep -q '^{"valid":true' || { echo "the valid Card was not reported valid" >&2; exit 1; }
if ./app validate-ffi/tests/data/card-invalid.json > /dev/null; then
  echo "the invalid Card was reported valid" >&2; exit 1
fi
echo "README C section: built, linked, started and validated as written"
