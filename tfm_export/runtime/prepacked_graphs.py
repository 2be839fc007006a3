"""The pre-packed graphs: ONNX Runtime's own optimised copy of each graph a CPU load opens, saved with its weights in
an external file (for the decoder, the MatMul weights also in the GEMM layout of this CPU's kernels), so that a
load skips parsing and graph optimisation and memory-maps the weights: a quicker start, and packed weights in file
pages that every process running the model shares rather than on each one's heap. ONNX Runtime still packs each
weight at load (it knows a blob by a hash of the packed bytes) before it swaps the mapped blob in, so the blobs
save memory, not time.

They live in the model directory's `.tfm-cache/`, one entry per graph (entry.json, graph.onnx, graph.onnx.data),
and are written only by a command that names the directory as its output: `tfm-export onnx` and `quantize` make
them for the directory they create, `tfm-export prepack --model DIR` (re)makes them in place. Loading never writes.

An entry is derived, machine-specific data, so it is never trusted: it is keyed by everything it depends on (the
source graph's and weights' sha256 from the manifest, the ONNX Runtime version and build, the CPU kernel key, the
options that shape the optimised graph), and its files' sha256 (recorded in entry.json) are checked on every load,
in background threads while the sessions build, as ModelDir.opening checks the directory. An entry whose key
differs (stale: another ONNX Runtime, CPU or graph; or foreign) or whose files differ (damaged, copied) is not
used: the load says so in one line and opens the directory's own graphs.

The same commands leave `stamps.json` (core.stamps) beside the entries: the identity of every file they hashed,
the directory's and the entries', so that a later load takes a file whose identity is unchanged as checked instead
of reading it again; a file written, replaced or copied since is hashed in full, as without stamps.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import onnxruntime as ort

from ..artifacts.manifest import ModelDirError
from ..artifacts.model_dir import ModelDir
from ..artifacts.staging import STAGING_SUFFIX
from ..core.errors import TfmExportError, first_line
from ..core.files import process_alive, read_json, umask
from ..core.graph_spec import GraphSpec
from ..core.machine import HASH_THREADS, cpu_kernel_key
from ..core.stamps import Stamps
from .session import SessionOptions

log = logging.getLogger(__name__)

ENTRY_FORMAT = 1  # raised when what an entry holds or how it is read changes: older entries are then stale
# inside the model directory; the name on disk is older than the words "pre-packed graphs", and kept so that
# directories made before still open theirs
PREPACKED_DIR = ".tfm-cache"
ENTRY, GRAPH, DATA = "entry.json", "graph.onnx", "graph.onnx.data"
STAMPS = "stamps.json"  # in PREPACKED_DIR: core.stamps for the directory's files and the entries'
EXTERNAL_MIN_BYTES = 1024  # initializers at least this large go to the data file (mapped, not parsed)
REBUILD = "run `tfm-export prepack --model {}` to make it for this machine"
# key fields a user's own session options change: an entry made for other options is simply not for this load
OPTION_FIELDS = ("optimization", "fold_qdq", "prepacked", "shared")
STALE = {"format": "entry format", "graph": "graph", "sha256": "graph", "data_sha256": "graph",
         "onnxruntime": "ONNX Runtime build", "machine": "CPU"}  # what a changed key field means, in a warning

Loader = Callable[[Path, GraphSpec, SessionOptions, ort.SessionOptions | None], Any]


class DamagedEntry(TfmExportError):
    """An entry whose files failed their sha256 check after sessions were opened from them: the load is made
    again without the pre-packed graphs (nothing opened from them has run)."""


def onnxruntime_build() -> str:
    """This ONNX Runtime's version and build (its commit): what the optimised graph and packed layout depend on."""
    from onnxruntime.capi import _pybind_state
    info = getattr(_pybind_state, "get_build_info", lambda: "")()
    return f"{ort.__version__} {info}".strip()


def uses_prepacked(options: SessionOptions) -> bool:
    """Whether a load with these options looks for pre-packed graphs: on the CPU, unless turned off, or the load
    asks for weights read where they lie (no packing, no folding: what an entry was made with)."""
    return (options.prepacked_graphs and not options.on_gpu and not options.tensorrt_ep and options.prepacking
            and options.constant_folding)


def directory_stamps(model_dir: ModelDir, options: SessionOptions) -> Stamps:
    """The stamps a load of the directory trusts (on any device): none with the pre-packed graphs turned off, or where
    .tfm-cache is not the directory's own folder."""
    root = model_dir.path / PREPACKED_DIR
    return Stamps.read(root / STAMPS) if options.prepacked_graphs and not misplaced(root) else Stamps()


def misplaced(root: Path) -> str | None:
    """Why a .tfm-cache is not one the tool reads or replaces, or None: a link (its files would lie outside the
    model directory, where no command of ours reads or writes), or a file where the folder belongs."""
    if root.is_symlink():
        return f"{root}: is a symbolic link; the pre-packed graphs live only inside the model directory"
    if root.exists() and not root.is_dir():
        return f"{root}: is a file, not the folder of pre-packed graphs"
    return None


