#!/usr/bin/env python3
"""After `cargo package --no-verify`: every file a published crate's sources embed with
include_str!/include_bytes! (assets, RULES.md, ...) or its build script is in its .crate.
The verifying build of all packages costs about 10 minutes on 2 cores; the packaged sources
are the workspace's, so what can differ is only what the include list leaves out."""
import json, os, re, subprocess, sys, tarfile

meta = json.loads(subprocess.check_output(
    ["cargo", "metadata", "--no-deps", "--format-version", "1"]))
failed = []
for pkg in meta["packages"]:
    if pkg.get("publish") == []:
        continue
    root = os.path.dirname(pkg["manifest_path"])
    crate = f"target/package/{pkg['name']}-{pkg['version']}.crate"
    if not os.path.exists(crate):
        failed.append(f"{pkg['name']}: {crate} missing (was cargo package run?)")
        continue
    prefix = f"{pkg['name']}-{pkg['version']}/"
    with tarfile.open(crate) as tar:
        packaged = {m.name[len(prefix):] for m in tar.getmembers()}
    needed = set()
    for target in pkg["targets"]:
        if "custom-build" in target["kind"]:
            needed.add(os.path.relpath(target["src_path"], root))
    for dirpath, _, files in os.walk(os.path.join(root, "src")):
        for name in files:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(dirpath, name)
            text = open(path, encoding="utf-8").read()
            for rel in re.findall(r'include_(?:str|bytes)!\(\s*"([^"]+)"', text):
                needed.add(os.path.relpath(os.path.normpath(os.path.join(dirpath, rel)), root))
    for rel in sorted(needed):
        if rel not in packaged:
            failed.append(f"{pkg['name']}: {rel} is used by the build but not in the package (add it to `include`)")
for line in failed:
    print(line, file=sys.stderr)
sys.exit(1 if failed else 0)
