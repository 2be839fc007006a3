#!/usr/bin/env python3
"""The one line `make demo` ends with: its four checks (parity with PyTorch, exact match on the held-out numbers,
int8 against fp32, TensorRT compatibility), each as its own command summarised it in the demo's log.

    python3 scripts/demo_verdict.py build/demo.log

Exit 1, naming what is missing, when a check's summary is not in the log (its command failed or did not run).
"""

from __future__ import annotations

import sys
from pathlib import Path

# check -> how its command's summary line starts (tfm-export verify, eval-demo, verify on int8, check)
SUMMARIES = {"parity": "parity OK", "exact match": "exact match: ", "int8": "int8 OK against fp32",
             "check": "check OK"}


def verdict(lines: list[str]) -> tuple[bool, str]:
    found = {check: next((line for line in lines if line.startswith(start)), None)
             for check, start in SUMMARIES.items()}
    missing = [check for check, line in found.items() if line is None]
    if missing:
        return False, f"demo: FAILED: no {', '.join(missing)} summary (see the output above)"
    return True, "demo: PASSED: " + "; ".join(found.values())


def main() -> int:
    log = Path(sys.argv[1])
    ok, line = verdict(log.read_text(encoding="utf-8").splitlines())
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