@dataclass
class PrepackedGraphs:
    """One load's view of a directory's entries: looked up and opened (reading), or written into `build` (a
    staging directory) from the directory's own graphs."""

    model_dir: ModelDir
    stamps: Stamps
    build: Path | None = None
    used: list[str] = field(default_factory=list)  # the graphs this load opened from entries
    # entries not used, and why: warnings for the caller to give once the directory itself proved sound (a damaged
    # directory's own error is then the only line)
    notes: list[str] = field(default_factory=list)
    checks: list[tuple[Path, Future]] = field(default_factory=list)
    pool: ThreadPoolExecutor | None = None

    @property
    def root(self) -> Path:
        return self.model_dir.path / PREPACKED_DIR

    @contextlib.contextmanager
    def opening(self) -> Iterator[PrepackedGraphs]:
        """Sessions opened in the block may come from entries still being hashed; leaving waits for the hashes and
        raises DamagedEntry if one differs, before anything opened here runs."""
        self.pool = ThreadPoolExecutor(HASH_THREADS)
        try:
            yield self
        finally:
            self.pool.shutdown(wait=True)
        damaged = sorted({str(path.relative_to(self.model_dir.path)) for path, ok in self.checks if not ok.result()})
        if damaged:
            raise DamagedEntry(f"{self.model_dir.path}: pre-packed graph files {', '.join(damaged)} differ from the "
                               f"sha256 their entry records (damaged or copied); loading without them; "
                               + REBUILD.format(self.model_dir.path))

    def load(self, graph: str, path: Path, spec: GraphSpec, options: SessionOptions,
             fresh: Callable[[], ort.SessionOptions], shared: Mapping[str, ort.OrtValue], prepacked: bool,
             loader: Loader) -> Any:
        """A session for the directory's `graph` (its file `path`, being checked by the directory): from its entry
        when the entry matches, else from `path` (and, when building, its entry written). `fresh()` makes session
        options carrying the shared initializers, new for each session tried (ONNX Runtime warns of options set
        twice); `prepacked`: whether the session pre-packs its weights (then saved in the entry)."""
        key = entry_key(self.model_dir, graph, options, shared, prepacked)
        if self.build is not None:
            return self._build(self.build / key["graph"], key, path, spec, options, fresh(), prepacked, loader)
        slot = self.root / key["graph"]
        entry = self._matching(slot, key)
        if entry is None:
            return loader(path, spec, options, fresh())
        assert self.pool is not None, "PrepackedGraphs.load outside opening()"
        for name, record in entry["files"].items():  # hashed while ONNX Runtime maps them
            self.checks.append((slot / name, self.pool.submit(self._same_sha256, slot / name, record["sha256"])))
        try:
            session = loader(slot / GRAPH, spec, replace(options, optimization="disable"), fresh())
        except TfmExportError as exc:  # said once: its hashes no longer matter
            self.checks = [(file, ok) for file, ok in self.checks if file.parent != slot]
            self.notes.append(f"{slot}: cannot be loaded ({first_line(exc)}); loading without it; "
                              + REBUILD.format(self.model_dir.path))
            return loader(path, spec, options, fresh())
        self.used.append(key["graph"])
        return session

    def _same_sha256(self, path: Path, expected: str) -> bool:
        try:
            return self.stamps.sha256(path) == expected
        except OSError:
            return False

    def _matching(self, slot: Path, key: dict[str, Any]) -> dict[str, Any] | None:
        """The slot's entry when it has exactly this key and lists its files well-formed; None otherwise, with a
        warning where it is stale or broken (not where there is none, or it was made for other session options)."""
        remake = REBUILD.format(self.model_dir.path)
        problem = misplaced(self.root)
        if problem:
            note = f"{problem}; loading without them; remove it and {remake}"
            if note not in self.notes:
                self.notes.append(note)
            return None
        if not (slot / ENTRY).is_file():
            return None
        try:
            entry = read_json(slot / ENTRY, TfmExportError, remake, max_bytes=1 << 20)
        except TfmExportError as exc:
            self.notes.append(f"{first_line(exc)}; loading without it")
            return None
        found = entry.get("key") if isinstance(entry, dict) and isinstance(entry.get("key"), dict) else {}
        changed = [k for k in key if found.get(k) != key[k]]
        if changed and set(changed) <= set(OPTION_FIELDS):
            log.info("%s: made for other session options (%s); loading without it", slot, ", ".join(changed))
            return None
        if changed:
            what = dict.fromkeys(STALE[k] for k in changed if k in STALE)
            self.notes.append(f"{slot}: made for another {' and '.join(what)}; loading without it; {remake}")
            return None
        files = entry.get("files")
        if not isinstance(files, dict) or GRAPH not in files or set(files) - {GRAPH, DATA} \
                or not all(isinstance(r, dict) and isinstance(r.get("sha256"), str) for r in files.values()) \
                or not all((slot / name).is_file() for name in files) or unlisted(slot, files):
            self.notes.append(f"{slot}: its files are not the ones its entry lists; loading without it; {remake}")
            return None
        return entry

    def _build(self, slot: Path, key: dict[str, Any], path: Path, spec: GraphSpec, options: SessionOptions,
               so: ort.SessionOptions, prepacked: bool, loader: Loader) -> Any:
        """The session from the graph itself, with ONNX Runtime saving its optimised graph (and pre-packed weights)
        into the slot, then hashed into its entry."""
        slot.mkdir()
        so.optimized_model_filepath = str(slot / GRAPH)
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", DATA)
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                    str(EXTERNAL_MIN_BYTES))
        if prepacked:
            so.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")
        session = loader(path, spec, options, so)
        names = [name for name in (GRAPH, DATA) if (slot / name).exists()]
        if GRAPH not in names:
            raise ModelDirError(f"{slot}: ONNX Runtime wrote no optimised graph")
        entry = {"key": key, "files": {name: {"sha256": self.stamps.sha256(slot / name)} for name in names}}
        (slot / ENTRY).write_text(json.dumps(entry, indent=1), encoding="utf-8")
        return session


