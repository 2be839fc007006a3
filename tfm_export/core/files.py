"""Reading and writing files the way every command must: hashing, files named by a manifest or
checkpoint kept inside their directory, bounded JSON, and outputs written whole or not at all.

Writes go to a fresh temporary file (created exclusively, so a link planted at a guessable name is
never followed) beside the target and are renamed into place; a target that is a symbolic link is
written through (the file it points to is replaced, the link stays); a target that is a device, pipe
or socket (/dev/null, /dev/stdout, a FIFO) is written directly, never renamed over. A new file gets
the mode any program's new file gets (0666 less the umask), a replaced one keeps its mode. Kept free of
PyTorch and ONNX so the runtime can use it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

from .errors import TfmExportError, first_line

MAX_JSON_BYTES = 512 << 20  # manifests are kilobytes; the largest tokenizers JSON files are tens of megabytes
PARTIAL_SUFFIX = ".partial"  # an interrupted streamed output keeps what it wrote under its name + this


def process_alive(pid: int) -> bool:
    """Whether a process with this id exists (one owned by another user counts): a staging directory's owner."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_sha256(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def contained_file(directory: Path, name: object, error: type[TfmExportError], what: str, remedy: str) -> Path:
    """`directory / name` when `name` is a plain file name whose real path (links followed) lies inside
    `directory`: a checkpoint or manifest never makes a command read anything outside its own directory."""
    if not isinstance(name, str) or not name or "\0" in name or Path(name).name != name or name in (".", ".."):
        raise error(f"{directory}: {what} {name!r} is not a plain file name in the directory; {remedy}")
    path = directory / name
    root = directory.resolve()
    if root not in path.resolve().parents:
        raise error(f"{path}: {what} points outside {directory} (a link?); {remedy}")
    if not path.is_file():
        raise error(f"{path}: {what} is missing or not a file; {remedy}")
    return path


def regular_file_size(path: Path, error: type[TfmExportError], remedy: str) -> int:
    """The size of a file about to be read whole; a FIFO or device is refused (its read would block, or
    never end). FileNotFoundError passes through for the caller to word."""
    info = path.stat()
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{path}: is a pipe, device or socket, not a regular file; {remedy}")
    return info.st_size


