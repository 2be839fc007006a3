"""Writing an artifact directory so that it is complete or absent: staged in a hidden sibling, renamed.

Every command that writes a directory (export, quantize, TensorRT engines) checks its output here
before any slow work, fills a staging directory, and swaps it into place only when everything is
written; an interrupted or failed run removes the staging directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .model_dir import ModelDirError


def check_output(output: Path, force: bool, keep: tuple[Path, ...] = ()) -> None:
    """Fail before any slow work if the output cannot be written, or replacing it would delete `keep`
    (the inputs of the export, or the working directory)."""
    target = output.resolve()
    for path in keep:
        if path.resolve() == target:
            raise ModelDirError(f"{output}: is the input itself ({path}); choose another --output")
        if target in path.resolve().parents:
            raise ModelDirError(f"{output}: holds {path}, which replacing it would delete; choose another --output")
        if path.is_dir() and path.resolve() in target.parents:
            raise ModelDirError(f"{output}: is inside the input {path}; choose an --output outside it")
    cwd = Path.cwd().resolve()
    if cwd == target or target in cwd.parents:
        raise ModelDirError(f"{output}: holds the working directory {cwd}, which replacing it would delete; choose "
                            "another --output")
    if output.exists() and not output.is_dir():
        raise ModelDirError(f"{output}: exists and is not a directory; choose another --output")
    if output.is_dir() and any(output.iterdir()) and not force:
        raise ModelDirError(f"{output}: directory is not empty; pass --force to replace it "
                            "or choose another --output")
    parent = output.resolve().parent
    if not parent.is_dir():
        raise ModelDirError(f"{parent}: parent directory of --output does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ModelDirError(f"{parent}: not writable; choose a writable --output")


@contextlib.contextmanager
def staged_directory(output: Path, force: bool, keep: tuple[Path, ...] = ()) -> Iterator[Path]:
    """Yield a hidden staging directory beside `output`; on success it replaces `output` atomically."""
    check_output(output, force, keep)
    parent = output.resolve().parent
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".partial", dir=parent))
    except OSError as exc:
        raise ModelDirError(f"{parent}: cannot create the output ({exc.strerror}); "
                            "choose a writable --output") from None
    try:
        yield staging
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes it private; a model directory is meant to be shared
        _swap_into_place(staging, output.resolve())
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _swap_into_place(staging: Path, output: Path) -> None:
    old = None
    try:
        if output.exists():
            old = output.with_name(f".{output.name}.old-{os.getpid()}")
            os.replace(output, old)
        os.replace(staging, output)
    except OSError as exc:
        if old is not None and not output.exists():
            os.replace(old, output)  # put the previous directory back
        raise ModelDirError(f"{output}: cannot replace it ({exc.strerror}); choose another --output") from None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


