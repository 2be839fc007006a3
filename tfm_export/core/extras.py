"""Optional dependency groups: the runtime installs alone; commands that need more say which extra.

`pip install tfm-export` gives the runtime (NumPy, ONNX Runtime, tokenizers); the extras declared in
pyproject.toml add the rest. A command checks its extra before doing anything, so a missing package is
one line, not an ImportError. The packages of each extra are read from the installed metadata, so
pyproject.toml stays the one list.
"""

from __future__ import annotations

import importlib.util
import re

from .errors import TfmExportError

DISTRIBUTION = "tfm-export"
IMPORT_NAMES = {"protobuf": "google.protobuf", "pytest-xdist": "xdist"}  # import name differs from the name


def extra_packages(extra: str) -> list[str]:
    """Import names of the packages `extra` installs (other extras it names included)."""
    from importlib import metadata  # ~15 ms (it imports the email package): only commands that check an extra pay it
    try:
        requirements = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return []
    found: list[str] = []
    for requirement in requirements:
        if not re.search(rf"""extra\s*==\s*["']{re.escape(extra)}["']""", requirement):
            continue
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
        nested = re.match(rf"{DISTRIBUTION}\[([\w,\s-]+)\]", requirement)
        if nested:
            found += [p for e in nested.group(1).split(",") for p in extra_packages(e.strip())]
        elif name != DISTRIBUTION:
            found.append(IMPORT_NAMES.get(name.lower(), name.lower().replace("-", "_")))
    return list(dict.fromkeys(found))


def missing(extra: str) -> list[str]:
    return [module for module in extra_packages(extra) if importlib.util.find_spec(module) is None]


def require_extra(extra: str, command: str) -> None:
    """One line naming the extra to install when `command` cannot run without it."""
    absent = missing(extra)
    if absent:
        raise TfmExportError(f"{command} needs {', '.join(absent)}, which this installation lacks; "
                             f"pip install 'tfm-export[{extra}]'")
