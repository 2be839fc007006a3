"""sha256 of files known by their identity, so a load need not hash again what a writer hashed.

A stamp binds a file's identity (device, inode, size, modification and change times in nanoseconds) to the sha256
its contents had when it was stamped. Any write through the file system changes the change time (ctime), which no
program can set back, and a copy or a replacement is another inode; so a file whose identity is the stamp's is the
file that was hashed, and its recorded sha256 is used instead of reading it. Anything else is hashed as before.
What stamps cannot see is damage below the file system (a disk's bit rot); `TFM_PREPACKED_GRAPHS=off` hashes everything.

Stamps are written only by a command that writes the directory they describe (`tfm-export onnx`, `quantize`,
`generate`, `prepack`), after every file they cover has been hashed and has not changed since; reading them never
writes.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import TfmExportError
from .files import file_sha256, is_sha256, read_json

log = logging.getLogger(__name__)

STAMPS_FORMAT = 1
STAMPS_MAX_BYTES = 1 << 20  # a directory's stamps are a few hundred bytes per file
# a stamp is made only once its file's ctime is this far in the past: file systems keep coarse clocks (a tick of a
# few milliseconds), so a write in the same tick as the hashing would otherwise leave the stamp's identity unchanged
SETTLE_NS = 1_000_000_000

Identity = tuple[int, int, int, int, int]


def identity(path: Path) -> Identity:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


@dataclass
class Stamps:
    """The stamps one load trusts (`known`) and, when `recording`, those it makes from what it hashes."""

    known: dict[Identity, str] = field(default_factory=dict)
    recording: bool = False
    made: dict[Identity, str] = field(default_factory=dict)
    hits: int = 0  # files whose sha256 came from a stamp
    hashed: int = 0  # files read and hashed

    @classmethod
    def read(cls, path: Path) -> Stamps:
        """The stamps in `path`; none (everything hashed) where it is missing or not a stamps file of ours."""
        try:
            data = read_json(path, TfmExportError, "it is ignored", max_bytes=STAMPS_MAX_BYTES)
            if data["format"] != STAMPS_FORMAT:
                raise ValueError(f"format {data['format']!r}")
            known = {tuple(int(v) for v in row[:5]): row[5] for row in data["files"] if is_sha256(row[5])}
        except FileNotFoundError:
            return cls()
        except (TfmExportError, OSError, ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            log.info("%s: not used (%s); every file is hashed", path, exc)
            return cls()
        return cls(known=known)  # type: ignore[arg-type]

    def sha256(self, path: Path) -> str:
        """The file's sha256: its stamp's where its identity is the stamp's, else read and hashed (and stamped when
        recording, if it did not change while it was read)."""
        before = identity(path)
        if before in self.known:
            self.hits += 1
            if self.recording:  # still the file stamped: stamped again
                self.made[before] = self.known[before]
            return self.known[before]
        digest = file_sha256(path)
        self.hashed += 1
        if self.recording and identity(path) == before:
            self.made[before] = digest
        return digest

    def record(self, path: Path, digest: str) -> None:
        """Stamp a file with a sha256 its writer computed from the very bytes it wrote (no read-back)."""
        self.made[identity(path)] = digest

    def write(self, path: Path) -> None:
        """Save the stamps made, once every stamped file's last change is SETTLE_NS old."""
        newest = max((key[4] for key in self.made), default=0)
        wait = (newest + SETTLE_NS - time.time_ns()) / 1e9
        if wait > 0:
            time.sleep(wait)
        files = [[*key, digest] for key, digest in sorted(self.made.items())]
        path.write_text(json.dumps({"format": STAMPS_FORMAT, "files": files}), encoding="utf-8")

    def summary(self) -> str:
        return f"{self.hits} file(s) known by their stamps, {self.hashed} hashed"
