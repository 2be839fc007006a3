"""Writing an artifact directory so that it is complete or absent: staged in a hidden sibling, renamed.

Every command that writes a directory (export, quantize, TensorRT engines) checks its output here
before any slow work, fills a staging directory, and swaps it into place only when everything is
written; an interrupted or failed run removes the staging directory.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..core.errors import first_line
from ..core.files import process_alive, umask
from .manifest import ENGINE_FORMAT, HF_VIEW_FORMAT, MODEL_FORMAT, REPOSITORY_FORMAT, ModelDirError, manifest_format

ARTIFACT_FORMATS = (MODEL_FORMAT, ENGINE_FORMAT, REPOSITORY_FORMAT, HF_VIEW_FORMAT)  # what --force may replace


STAGING_SUFFIX = ".partial"


def check_output(output: Path, force: bool, keep: tuple[Path, ...] = ()) -> None:
    """Fail before any slow work if the output cannot be written, or replacing it would delete `keep`
    (the inputs of the command, or the working directory), or anything that is not a tfm-export artifact."""
    if not str(output).strip() or str(output) in (".", ".."):
        raise ModelDirError("--output is empty or the current directory; give a new directory's name")
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
    _check_replaceable(output, force)
    parent = target.parent
    if not parent.is_dir():
        raise ModelDirError(f"{parent}: parent directory of --output does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ModelDirError(f"{parent}: not writable; choose a writable --output")


def _check_replaceable(output: Path, force: bool) -> None:
    """An existing output is replaced only with --force, and only if it is empty or a tfm-export artifact: --force
    never deletes a directory of the user's own."""
    if output.exists() and not output.is_dir():
        raise ModelDirError(f"{output}: exists and is not a directory; choose another --output")
    if not output.is_dir() or not any(output.iterdir()):
        return
    if not force:
        raise ModelDirError(f"{output}: directory is not empty; pass --force to replace it "
                            "or choose another --output")
    if manifest_format(output) not in ARTIFACT_FORMATS:
        raise ModelDirError(f"{output}: is not a tfm-export directory (no manifest of ours), so even --force will not "
                            "replace it; choose another --output")


def _owner(staging: Path) -> int | None:
    """The process id in a staging directory's name (`.NAME.PID.random.partial`)."""
    parts = staging.name[:-len(STAGING_SUFFIX)].split(".")
    return int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else None


def _stagings(output: Path) -> Iterator[tuple[Path, int]]:
    """The staging directories beside `output` and the process each belongs to."""
    for staging in output.parent.glob(f".{glob.escape(output.name)}.*{STAGING_SUFFIX}"):
        pid = _owner(staging)
        if pid is not None and staging.is_dir():
            yield staging, pid


def _claim(output: Path) -> None:
    """Remove staging directories of earlier runs that died (SIGKILL, power loss) and refuse while a live
    process is writing the same output."""
    for staging, pid in _stagings(output):
        if pid != os.getpid() and process_alive(pid):
            raise ModelDirError(f"{output}: another tfm-export (process {pid}) is writing it now; wait for it to "
                                "finish or choose another --output")
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def staged_directory(output: Path, force: bool, keep: tuple[Path, ...] = ()) -> Iterator[Path]:
    """Yield a hidden staging directory beside `output`; on success it replaces `output` atomically. The output
    is checked again at the end, since another process may have written it meanwhile."""
    check_output(output, force, keep)
    target = output.resolve()
    _claim(target)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.{os.getpid()}.", suffix=STAGING_SUFFIX,
                                        dir=target.parent))
    except OSError as exc:
        raise ModelDirError(f"{target.parent}: cannot create the output ({exc.strerror}); "
                            "choose a writable --output") from None
    except BaseException:  # Ctrl-C after mkdtemp made the directory but before it returned its name
        for staging, pid in _stagings(target):
            if pid == os.getpid():
                shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        yield staging
        os.chmod(staging, 0o777 & ~umask())  # mkdtemp makes it private; a model directory is meant to be shared
        _check_replaceable(output, force)
        _swap_into_place(staging, target)
    except OSError as exc:  # a full disk or a vanished directory while writing
        shutil.rmtree(staging, ignore_errors=True)
        raise ModelDirError(f"{output}: cannot write it ({exc.strerror or first_line(exc)}); nothing was written, "
                            "free some space or choose another --output") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _swap_into_place(staging: Path, output: Path) -> None:
    """Rename the staging directory onto `output`. An existing output is first renamed onto a fresh empty
    directory of our own (never a guessable name), and put back if the swap fails."""
    old = None
    try:
        if output.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{output.name}.old.", dir=output.parent))
            os.replace(output, old)
        os.replace(staging, output)
    except OSError as exc:
        if old is not None and not output.exists():
            os.replace(old, output)  # put the previous directory back
        raise ModelDirError(f"{output}: cannot replace it ({exc.strerror}); choose another --output") from None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
