"""Calls the validators through the C ABI with ctypes, as a Python backend would.

Usage: python3 validate-ffi/tests/python/test_validate.py
The library is $XAGENT_VALIDATE_LIB, else target/debug/libxagent_validate_ffi.so (build it with
`cargo build -p xagent-validate-ffi`). Exits 0 when every check passes. Also run by
tests/c_abi.rs. Needs only the standard library.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "data"
DEFAULT_LIB = HERE.parents[2] / "target" / "debug" / "libxagent_validate_ffi.so"


class Validator:
    """A thin Python wrapper over the C ABI: bytes in, parsed report out."""

    def __init__(self, path: str) -> None:
        self.lib = ctypes.CDLL(path)
        buffer = ctypes.c_char_p  # bytes are passed without copying; NUL bytes are allowed
        for name, args in {
            "xagent_validate_card": [buffer, ctypes.c_size_t],
            "xagent_validate_descriptor": [buffer, ctypes.c_size_t, buffer, ctypes.c_size_t],
            "xagent_validate_packet": [buffer, ctypes.c_size_t, buffer, ctypes.c_size_t],
            "xagent_validate_skill": [buffer, ctypes.c_size_t, buffer, ctypes.c_size_t],
        }.items():
            function = getattr(self.lib, name)
            function.argtypes = args
            # c_void_p, not c_char_p: the pointer must be kept to free it.
            function.restype = ctypes.c_void_p
        self.lib.xagent_validate_free.argtypes = [ctypes.c_void_p]
        self.lib.xagent_validate_free.restype = None
        self.lib.xagent_validate_version.argtypes = []
        self.lib.xagent_validate_version.restype = ctypes.c_char_p

    def _report(self, pointer: int | None) -> dict:
        if not pointer:
            raise RuntimeError("the library returned NULL")
        try:
            return json.loads(ctypes.string_at(pointer).decode("utf-8"))
        finally:
            self.lib.xagent_validate_free(pointer)

    def version(self) -> dict:
        return json.loads(self.lib.xagent_validate_version().decode("utf-8"))

    def card(self, document: bytes) -> dict:
        return self._report(self.lib.xagent_validate_card(document, len(document)))

    def descriptor(self, document: bytes, card: bytes | None = None) -> dict:
        return self._report(
            self.lib.xagent_validate_descriptor(document, len(document), card, len(card or b""))
        )

    def packet(self, document: bytes, card: bytes | None = None) -> dict:
        return self._report(
            self.lib.xagent_validate_packet(document, len(document), card, len(card or b""))
        )

    def skill(self, skill: bytes, card: bytes) -> dict:
        return self._report(self.lib.xagent_validate_skill(skill, len(skill), card, len(card)))


failures = 0


def check(condition: bool, what: str, report: dict | None = None) -> None:
    global failures
    if condition:
        print(f"ok   {what}")
    else:
        failures += 1
        print(f"FAIL {what}: {json.dumps(report)}")


def rules(report: dict) -> list[str]:
    return [violation["rule"] for violation in report["violations"]]


def main() -> int:
    validator = Validator(os.environ.get("XAGENT_VALIDATE_LIB", str(DEFAULT_LIB)))
    card = (DATA / "card.json").read_bytes()

    version = validator.version()
    check(version.get("protocol") == "3.0" and version.get("abi") == 1, "version", version)

    report = validator.card(card)
    check(report["valid"] is True, "valid card is valid", report)

    report = validator.card((DATA / "card-invalid.json").read_bytes())
    errors = [v for v in report["violations"] if v["severity"] == "error"]
    check(report["valid"] is False, "invalid card is invalid", report)
    check(len(errors) >= 5, f"invalid card reports several errors ({len(errors)})", report)
    check(
        {"card.protocol_version", "card.tool_id_format", "card.profiles"} <= set(rules(report)),
        "each broken rule is named",
        report,
    )
    check(
        all(set(v) == {"rule", "severity", "path", "message"} for v in report["violations"]),
        "violations have rule, severity, path and message",
        report,
    )

    descriptor = (DATA / "descriptor.json").read_bytes()
    report = validator.descriptor(descriptor, card)
    check(report["valid"] is True, "descriptor is valid against its card", report)
    wrong = json.loads(descriptor)
    wrong["connection"]["connector_card_id"] = "im.other"
    wrong["connection"]["profiles"] = ["xagent.device.v1"]
    report = validator.descriptor(json.dumps(wrong).encode(), card)
    check(report["valid"] is False and len(report["violations"]) >= 2,
          "descriptor for another card reports several violations", report)

    report = validator.packet((DATA / "packet.json").read_bytes(), card)
    check(report["valid"] is True, "packet is valid against the card", report)
    report = validator.packet(b'{"schema": "xagent.connector.packet/v9", "type": ""}')
    check(report["valid"] is False and len(report["violations"]) >= 2,
          "broken packet reports several violations", report)

    report = validator.skill((DATA / "SKILL.md").read_bytes(), card)
    check(report["valid"] is True, "skill is valid against its card", report)
    report = validator.skill(b"no front matter", card)
    check(report["valid"] is False, "skill without front matter is invalid", report)

    report = validator.card(b"{\xff\xfe}")
    check(report["valid"] is False and rules(report) == ["document.not_json"],
          "non-UTF-8 input returns an error report", report)
    report = validator.packet(b'{"a": 1}', b"\xc3\x28")
    check(report["violations"][0]["path"] == "/card", "non-UTF-8 card is reported at /card", report)
    report = validator.card(b"")
    check(report["valid"] is False, "empty input is invalid", report)
    report = validator.card(b"{\x00}")
    check(report["valid"] is False, "input with a NUL byte is invalid, not truncated", report)

    print(f"{failures} failure(s)")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