def read_json(path: Path, error: type[TfmExportError], remedy: str, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """A JSON file's value; too large, not UTF-8, malformed or absurdly nested is one line, not a traceback."""
    try:
        return json.loads(read_regular_file(path, error, remedy, max_bytes).decode("utf-8"))
    except FileNotFoundError:
        raise
    except UnicodeDecodeError:
        raise error(f"{path}: not UTF-8 text; {remedy}") from None
    except RecursionError:
        raise error(f"{path}: JSON nested too deeply to read; {remedy}") from None
    except (OSError, ValueError) as exc:
        raise error(f"{path}: unreadable JSON ({first_line(exc, 120)}); {remedy}") from None


def read_regular_file(path: Path, error: type[TfmExportError], remedy: str, max_bytes: int) -> bytes:
    """A regular file's bytes, at most `max_bytes`. Opened without blocking (a FIFO's open would wait for a writer)
    and judged on the open descriptor, so a name swapped for a pipe or a link to /dev/zero after any earlier check
    is still refused, and a file that grows while it is read stops at the limit. FileNotFoundError passes through."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{path}: is a pipe, device or socket, not a regular file; {remedy}")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise error(f"{path}: {max(info.st_size, len(data)):,} bytes or more, more than the {max_bytes:,} a file of "
                    f"its kind may have here; {remedy}")
    return data


def _is_special(path: Path) -> bool:
    """A device, pipe or socket: written in place, never replaced by a regular file."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def umask() -> int:
    """The process's umask (read by setting it, so set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _temporary_beside(real: Path) -> Path:
    """A fresh, exclusively created file beside `real`, with the mode `real` has or, if new, would get
    (mkstemp makes it 0600, which would make every replaced or new output private)."""
    fd, tmp = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name}.", suffix=".tmp")
    try:
        mode = stat.S_IMODE(real.stat().st_mode) if real.is_file() else 0o666 & ~umask()
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return Path(tmp)


def write_atomically(files: Mapping[Path, Callable[[Path], object]], what: str = "output",
                     error: type[TfmExportError] = TfmExportError) -> None:
    """Each writer fills a fresh temporary file beside its target, then all are renamed into place: a
    failure (full disk, Ctrl-C) leaves every target as it was and no temporary file behind. Links are
    written through; devices and pipes are written directly."""
    temps: dict[Path, Path] = {}
    try:
        for target, write in files.items():
            if _is_special(target):  # links followed: /dev/stdout is a link to a pipe that resolve() cannot name
                write(target)
                continue
            real = _real_target(target, what, error)
            temps[real] = _temporary_beside(real)
            write(temps[real])
        for real, tmp in temps.items():
            os.replace(tmp, real)
    except TfmExportError:
        raise
    except Exception as exc:  # OSError, torch's RuntimeError on a full disk, a library's plain Exception
        raise _write_error(next(iter(files)), what, exc, error) from None
    finally:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)


def _real_target(target: Path, what: str, error: type[TfmExportError]) -> Path:
    """The file a write replaces: a link's target (written through), never a directory."""
    real = target.resolve() if target.is_symlink() else target
    if real.is_dir():
        raise error(f"{target}: is a directory; cannot write {what} there, choose a file path")
    return real


def _write_error(target: Path, what: str, exc: Exception, error: type[TfmExportError]) -> TfmExportError:
    reason = getattr(exc, "strerror", None) or first_line(exc)
    return error(f"{target}: cannot write {what} ({reason}); choose a writable path")


@contextlib.contextmanager
def streamed_text(path: Path, what: str = "lines") -> Iterator[TextIO]:
    """A UTF-8 text file written piece by piece (the caller flushes as it goes) into a temporary file
    beside `path`, renamed into place when the block ends: whole or not at all, as write_atomically. Ctrl-C
    (KeyboardInterrupt) keeps what was written so far under `path` + PARTIAL_SUFFIX, never under `path`
    itself, and says so in the KeyboardInterrupt it raises; an error leaves nothing. Devices and pipes are
    written directly. `what` names the contents, in the plural ("translations")."""
    if _is_special(path):
        with open(path, "w", encoding="utf-8") as f:
            yield f
        return
    real = _real_target(path, what, TfmExportError)
    tmp = None
    try:
        tmp = _temporary_beside(real)
        with open(tmp, "w", encoding="utf-8") as f:
            yield f
        os.replace(tmp, real)
    except KeyboardInterrupt:
        if tmp is not None and tmp.exists() and tmp.stat().st_size:
            partial = real.with_name(real.name + PARTIAL_SUFFIX)
            os.replace(tmp, partial)
            raise KeyboardInterrupt(f"the {what} done so far are in {partial} ({path} is unchanged)") from None
        raise
    except OSError as exc:
        raise _write_error(path, what, exc, TfmExportError) from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


def write_text_atomically(path: Path, text: str, what: str = "output") -> None:
    """A UTF-8 text file, written whole or not at all."""
    write_atomically({path: lambda tmp: tmp.write_text(text, encoding="utf-8")}, what)


def check_output_path(path: Path | None, option: str, inputs: Iterable[Path] = (), directory: bool = False) -> None:
    """Fail before any slow work when an output cannot or must not be written: empty, of the wrong kind, in
    a place that cannot be made or written, or one of the command's inputs (or inside an input directory).
    Missing parent folders are made (as for `verify --report`)."""
    if path is None:
        return
    try:
        _check_output_path(path, option, inputs, directory)
    except OSError as exc:  # a name too long, a loop of links: what the checks below cannot word
        raise TfmExportError(f"{path}: cannot be used ({exc.strerror or exc}); choose another {option}") from None


def _check_output_path(path: Path, option: str, inputs: Iterable[Path], directory: bool) -> None:
    if not str(path).strip() or str(path) in (".", ".."):
        raise TfmExportError(f"{option} is empty or the current directory; give a file name")
    real = path.resolve()
    for given in inputs:
        source = Path(given).resolve()
        if real == source or (source.is_dir() and source in real.parents):
            raise TfmExportError(f"{path}: is the input {given} (or inside it); writing there would destroy it, "
                                 f"choose another {option}")
    if _is_special(real) and not directory:
        return
    folder = path if directory else path.parent
    if (real.is_dir() and not directory) or (path.exists() and directory and not real.is_dir()):
        raise TfmExportError(f"{path}: is a {'directory' if real.is_dir() else 'file'}; choose another {option}")
    blocking = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise TfmExportError(f"{blocking}: is a file, not a folder; choose another {option}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TfmExportError(f"{folder}: cannot create it ({exc.strerror}); choose another {option}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise TfmExportError(f"{folder}: not writable; choose another {option}")
