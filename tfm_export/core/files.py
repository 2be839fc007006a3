"""Hashing and atomic writes: the one way every command puts a file where the user asked.

Kept free of PyTorch and ONNX so the runtime can use it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from .errors import TfmExportError, first_line


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_atomically(files: Mapping[Path, Callable[[Path], object]], what: str = "output",
                     error: type[TfmExportError] = TfmExportError) -> None:
    """Each writer fills a fresh temporary file beside its target, then all are renamed into place: a
    failure (full disk, Ctrl-C) leaves every target as it was and no temporary file behind."""
    temps: dict[Path, Path] = {}
    try:
        for target, write in files.items():
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
            os.close(fd)
            temps[target] = Path(tmp)
            write(temps[target])
        for target, tmp in temps.items():
            os.replace(tmp, target)
    except Exception as exc:  # OSError, torch's RuntimeError on a full disk, a library's plain Exception
        reason = getattr(exc, "strerror", None) or first_line(exc)
        target = next(iter(files))
        raise error(f"{target}: cannot write {what} ({reason}); choose a writable path") from None
    finally:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)


def write_text_atomically(path: Path, text: str, what: str = "output") -> None:
    """A UTF-8 text file, written whole or not at all."""
    write_atomically({path: lambda tmp: tmp.write_text(text, encoding="utf-8")}, what)
