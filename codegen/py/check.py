"""Python half of `cargo xtask codegen-check`.

Usage: python codegen/py/check.py <work dir>   (the work dir holds manifest.json, written by the
xtask)

1. Generates one pydantic v2 module per fixture kind from its schema with datamodel-code-generator
   (`--output-model-type pydantic_v2.BaseModel`, Python 3.11, unknown members allowed).
2. Parses every fixture with the generated root model (`model_validate`), serialises it back with
   `model_dump(mode="json", by_alias=True, exclude_unset=True)` and compares the result with the
   original as JSON values (member order ignored; `1` and `1.0` differ, booleans are not numbers).
3. Feeds the model every mutation of the fixture that the structural part of the schema rejects
   (probes-py.json, written by the xtask); each must raise a ValidationError, or the generated
   model is looser than the schema.

Writes <work dir>/py-results.json: {"<fixture>": {"ok": bool, "detail": str}}.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from datamodel_code_generator import (
    DataModelType,
    InputFileType,
    PythonVersion,
    generate,
)


def module_name(kind: str) -> str:
    return "kind_" + re.sub(r"[^A-Za-z0-9_]", "_", kind)


def json_difference(a: Any, b: Any, path: str = "") -> str | None:
    """None when `a` and `b` are the same JSON value, else where and how they differ."""
    at = path or "/"
    if isinstance(a, dict) and isinstance(b, dict):
        for key in a.keys() | b.keys():
            if key not in a:
                return f"{path}/{key}: added"
            if key not in b:
                return f"{path}/{key}: dropped"
            difference = json_difference(a[key], b[key], f"{path}/{key}")
            if difference:
                return difference
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{at}: {len(a)} items became {len(b)}"
        for index, (left, right) in enumerate(zip(a, b)):
            difference = json_difference(left, right, f"{path}/{index}")
            if difference:
                return difference
        return None
    if type(a) is not type(b) or a != b:
        return f"{at}: {json.dumps(a)} became {json.dumps(b)}"
    return None


def generate_module(schema_path: Path, root: str, output: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        generate(
            schema_path,
            input_file_type=InputFileType.JsonSchema,
            output=output,
            output_model_type=DataModelType.PydanticV2BaseModel,
            target_python_version=PythonVersion.PY_311,
            class_name=root,
            extra_fields="allow",
            use_annotated=True,
            field_constraints=True,
            use_title_as_name=False,
            disable_timestamp=True,
            capitalise_enum_members=False,
        )


def load_module(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: check.py <work dir>", file=sys.stderr)
        return 2
    work = Path(sys.argv[1])
    manifest = json.loads((work / "manifest.json").read_text(encoding="utf-8"))
    out = work / "py"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)

    models: dict[str, Any] = {}
    kind_error: dict[str, str] = {}
    for kind in manifest["kinds"]:
        name = module_name(kind["id"])
        path = out / f"{name}.py"
        try:
            generate_module(Path(kind["schema"]), kind["root"], path)
            module = load_module(name, path)
            model = getattr(module, kind["root"], None)
            if model is None:
                raise LookupError(f"the generated module has no class {kind['root']}")
            models[kind["id"]] = model
        except Exception as error:  # noqa: BLE001 - reported per fixture
            kind_error[kind["id"]] = f"generating models failed: {error!r}"
            traceback.print_exc()

    probes: dict[str, list[dict[str, Any]]] = {}
    for probe in json.loads((work / "probes-py.json").read_text(encoding="utf-8")):
        probes.setdefault(probe["fixture"], []).append(probe)
    probe_count = sum(len(p) for p in probes.values())

    results: dict[str, dict[str, Any]] = {}
    for fixture in manifest["fixtures"]:
        problems: list[str] = []
        model = models.get(fixture["kind"])
        if model is None:
            problems.append(kind_error.get(fixture["kind"], f"no model for {fixture['kind']}"))
        else:
            original = json.loads(Path(fixture["path"]).read_text(encoding="utf-8"))
            try:
                parsed = model.model_validate(original)
                back = parsed.model_dump(mode="json", by_alias=True, exclude_unset=True)
                difference = json_difference(original, back)
                if difference:
                    problems.append(f"round trip changed the document: {difference}")
            except Exception as error:  # noqa: BLE001 - reported per fixture
                problems.append(f"model_validate failed: {str(error)[:800]}")
            accepted = []
            for probe in probes.get(fixture["name"], []):
                try:
                    model.model_validate(probe["document"])
                    accepted.append(probe["what"])
                except ValidationError:
                    pass
            if accepted:
                problems.append(
                    "the generated model is looser than the schema: it accepts "
                    f"{len(accepted)} document(s) the schema rejects ({', '.join(accepted[:5])})"
                )
        results[fixture["name"]] = {"ok": not problems, "detail": "; ".join(problems)}

    (work / "py-results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    failed = sum(1 for r in results.values() if not r["ok"])
    total = len(results)
    print(
        f"Python: {total - failed}/{total} fixtures pass "
        f"({probe_count} mutations the schema rejects checked to be validation errors)"
    )
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