def unlisted(slot: Path, files: Mapping[str, Any]) -> list[str]:
    """What the slot holds besides its entry and the files the entry lists. ONNX Runtime loads a graph's external
    data only from within the graph's folder (it refuses absolute paths and paths that leave it), so these are the
    only files the entry's graph could load besides those listed; any one of them (a data file whose record was
    dropped from the entry, say) would be loaded without its sha256 checked, so the entry is not used at all."""
    return sorted(p.name for p in slot.iterdir() if p.name != ENTRY and p.name not in files)


def entry_key(model_dir: ModelDir, graph: str, options: SessionOptions, shared: Mapping[str, ort.OrtValue],
              prepacked: bool) -> dict[str, Any]:
    """Everything an entry depends on. The source's sha256 are the manifest's (the directory checks its files
    against them on this very load), so an entry made from other bytes never matches."""
    name, entry = str(getattr(graph, "value", graph)), model_dir.entry(graph)
    return {"format": ENTRY_FORMAT, "graph": name, "sha256": entry.sha256,
            "data_sha256": model_dir.manifest.files.get(entry.data_file),
            "onnxruntime": onnxruntime_build(), "machine": cpu_kernel_key(), "optimization": options.optimization,
            "fold_qdq": options.fold_qdq, "prepacked": prepacked,
            "shared": sorted([name, value.data_type(), list(value.shape())] for name, value in shared.items())}


def stamp_new(directory: Path, digests: Mapping[str, str]) -> None:
    """Stamps of a directory being written that gets no pre-packed graphs (a large model's): its files' sha256 as
    their writer computed them, so that the first load need not read gigabytes to check them."""
    stamps = Stamps(recording=True)
    for name, digest in digests.items():
        stamps.record(directory / name, digest)
    (directory / PREPACKED_DIR).mkdir()
    stamps.write(directory / PREPACKED_DIR / STAMPS)


@contextlib.contextmanager
def staged_prepacked(directory: Path) -> Iterator[Path]:
    """A staging directory for `directory`'s new .tfm-cache, beside it; on success it replaces the old one at once
    (a load sees the old entries or the new, never a mix), on any failure it is removed. Staging left by a process
    that died is removed first. A .tfm-cache that is a link or a file is refused before any work."""
    problem = misplaced(directory / PREPACKED_DIR)
    if problem:
        raise ModelDirError(f"{problem}; remove it, then run `tfm-export prepack --model {directory}` again "
                            "(nothing was changed)")
    for left in directory.glob(f"{glob.escape(PREPACKED_DIR)}.*{STAGING_SUFFIX}"):
        pid = left.name[len(PREPACKED_DIR) + 1:].split(".")[0]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(left, ignore_errors=True)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f"{PREPACKED_DIR}.{os.getpid()}.", suffix=STAGING_SUFFIX, dir=directory))
    except OSError as exc:
        raise ModelDirError(f"{directory}: cannot write its pre-packed graphs ({exc.strerror or first_line(exc)}); "
                            "give a directory you can write") from None
    try:
        yield staging
        os.chmod(staging, 0o777 & ~umask())  # mkdtemp makes it private; the model directory is shared
        _swap_into_place(staging, directory / PREPACKED_DIR)
    except OSError as exc:
        raise ModelDirError(f"{directory}: cannot write its pre-packed graphs ({exc.strerror or first_line(exc)}); "
                            "nothing was changed") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _swap_into_place(staging: Path, target: Path) -> None:
    """Rename the staging directory onto `target`; an old one is moved aside first and removed after (a process
    that mapped its files keeps them: unlinked files stay readable while mapped). On a failure the old one is put
    back and nothing is left beside it."""
    old, moved = None, False
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f"{PREPACKED_DIR}.old.", dir=target.parent))
    try:
        if old is not None:
            os.replace(target, old)
            moved = True
        os.replace(staging, target)
    except OSError:
        if moved and not target.exists():
            os.replace(old, target)
            old = None
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
