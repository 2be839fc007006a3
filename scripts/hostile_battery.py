#!/usr/bin/env python3
"""Adversarial battery: hostile input, faults and proof that can fail, and everyday use (streaming, file modes,
errors that name the fix).

Tries tfm-export / tfm-run the way a hostile or unlucky user would (poisoned checkpoints and manifests,
tampered files, planted links, devices and pipes as outputs, signals, full disks, absurd options) and
prints one line per case:

    <verdict> <class> <name>: <short reason>

Verdicts that are fine: `ok` (exit 0, result checked where an oracle is cheap), `clean-error` (non-zero
exit, stderr one line starting with "Error:" or "interrupted"), `skipped` (the machine cannot set the
case up). Findings: wrote-outside, input-modified, silent-wrong, crash, hang, traceback, leftover,
multi-line-error, refused (a valid request failed), no-fix-named (a one-line error that does not say what to do
where the case knows the fix). Exit status 1 on any finding.

    python3 scripts/hostile_battery.py [--bin .venv/bin] [-k SUBSTR] [--list] [--keep] [--timeout 60]

Runs from a clean clone after `make setup`. Everything it writes lives in one temporary directory
(tempfile.mkdtemp(prefix="tfm-hostile-")), removed at the end (kept with --keep). The scratch tree is
snapshotted (sha256 of every file, link targets, node types) before and after each case, so any file
that appears or changes outside the case's named outputs is reported.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FINDINGS = ("wrote-outside", "input-modified", "silent-wrong", "crash", "hang", "traceback", "leftover",
            "multi-line-error", "refused", "no-fix-named")
FINE = ("ok", "clean-error", "skipped")
# progress output, not part of an error: bench's log lines and a progress bar's last redraw (tqdm)
PROGRESS_RE = re.compile(r"^\[(bench|progress)\] |^(?!Error:)[^|]*\d+%\|[^|]*\| *\d+/\d+ ")
LEFTOVER_RE = re.compile(r"^\..*(\.partial|\.tmp|\.old[.-].*|\.old)$")
DEMO_SRC, DEMO_TGT = "forty-two", "quarante-deux"
TINY_SENT = "w1 w2 w3"


# --------------------------------------------------------------------------------------------------
# helper run by the repository's own Python (torch, onnx) to make hostile checkpoints and graphs
# --------------------------------------------------------------------------------------------------

HELPER = r'''
import json, math, os, sys
from argparse import Namespace
from pathlib import Path

def do_ckpt(src, dst, code):
    import torch
    ck = torch.load(src, map_location="cpu", weights_only=False)
    env = {"ck": ck, "torch": torch, "math": math, "os": os, "Namespace": Namespace,
           "sd": ck.get("model"), "cfg": ck.get("config")}
    exec(code, env)
    out = env.get("out", ck)
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    if isinstance(out, bytes):
        Path(dst).write_bytes(out)
    else:
        torch.save(out, dst)

def do_tamper_graph(src, dst):
    import onnx, numpy as np
    from onnx import numpy_helper
    m = onnx.load(src)
    for init in m.graph.initializer:
        a = numpy_helper.to_array(init)
        if a.dtype == np.float32 and a.size > 1:
            init.CopyFrom(numpy_helper.from_array((a * 0.5 + 0.25).astype(np.float32), init.name))
            break
    onnx.save(m, dst)

def do_extdata(mdir, graph):
    import onnx
    p = Path(mdir) / graph
    m = onnx.load(str(p))
    onnx.save_model(m, str(p), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=graph + ".data", size_threshold=1024)

jobs = json.loads(Path(sys.argv[1]).read_text())
bad = 0
for job in jobs:
    try:
        globals()["do_" + job.pop("kind")](**job)
    except Exception as exc:
        bad += 1
        print(f"helper failed on {job}: {exc!r}", file=sys.stderr)
sys.exit(1 if bad else 0)
'''


# --------------------------------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------------------------------

@dataclass
class Result:
    argv: list[str]
    rc: int | None
    out: str
    err: str
    timed_out: bool
    seconds: float
    timeout: float

    @property
    def err_lines(self) -> list[str]:
        lines = []
        for line in self.err.split("\n"):
            line = line.split("\r")[-1].strip()  # progress bars redraw with carriage returns
            if line and not PROGRESS_RE.match(line):
                lines.append(line)
        return lines

    @property
    def out_lines(self) -> list[str]:
        return self.out.splitlines()


def base_problem(r: Result) -> tuple[str, str] | None:
    """hang / crash / traceback, whatever the case expected."""
    if r.timed_out:
        return "hang", f"no exit within {r.timeout:.0f}s"
    if r.rc is not None and r.rc < 0:
        try:
            name = signal.Signals(-r.rc).name
        except ValueError:
            name = str(-r.rc)
        return "crash", f"killed by {name}"
    if "Traceback" in r.err:
        lines = r.err_lines
        return "traceback", (lines[-1] if lines else "Traceback")[:160]
    return None


def is_clean_error(r: Result) -> bool:
    lines = r.err_lines
    return (r.rc not in (0, None) and len(lines) == 1
            and (lines[0].startswith("Error:") or lines[0].startswith("interrupted")))


KEEP = [False]  # --keep: leave each case's directory for inspection
_ROOT = ["\0"]  # the scratch directory, shown as $T in reasons


def short(text: str, n: int = 110) -> str:
    text = " ".join(text.replace(_ROOT[0], "$T").split())
    return text if len(text) <= n else text[: n - 3] + "..."


# --------------------------------------------------------------------------------------------------
# tree snapshots
# --------------------------------------------------------------------------------------------------

_HASHES: dict[tuple[int, int, int, int], str] = {}


def _hash(path: str, st: os.stat_result) -> str:
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        h = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        except OSError as exc:
            return f"unreadable:{exc.errno}"
        _HASHES[key] = h.hexdigest()
    return _HASHES[key]


def snapshot(root: Path) -> dict[str, tuple]:
    snap: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue
            m = st.st_mode
            if stat.S_ISLNK(m):
                snap[p] = ("link", os.readlink(p))
            elif stat.S_ISREG(m):
                snap[p] = ("file", _hash(p, st))
            elif stat.S_ISDIR(m):
                snap[p] = ("dir",)
            elif stat.S_ISFIFO(m):
                snap[p] = ("fifo",)
            else:
                snap[p] = ("special", m)
    return snap


def under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


DEVICES = ("/dev/null", "/dev/full")


def device_state() -> dict[str, tuple]:
    state = {}
    for dev in DEVICES:
        try:
            st = os.lstat(dev)
            state[dev] = (stat.S_IFMT(st.st_mode), st.st_rdev)
        except OSError:
            state[dev] = None
    return state


# --------------------------------------------------------------------------------------------------
# the battery's context: fixtures built once
# --------------------------------------------------------------------------------------------------

def child_setup(gb: float | None = None) -> Callable[[], None]:
    """Run in each child before exec: SIGINT back to its default (a battery started in the background with `&`
    has SIGINT ignored, and children inherit that, so Ctrl-C cases would test nothing), and optionally a cap
    on the address space, for cases that could make a careless tool allocate tens of GB on a machine other
    people share (a MemoryError then shows up as whatever the tool makes of it)."""
    def setup() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if gb:
            import resource
            resource.setrlimit(resource.RLIMIT_AS, (int(gb * (1 << 30)),) * 2)
    return setup


class SetupError(Exception):
    pass


class Ctx:
    def __init__(self, bin_dir: Path, root: Path, timeout: float):
        self.bin = bin_dir
        self.root = root
        self.timeout = timeout
        self.fx = root / "fx"
        self.fx.mkdir()
        self.cases = root / "cases"
        self.cases.mkdir()
        self._cache: dict[str, Any] = {}
        # as a user's shell runs the commands: no TFM_ settings, stdout block-buffered when it is a pipe
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TFM_") and k != "PYTHONUNBUFFERED"}
        self.env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
        self.helper = root / "helper.py"
        self.helper.write_text(HELPER)

    # -- running ------------------------------------------------------------------------------------
    def argv(self, args: list[str]) -> list[str]:
        if args and args[0] in ("tfm-export", "tfm-run", "python"):
            return [str(self.bin / args[0])] + [str(a) for a in args[1:]]
        return [str(a) for a in args]

    def sh_quote(self, args: list[str]) -> str:
        import shlex
        return " ".join(shlex.quote(a) for a in self.argv(args))

    def run(self, args: list[str], cwd: Path, timeout: float | None = None, input: bytes | None = None,
            stdin: Any = subprocess.DEVNULL, env: dict | None = None, mem_gb: float | None = None) -> Result:
        argv = self.argv(args)
        timeout = timeout or self.timeout
        start = time.monotonic()
        p = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.PIPE if input is not None else stdin,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env or self.env,
                             start_new_session=True, preexec_fn=child_setup(mem_gb))
        timed_out = False
        try:
            out, err = p.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, err = p.communicate()
        return Result(argv, p.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                      timed_out, time.monotonic() - start, timeout)

    def must(self, args: list[str], what: str, timeout: float | None = None) -> Result:
        r = self.run(args, cwd=self.fx, timeout=timeout or 4 * self.timeout)
        if r.rc != 0:
            raise SetupError(f"{what}: exit {r.rc}: {short(r.err, 300)}")
        return r

    def helper_jobs(self, jobs: list[dict]) -> None:
        spec = self.root / f"jobs-{len(self._cache)}-{time.monotonic_ns()}.json"
        spec.write_text(json.dumps(jobs))
        try:
            r = self.run(["python", self.helper, spec], cwd=self.fx, timeout=10 * self.timeout)
        finally:
            spec.unlink()
        if r.rc != 0:
            raise SetupError(f"helper: {short(r.err, 400)}")

    def cached(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = make()
        value = self._cache[key]
        if isinstance(value, SetupError):
            raise value
        return value

    # -- fixtures -----------------------------------------------------------------------------------
    def tiny_ck(self) -> Path:
        def make():
            d = self.fx / "tiny-ck"
            self.must(["tfm-export", "random-checkpoint", "--d-model", 16, "--heads", 2, "--layers", 1, "--ffn", 32,
                       "--vocab-size", 40, "--output", d], "random-checkpoint")
            return d
        return self.cached("tiny_ck", make)

    def tiny(self) -> Path:
        def make():
            d = self.fx / "tiny-model"
            self.must(["tfm-export", "onnx", "--checkpoint", self.tiny_ck() / "ckpt.pt", "--output", d], "onnx tiny")
            return d
        return self.cached("tiny", make)

    def tiny_ref(self) -> str:
        def make():
            r = self.must(["tfm-run", "translate", "--model", self.tiny(), TINY_SENT], "translate tiny")
            return r.out
        return self.cached("tiny_ref", make)

    def demo_ck(self) -> Path:
        def make():
            d = self.fx / "demo-ck"
            d.mkdir()
            for name in ("ckpt.pt", "tokenizer.json"):
                shutil.copyfile(REPO / "models/demo" / name, d / name)
            return d
        return self.cached("demo_ck", make)

    def demo(self) -> Path:
        def make():
            d = self.fx / "demo-model"
            self.must(["tfm-export", "onnx", "--checkpoint", self.demo_ck() / "ckpt.pt", "--output", d], "onnx demo")
            r = self.must(["tfm-run", "translate", "--model", d, DEMO_SRC], "translate demo")
            if r.out.strip() != DEMO_TGT:
                raise SetupError(f"demo model translates {DEMO_SRC!r} as {r.out.strip()!r}")
            return d
        return self.cached("demo", make)

    def int8(self) -> Path:
        def make():
            d = self.fx / "tiny-int8"
            self.must(["tfm-export", "quantize", "--model", self.tiny(), "--precision", "int8", "--mode", "dynamic",
                       "--output", d], "quantize int8")
            return d
        return self.cached("int8", make)

    def calib(self) -> Path:
        def make():
            p = self.fx / "calib.txt"
            p.write_text("".join(f"w{i} w{(i * 7) % 30} w{(i * 3) % 30}\n" for i in range(12)))
            return p
        return self.cached("calib", make)

    def calib_big(self) -> Path:
        """Enough calibration sentences that quantize runs for several seconds (room for a signal)."""
        def make():
            p = self.fx / "calib-big.txt"
            p.write_text("".join(f"w{i % 36} w{(i * 7) % 36} w{(i * 3) % 36} w{(i * 5) % 36}\n" for i in range(150)))
            return p
        return self.cached("calib_big", make)

    def seed_vocab(self) -> Path:
        def make():
            p = self.fx / "seed-vocab.txt"
            p.write_text("\n".join(["<unk>", "<blank>", "<s>", "</s>"] + [f"w{i}" for i in range(36)]) + "\n")
            return p
        return self.cached("seed_vocab", make)

    def outside_tok(self) -> Path:
        """A valid tokenizer outside every checkpoint/model directory (opening it = a containment failure)."""
        def make():
            d = self.fx / "outside"
            d.mkdir()
            shutil.copyfile(self.tiny_ck() / "tokenizer.json", d / "tokenizer.json")
            shutil.copyfile(self.demo_ck() / "tokenizer.json", d / "demo-tokenizer.json")
            os.mkfifo(d / "fifo.json")
            return d
        return self.cached("outside", make)

    def ckpts(self) -> dict[str, Path]:
        """Every hostile checkpoint, made in one helper run: name -> directory with ckpt.pt (+ tokenizer)."""
        def make():
            base = {"tiny": self.tiny_ck() / "ckpt.pt", "demo": self.demo_ck() / "ckpt.pt"}
            tok = {"tiny": self.tiny_ck() / "tokenizer.json", "demo": self.demo_ck() / "tokenizer.json"}
            self.outside_tok()
            jobs, dirs = [], {}
            for name, (b, code) in CKPT_VARIANTS.items():
                d = self.fx / "ckpts" / name
                d.mkdir(parents=True)
                shutil.copyfile(tok[b], d / "tokenizer.json")
                code = code.replace("@FX@", str(self.fx))
                jobs.append({"kind": "ckpt", "src": str(base[b]), "dst": str(d / "ckpt.pt"), "code": code})
                dirs[name] = d
            self.helper_jobs(jobs)
            return dirs
        return self.cached("ckpts", make)

    def graphs(self) -> dict[str, Path]:
        """Modified-but-valid graphs and an external-data model (one helper run)."""
        def make():
            d = self.fx / "graphs"
            d.mkdir()
            tiny, mx = self.tiny(), self.fx / "tiny-extdata"
            shutil.copytree(tiny, mx)
            jobs = [{"kind": "tamper_graph", "src": str(tiny / g), "dst": str(d / g)}
                    for g in ("encoder.onnx", "decoder_step.onnx")]
            jobs.append({"kind": "extdata", "mdir": str(mx), "graph": "encoder.onnx"})
            self.helper_jobs(jobs)
            rehash(mx, extra=["encoder.onnx.data"])
            return {"encoder.onnx": d / "encoder.onnx", "decoder_step.onnx": d / "decoder_step.onnx", "extdata": mx}
        return self.cached("graphs", make)

    def tmpfs(self) -> Path | None:
        """A 256 KiB tmpfs (root only); None where mounting is not permitted."""
        def make():
            d = self.root / "tmpfs"
            d.mkdir()
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(d)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                d.rmdir()
                return None
            self._cache["tmpfs_mounted"] = True
            return d
        return self.cached("tmpfs", make)

    def cleanup(self) -> None:
        if self._cache.get("tmpfs_mounted"):
            subprocess.run(["umount", str(self.root / "tmpfs")], capture_output=True)
        for p in self.root.rglob("*"):  # immutable flags would stop rmtree
            if p.is_dir() and not p.is_symlink() and p.name.startswith("immutable"):
                subprocess.run(["chattr", "-i", str(p)], capture_output=True)


# --------------------------------------------------------------------------------------------------
# model directory surgery
# --------------------------------------------------------------------------------------------------

def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def save_manifest(d: Path, m: Any) -> None:
    (d / "manifest.json").write_text(json.dumps(m, indent=2))


def rehash(d: Path, extra: list[str] = ()) -> None:
    """Make the manifest agree with whatever files it now names (so only containment/contract checks can
    refuse them)."""
    m = load_manifest(d)
    for entry in m["graphs"].values():
        p = d / entry["file"]
        if p.is_file():
            entry["sha256"] = sha(p)
    names = set(m.get("files", {})) | set(extra)
    tok = m.get("tokenizer", {})
    names |= {tok.get("source"), tok.get("target")} - {None}
    files = {}
    for name in names:
        p = d / name
        if isinstance(name, str) and p.is_file():
            files[name] = sha(p)
        elif name in m.get("files", {}):
            files[name] = m["files"][name]
    m["files"] = files
    save_manifest(d, m)


def set_dotted(m: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = m
    for p in parts[:-1]:
        node = node[p]
    node[parts[-1]] = value


def del_dotted(m: dict, dotted: str) -> None:
    parts = dotted.split(".")
    node = m
    for p in parts[:-1]:
        node = node[p]
    del node[parts[-1]]


def nested_json(depth: int, kind: str = "list") -> str:
    if kind == "list":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


# --------------------------------------------------------------------------------------------------
# a case and its trial
# --------------------------------------------------------------------------------------------------

@dataclass
class Case:
    name: str
    cls: str
    fn: Callable[[Trial], tuple[str, str]]


CASES: list[Case] = []


def add(cls: str, name: str, fn: Callable[[Trial], tuple[str, str]]) -> None:
    if any(c.name == name for c in CASES):
        raise ValueError(f"duplicate case {name}")
    CASES.append(Case(name, cls, fn))


class Trial:
    def __init__(self, ctx: Ctx, case: Case):
        self.ctx = ctx
        self.case = case
        self.dir = ctx.cases / re.sub(r"[^A-Za-z0-9_.-]", "_", case.name)
        self.dir.mkdir()
        self.outputs: list[str] = []
        self.inputs: list[str] = []
        self.decoys: list[str] = []
        self.before: dict | None = None
        self.notes: list[str] = []
        self.threads: list[threading.Thread] = []
        self.after: list[Callable[[], None]] = []  # run once the tree has been compared

    # -- setup ----------------------------------------------------------------------------------------
    def p(self, *parts: str) -> Path:
        return self.dir.joinpath(*parts)

    def output(self, *paths: Path) -> None:
        self.outputs += [str(p) for p in paths]

    def input(self, *paths: Path) -> None:
        self.inputs += [str(p) for p in paths]

    def decoy(self, path: Path, content: bytes = b"DECOY: must never change\n") -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        self.decoys.append(str(path))
        return path

    def copy_model(self, src: Path, name: str = "m", protect: bool = True) -> Path:
        dst = self.p(name)
        shutil.copytree(src, dst, symlinks=True)
        if protect:
            self.input(dst)
        return dst

    def copy_ck(self, src_dir: Path, name: str = "ck", protect: bool = True) -> Path:
        dst = self.p(name)
        shutil.copytree(src_dir, dst, symlinks=True)
        if protect:
            self.input(dst)
        return dst / "ckpt.pt"

    def text(self, name: str, content: str | bytes, protect: bool = True) -> Path:
        path = self.p(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            content = content.encode("utf-8")
        path.write_bytes(content)
        if protect:
            self.input(path)
        return path

    # -- running ----------------------------------------------------------------------------------------
    def snap(self) -> None:
        if self.before is None:
            self.before = snapshot(self.ctx.root)

    def run(self, *args: Any, timeout: float | None = None, input: bytes | None = None, stdin: Any = None,
            env: dict | None = None, mem_gb: float | None = None, cwd: Path | None = None) -> Result:
        self.snap()
        return self.ctx.run(list(args), cwd=cwd or self.dir, timeout=timeout, input=input,
                            stdin=subprocess.DEVNULL if stdin is None else stdin,
                            env=None if env is None else {**self.ctx.env, **env}, mem_gb=mem_gb)

    def sh(self, script: str, timeout: float | None = None) -> Result:
        self.snap()
        return self.ctx.run(["sh", "-c", script], cwd=self.dir, timeout=timeout)

    def popen(self, *args: Any) -> subprocess.Popen:
        self.snap()
        return subprocess.Popen(self.ctx.argv(list(args)), cwd=self.dir, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.ctx.env,
                                start_new_session=True, preexec_fn=child_setup())

    def wait(self, p: subprocess.Popen, args: list, timeout: float | None = None, start: float | None = None
             ) -> Result:
        timeout = timeout or self.ctx.timeout
        start = start or time.monotonic()
        timed_out = False
        try:
            out, err = p.communicate(timeout=max(1.0, timeout - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, err = p.communicate()
        return Result([str(a) for a in args], p.returncode, out.decode("utf-8", "replace"),
                      err.decode("utf-8", "replace"), timed_out, time.monotonic() - start, timeout)

    def fifo_reader(self, path: Path) -> dict:
        """A thread that reads a FIFO to its end (unblocked by `release_fifo` if nothing ever writes)."""
        box: dict = {"data": b""}

        def read():
            with open(path, "rb") as f:
                box["data"] = f.read()
        th = threading.Thread(target=read, daemon=True)
        th.start()
        box["thread"] = th
        box["path"] = path
        self.threads.append(th)
        return box

    def release_fifo(self, box: dict) -> bytes:
        th = box["thread"]
        th.join(0.5)
        if th.is_alive():
            try:
                fd = os.open(box["path"], os.O_WRONLY | os.O_NONBLOCK)
                os.close(fd)
            except OSError:
                pass
            th.join(5)
        return box["data"]

    # -- judging ---------------------------------------------------------------------------------------
    def error(self, r: Result, why: str = "") -> tuple[str, str]:
        """The command must refuse (one clean line)."""
        bad = base_problem(r)
        if bad:
            return bad
        if r.rc == 0:
            return "silent-wrong", f"accepted (exit 0){': ' + why if why else ''}; out={short(r.out, 60)!r}"
        if is_clean_error(r):
            return "clean-error", short(r.err_lines[0])
        return "multi-line-error", (f"exit {r.rc}, {len(r.err_lines)} stderr lines: "
                                    f"{short(' | '.join(r.err_lines[-3:]))}")

    def names_fix(self, r: Result, *fragments: str) -> tuple[str, str]:
        """The command must refuse in one clean line that contains every fragment (the fix)."""
        verdict, reason = self.error(r)
        if verdict != "clean-error":
            return verdict, reason
        missing = [f for f in fragments if f not in r.err_lines[0]]
        return ("no-fix-named", f"lacks {missing[0]!r}: {short(r.err_lines[0])}") if missing else (verdict, reason)

    def ok(self, r: Result, check: Callable[[Result], str | None] | None = None) -> tuple[str, str]:
        """The command must succeed, and check(r) must return None."""
        bad = base_problem(r)
        if bad:
            return bad
        if r.rc != 0:
            if is_clean_error(r):
                return "refused", f"valid request refused: {short(r.err_lines[0])}"
            return "multi-line-error", f"exit {r.rc}: {short(' | '.join(r.err_lines[-3:]))}"
        problem = check(r) if check else None
        if problem:
            return "silent-wrong", problem
        return "ok", f"exit 0 ({r.seconds:.1f}s)"

    def either(self, r: Result, check: Callable[[Result], str | None] | None = None) -> tuple[str, str]:
        """A clean refusal, or success with a right result."""
        bad = base_problem(r)
        if bad:
            return bad
        if r.rc == 0:
            problem = check(r) if check else None
            return ("silent-wrong", problem) if problem else ("ok", f"exit 0 ({r.seconds:.1f}s)")
        return self.error(r)

    def interrupted(self, r: Result, check_done: Callable[[], str | None]) -> tuple[str, str]:
        """After a signal: exit 130 + "interrupted", or (signal arrived after the work) exit 0 and a full output."""
        bad = base_problem(r)
        if bad:
            return bad
        if r.rc == 0:
            problem = check_done()
            return ("silent-wrong", problem) if problem else ("ok", "finished before the signal; output complete")
        if r.rc == 130 and r.err_lines == ["interrupted"]:
            return "clean-error", "exit 130, interrupted"
        if is_clean_error(r):
            if r.rc == 130:
                return "clean-error", f"exit 130: {short(r.err_lines[0])}"
            return "silent-wrong", f"signal ignored, the command went on (exit {r.rc}: {short(r.err_lines[0], 70)})"
        return "multi-line-error", f"exit {r.rc}, {len(r.err_lines)} lines: {short(' | '.join(r.err_lines[-3:]))}"

    # -- after the case --------------------------------------------------------------------------------
    def tree_findings(self) -> list[tuple[str, str]]:
        if self.before is None:
            return []
        after = snapshot(self.ctx.root)
        found: list[tuple[str, str]] = []
        for path in sorted(set(self.before) | set(after)):
            old, new = self.before.get(path), after.get(path)
            if old == new:
                continue
            rel = os.path.relpath(path, self.ctx.root)
            what = "appeared" if old is None else "vanished" if new is None else f"changed ({old[0]}->{new[0]})"
            if new is not None and LEFTOVER_RE.match(os.path.basename(path)) and old is None:
                found.append(("leftover", f"{rel} left behind"))
            elif any(LEFTOVER_RE.match(part) for part in Path(rel).parts[:-1]):
                continue  # inside a leftover directory: reported once, with the directory
            elif under(path, self.outputs):
                continue
            elif path in self.decoys:
                found.append(("wrote-outside", f"decoy {rel} {what}"))
            elif under(path, self.inputs):
                found.append(("input-modified", f"{rel} {what}"))
            else:
                found.append(("wrote-outside", f"{rel} {what}"))
        return found


def run_case(ctx: Ctx, case: Case) -> tuple[str, str]:
    t = Trial(ctx, case)
    devices = device_state()
    try:
        verdict, reason = case.fn(t)
    except SetupError as exc:
        return "skipped", f"setup failed: {short(str(exc), 200)}"
    except Skip as exc:
        return "skipped", str(exc)
    except Exception as exc:  # a bug of the battery itself: show it, count it as skipped
        return "skipped", f"battery error: {exc!r} at {traceback.format_exc().splitlines()[-3].strip()}"
    findings = t.tree_findings()
    for hook in t.after:
        try:
            hook()
        except OSError:
            pass
    after = device_state()
    for dev in DEVICES:
        if after[dev] != devices[dev]:
            findings.append(("wrote-outside", f"{dev} was replaced ({devices[dev]} -> {after[dev]})"))
            restore_device(dev, devices[dev])
    for th in t.threads:
        th.join(0.1)
    if not KEEP[0]:
        shutil.rmtree(t.dir, ignore_errors=True)
    if findings:
        order = {v: i for i, v in enumerate(FINDINGS)}
        findings.sort(key=lambda f: order[f[0]])
        if verdict not in FINE:
            findings.append((verdict, reason))
        first = findings[0]
        others = sorted({f[0] for f in findings[1:]})
        extra = f" (+{len(findings) - 1} more: {', '.join(others)})" if len(findings) > 1 else ""
        return first[0], short(first[1], 150) + extra
    return verdict, reason


def restore_device(dev: str, state: tuple | None) -> None:
    """If a tool replaced /dev/null or /dev/full with a file, put the device back (other users need it)."""
    if state is None:
        return
    try:
        if os.path.lexists(dev) and not stat.S_ISCHR(os.lstat(dev).st_mode):
            os.unlink(dev)
            os.mknod(dev, 0o666 | stat.S_IFCHR, state[1])
            os.chmod(dev, 0o666)
    except OSError as exc:
        print(f"WARNING: could not restore {dev}: {exc}", file=sys.stderr)


class Skip(Exception):
    pass


# --------------------------------------------------------------------------------------------------
# checks shared by cases
# --------------------------------------------------------------------------------------------------

def says(expected: str) -> Callable[[Result], str | None]:
    def check(r: Result) -> str | None:
        got = r.out.strip()
        return None if got == expected else f"translated as {short(got, 60)!r}, expected {expected!r}"
    return check


def model_dir_ok(d: Path) -> str | None:
    """A finished model directory: manifest readable and every graph/file it lists present with its hash."""
    try:
        m = load_manifest(d)
        for entry in m["graphs"].values():
            if sha(d / entry["file"]) != entry["sha256"]:
                return f"{entry['file']} does not match the manifest"
        for name, h in m.get("files", {}).items():
            if sha(d / name) != h:
                return f"{name} does not match the manifest"
    except Exception as exc:
        return f"output model directory damaged: {exc!r}"
    return None


def no_staging(d: Path) -> str | None:
    left = [p.name for p in d.iterdir() if p.name.startswith(".")]
    return f"left behind: {', '.join(left)}" if left else None


# ==================================================================================================
# CASES
# ==================================================================================================

TINY_CFG = "cfg = ck['config']\n"

# name -> (base, code run by the helper on `ck` (the loaded checkpoint); `out` replaces it if set)
CKPT_VARIANTS: dict[str, tuple[str, str]] = {}


def ck_variant(name: str, base: str, code: str) -> str:
    CKPT_VARIANTS[name] = (base, code)
    return name


# -- checkpoint-named tokenizers (security) ---------------------------------------------------------

TOKENIZER_NAMES = {
    "dotdot": "'../outside/tokenizer.json'",
    "absolute": "'@FX@/outside/tokenizer.json'",
    "etc-passwd": "'/etc/passwd'",
    "fifo-outside": "'@FX@/outside/fifo.json'",
    "symlink-out": "'link.json'",
    "subdir": "'sub/tokenizer.json'",
    "empty": "''",
    "dot": "'.'",
    "dotdot-bare": "'..'",
    "none": "None",
    "int": "5",
    "nul-byte": "'tokenizer.json\\x00.txt'",
}
for _key, _expr in TOKENIZER_NAMES.items():
    for _base in ("tiny", "demo"):
        ck_variant(f"tokname-{_key}-{_base}", _base, f"ck['tokenizer'] = {{'source': {_expr}, 'target': {_expr}}}")
ck_variant("tokname-src-only-dotdot-tiny", "tiny", "ck['tokenizer']['source'] = '../outside/tokenizer.json'")


def setup_tokname(t: Trial, key: str, base: str) -> Path:
    ck = t.copy_ck(t.ctx.ckpts()[f"tokname-{key}-{base}"])
    # the relative escape lands here: a valid tokenizer outside the checkpoint directory
    out = t.p("outside")
    out.mkdir()
    src = t.ctx.tiny_ck() if base == "tiny" else t.ctx.demo_ck()
    shutil.copyfile(src / "tokenizer.json", out / "tokenizer.json")
    t.input(out)
    if key == "symlink-out":
        os.symlink("../outside/tokenizer.json", ck.parent / "link.json")
    if key == "subdir":
        (ck.parent / "sub").mkdir()
        shutil.copyfile(src / "tokenizer.json", ck.parent / "sub" / "tokenizer.json")
    return ck


def tokname_case(key: str, command: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        base = "demo" if command in ("eval-demo", "translate-demo") else "tiny"
        ck = setup_tokname(t, key, base)
        inside_ok = key == "subdir"  # inside the directory: refusing or reading it are both fine
        if command == "onnx":
            out = t.p("out")
            t.output(out)
            r = t.run("tfm-export", "onnx", "--checkpoint", ck, "--output", out)
        elif command == "translate":
            r = t.run("tfm-run", "translate", "--model", ck, TINY_SENT)
        elif command == "translate-demo":
            r = t.run("tfm-run", "translate", "--model", ck, DEMO_SRC)
        elif command == "eval-demo":
            r = t.run("tfm-export", "eval-demo", "--checkpoint", ck, "--show-misses", 0, timeout=3 * t.ctx.timeout)
        else:  # verify: the checkpoint is the reference of a clean model directory
            m = t.copy_model(t.ctx.tiny())
            r = t.run("tfm-export", "verify", "--model", m, "--checkpoint", ck, "--samples", 1, "--steps", 2,
                      "--beam-size", 1)
        return t.either(r) if inside_ok else t.error(r, "read a tokenizer outside the checkpoint's directory")
    return fn


for _key in TOKENIZER_NAMES:
    for _cmd in ("onnx", "translate", "eval-demo"):
        if _cmd == "eval-demo" and _key not in ("dotdot", "absolute", "symlink-out", "etc-passwd"):
            continue
        add("security", f"ckpt-tokenizer-{_key}/{_cmd}", tokname_case(_key, _cmd))
add("security", "ckpt-tokenizer-dotdot/verify", tokname_case("dotdot", "verify"))
add("security", "ckpt-tokenizer-dotdot/translate-demo", tokname_case("dotdot", "translate-demo"))


def _tok_src_only(t: Trial) -> tuple[str, str]:
    ck = t.copy_ck(t.ctx.ckpts()["tokname-src-only-dotdot-tiny"])
    t.text("outside/tokenizer.json", (t.ctx.tiny_ck() / "tokenizer.json").read_bytes())
    return t.error(t.run("tfm-run", "translate", "--model", ck, TINY_SENT), "read ../outside/tokenizer.json")


add("security", "ckpt-tokenizer-source-only-dotdot/translate", _tok_src_only)


# -- pickle payload ---------------------------------------------------------------------------------

ck_variant("pickle-payload", "tiny", """
class Evil:
    def __reduce__(self):
        return (os.system, ("touch @FX@/PWNED",))
ck['evil'] = Evil()
""")


def _pickle(cmd: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        ck = t.copy_ck(t.ctx.ckpts()["pickle-payload"])
        if cmd == "onnx":
            t.output(t.p("out"))
            r = t.run("tfm-export", "onnx", "--checkpoint", ck, "--output", t.p("out"))
        else:
            r = t.run("tfm-run", "translate", "--model", ck, TINY_SENT)
        verdict = t.error(r)
        if (t.ctx.fx / "PWNED").exists():
            (t.ctx.fx / "PWNED").unlink()
            return "wrote-outside", "the pickle's payload ran (PWNED created)"
        return verdict
    return fn


add("security", "ckpt-pickle-payload/onnx", _pickle("onnx"))
add("security", "ckpt-pickle-payload/translate", _pickle("translate"))


# -- manifest-named files (security) ----------------------------------------------------------------

MANIFEST_FILE_FIELDS = {
    "encoder": ("graphs.encoder.file", "encoder.onnx"),
    "decoder": ("graphs.decoder_step.file", "decoder_step.onnx"),
    "tok-source": ("tokenizer.source", "tokenizer.json"),
    "tok-both": ("tokenizer.*", "tokenizer.json"),
}
MANIFEST_BAD_NAMES = ("dotdot", "absolute", "symlink-out", "symlink-abs", "subdir", "hardlink-inside")


def setup_manifest_name(t: Trial, field_key: str, bad: str) -> Path:
    m = t.copy_model(t.ctx.tiny())
    dotted, fname = MANIFEST_FILE_FIELDS[field_key]
    outside = t.p("outside")
    outside.mkdir()
    shutil.copyfile(m / fname, outside / fname)  # a valid copy, so following the name would "work"
    t.input(outside)
    if bad == "dotdot":
        value = f"../outside/{fname}"
    elif bad == "absolute":
        value = str(outside / fname)
    elif bad == "symlink-out":
        value = f"link-{fname}"
        os.symlink(f"../outside/{fname}", m / value)
    elif bad == "symlink-abs":
        value = f"abslink-{fname}"
        os.symlink(outside / fname, m / value)
    elif bad == "subdir":
        value = f"sub/{fname}"
        (m / "sub").mkdir()
        shutil.copyfile(m / fname, m / value)
    elif bad == "hardlink-inside":
        value = f"hard-{fname}"
        os.link(m / fname, m / value)
    else:
        raise ValueError(bad)
    man = load_manifest(m)
    if dotted == "tokenizer.*":
        man["tokenizer"] = {"source": value, "target": value}
    else:
        set_dotted(man, dotted, value)
    save_manifest(m, man)
    rehash(m)
    return m


def reader_run(t: Trial, reader: str, m: Path, timeout: float | None = None) -> Result:
    """Run one reader of a model directory (cheap settings)."""
    if reader == "translate":
        return t.run("tfm-run", "translate", "--model", m, TINY_SENT, timeout=timeout)
    if reader == "inspect":
        return t.run("tfm-export", "inspect", "--model", m, timeout=timeout)
    if reader == "check":
        return t.run("tfm-export", "check", "--model", m, timeout=timeout)
    if reader == "quantize":
        out = t.p("q-out")
        t.output(out)
        return t.run("tfm-export", "quantize", "--model", m, "--precision", "fp16", "--output", out, timeout=timeout)
    if reader == "verify":
        return t.run("tfm-export", "verify", "--model", m, "--checkpoint", t.ctx.tiny_ck() / "ckpt.pt",
                     "--samples", 1, "--steps", 2, "--beam-size", 1, timeout=timeout)
    if reader == "bench":
        out = t.p("bench.json")
        t.output(out, t.p("bench-work"))
        return t.run("tfm-run", "bench", "--model", m, "--backends", "ort-fp32", "--batch-sizes", 1,
                     "--beam-sizes", 1, "--sentences", 2, "--repeats", 2, "--min-time", 0, "--output-length", 4,
                     "--json", out, timeout=timeout or 2 * t.ctx.timeout)
    if reader == "trt":
        out = t.p("engines")
        t.output(out)
        return t.run("tfm-export", "trt", "--model", m, "--output", out, timeout=timeout)
    if reader == "eval-demo":
        return t.run("tfm-export", "eval-demo", "--model", m, "--show-misses", 0, timeout=timeout or 3 * t.ctx.timeout)
    raise ValueError(reader)


READERS = ("translate", "inspect", "check", "quantize", "verify", "bench", "trt", "eval-demo")


def manifest_name_case(field_key: str, bad: str, reader: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        m = setup_manifest_name(t, field_key, bad)
        r = reader_run(t, reader, m)
        if bad in ("subdir", "hardlink-inside"):  # still inside the directory: either answer is fine
            return t.either(r)
        return t.error(r, f"followed a manifest name ({bad}) out of the model directory")
    return fn


for _f in MANIFEST_FILE_FIELDS:
    for _bad in MANIFEST_BAD_NAMES:
        add("security", f"manifest-{_f}-{_bad}/translate", manifest_name_case(_f, _bad, "translate"))
for _reader in ("inspect", "check", "quantize", "verify", "bench", "trt"):
    add("security", f"manifest-encoder-symlink-out/{_reader}", manifest_name_case("encoder", "symlink-out", _reader))
    add("security", f"manifest-tok-both-dotdot/{_reader}", manifest_name_case("tok-both", "dotdot", _reader))


# -- files changed with the manifest unchanged (security: integrity on every read) -------------------

def swap_tokens(path: Path) -> None:
    """A tokenizer that still parses, with two words' ids exchanged."""
    data = json.loads(path.read_text())
    vocab = data["model"]["vocab"]
    words = [w for w in vocab if not w.startswith("<")]
    a, b = words[1], words[2]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    path.write_text(json.dumps(data, indent=2))


TAMPER_TARGETS = ("tokenizer", "encoder", "decoder", "extdata")


def tamper(t: Trial, target: str, demo: bool) -> Path:
    if target == "extdata":
        m = t.copy_model(t.ctx.graphs()["extdata"])
        data = m / "encoder.onnx.data"
        data.write_bytes(bytes(data.stat().st_size))  # zeroed weights, same size
    elif target == "tokenizer":
        m = t.copy_model(t.ctx.demo() if demo else t.ctx.tiny())
        swap_tokens(m / load_manifest(m)["tokenizer"]["source"])
    else:
        m = t.copy_model(t.ctx.tiny())
        g = "encoder.onnx" if target == "encoder" else "decoder_step.onnx"
        shutil.copyfile(t.ctx.graphs()[g], m / g)
    return m


def tamper_case(target: str, reader: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        demo = reader == "eval-demo" or (reader == "translate" and target == "tokenizer")
        if reader == "eval-demo" and target != "tokenizer":
            raise Skip("graph tampering is exercised on the tiny model; eval-demo needs the demo model")
        m = tamper(t, target, demo)
        if reader == "translate" and demo:
            r = t.run("tfm-run", "translate", "--model", m, DEMO_SRC)
        else:
            r = reader_run(t, reader, m)
        return t.error(r, f"{target} changed but the manifest not")
    return fn


for _target in TAMPER_TARGETS:
    for _reader in READERS:
        if _reader == "eval-demo" and _target != "tokenizer":
            continue
        add("security", f"tampered-{_target}/{_reader}", tamper_case(_target, _reader))


def _extdata_clean(t: Trial) -> tuple[str, str]:
    m = t.copy_model(t.ctx.graphs()["extdata"])
    ref = t.ctx.tiny_ref()
    return t.ok(t.run("tfm-run", "translate", "--model", m, TINY_SENT),
                lambda r: None if r.out == ref else "external-data model translates differently")


add("security", "extdata-untampered/translate (control)", _extdata_clean)


# -- planted links beside outputs -----------------------------------------------------------------------

def plant(t: Trial, folder: Path, names: list[str], to_dir: bool = False) -> list[tuple[Path, str]]:
    links = []
    for name in names:
        i = len(t.decoys)
        if to_dir:
            target = t.p(f"decoydir{i}")
            target.mkdir()
            t.decoy(target / "keep.txt")
        else:
            target = t.decoy(t.p(f"decoy{i}.txt"))
        link = folder / name
        os.symlink(target, link)
        links.append((link, str(target)))
    return links


def links_intact(links: list[tuple[Path, str]]) -> str | None:
    for link, target in links:
        if not link.is_symlink() or os.readlink(link) != target:
            return f"planted link {link.name} replaced or removed"
    return None


def guess_names(name: str) -> list[str]:
    return [f".{name}.partial", f".{name}.tmp", f".{name}.old", f"{name}.tmp", f"{name}.partial", f".{name}.lock",
            f".{name}.1.partial", f".{name}.99999999.x.partial", f".{name}.old.x", f".{name}.old-1", f"{name}~",
            f".{name}.swp"]


WRITERS = ("onnx", "quantize", "random-checkpoint", "translate", "bench-json", "bench-markdown", "verify-report",
           "train-demo")


def writer_run(t: Trial, writer: str, out: Path, extra: tuple = (), timeout: float | None = None) -> Result:
    """Run one writer with `out` as its output (cheap settings)."""
    if writer == "onnx":
        return t.run("tfm-export", "onnx", "--checkpoint", t.ctx.tiny_ck() / "ckpt.pt", "--output", out, *extra,
                     timeout=timeout)
    if writer == "quantize":
        return t.run("tfm-export", "quantize", "--model", t.ctx.tiny(), "--precision", "int8", "--mode", "dynamic",
                     "--output", out, *extra, timeout=timeout)
    if writer == "random-checkpoint":
        return t.run("tfm-export", "random-checkpoint", "--d-model", 8, "--heads", 1, "--layers", 1, "--ffn", 8,
                     "--vocab-size", 12, "--output", out, *extra, timeout=timeout)
    if writer == "train-demo":
        return t.run("tfm-export", "train-demo", "--steps", 1, "--batch-size", 2, "--threads", 1, "--output", out,
                     *extra, timeout=timeout)
    if writer == "translate":
        return t.run("tfm-run", "translate", "--model", t.ctx.tiny(), TINY_SENT, "--output", out, *extra,
                     timeout=timeout)
    if writer in ("bench-json", "bench-markdown", "bench-plot"):
        opt = "--" + writer.split("-")[1]
        return t.run("tfm-run", "bench", "--model", t.ctx.tiny(), "--backends", "ort-fp32", "--batch-sizes", 1,
                     "--beam-sizes", 1, "--sentences", 2, "--repeats", 2, "--min-time", 0, "--output-length", 4,
                     opt, out, *extra, timeout=timeout or 2 * t.ctx.timeout)
    if writer == "trt":
        return t.run("tfm-export", "trt", "--model", t.ctx.tiny(), "--output", out, *extra, timeout=timeout)
    if writer == "verify-report":
        return t.run("tfm-export", "verify", "--model", t.ctx.int8(), "--input", t.ctx.calib(), "--report", out,
                     "--beam-size", 1, "--min-agreement", 0, *extra, timeout=timeout or 2 * t.ctx.timeout)
    raise ValueError(writer)


def writer_out_names(writer: str) -> tuple[str, list[str]]:
    """The output's name, and the names written inside it (for directory outputs)."""
    return {
        "onnx": ("model", ["manifest.json", "encoder.onnx", "tokenizer.json"]),
        "quantize": ("q", ["manifest.json", "encoder.onnx"]),
        "random-checkpoint": ("ck", ["ckpt.pt", "tokenizer.json"]),
        "train-demo": ("demo", ["ckpt.pt", "tokenizer.json"]),
        "translate": ("out.txt", []),
        "bench-json": ("bench.json", []),
        "bench-markdown": ("bench.md", []),
        "verify-report": ("report", ["precision-report.md"]),
    }[writer]


def planted_case(writer: str, to_dir: bool, inside_old: bool = False) -> Callable[[Trial], tuple[str, str]]:
    """Links at every guessable temporary name beside the output (and, for writers that fill an existing
    directory, inside it); with inside_old, an existing model directory with links inside is replaced (--force)."""
    def fn(t: Trial) -> tuple[str, str]:
        name, inner = writer_out_names(writer)
        out = t.p(name)
        links = plant(t, t.dir, guess_names(name), to_dir)
        extra: tuple = ()
        if inside_old:  # a previous model directory (ours) with links planted inside, replaced with --force
            shutil.copytree(t.ctx.tiny() if writer == "onnx" else t.ctx.int8(), out)
            for n in inner:
                links += plant(t, out, guess_names(n)[:4], to_dir)
            extra = ("--force",)
        elif inner and writer not in ("onnx", "quantize"):  # these write into an existing directory
            out.mkdir()
            for n in inner:
                links += plant(t, out, guess_names(n)[:4], to_dir)
        t.output(out)
        r = writer_run(t, writer, out, extra)
        verdict = t.either(r)
        if verdict[0] != "ok":
            return verdict
        problem = links_intact([lk for lk in links if not under(str(lk[0]), [str(out)]) or not inside_old])
        if problem:
            return "wrote-outside", problem
        for n in inner:
            if n in ("manifest.json", "ckpt.pt") and not (out / n).is_file():
                return "silent-wrong", f"{n} not written"
        return verdict
    return fn


for _w in WRITERS:
    add("security", f"planted-links-to-files/{_w}", planted_case(_w, False))
    add("security", f"planted-links-to-dirs/{_w}", planted_case(_w, True))
for _w in ("onnx", "quantize"):
    add("security", f"planted-links-inside-old-output-force/{_w}", planted_case(_w, False, inside_old=True))


# -- outputs on devices, pipes and links ----------------------------------------------------------------

def special_output_case(writer: str, kind: str) -> Callable[[Trial], tuple[str, str]]:
    """kind: devnull, devfull, fifo, symlink-file, devstdout."""
    def fn(t: Trial) -> tuple[str, str]:
        name, inner = writer_out_names(writer)
        is_dir = bool(inner)
        box = None
        if kind == "devnull":
            out = Path("/dev/null")
        elif kind == "devfull":
            out = Path("/dev/full")
        elif kind == "devstdout":
            out = Path("/dev/stdout")
        elif kind == "fifo":
            out = t.p(name)
            os.mkfifo(out)
            t.input(out)  # must stay a FIFO
            box = t.fifo_reader(out)
        elif kind == "symlink-file":
            decoy = t.p("real-" + name)
            decoy.write_bytes(b"old content\n")
            out = t.p(name)
            os.symlink(decoy, out)
            if is_dir:
                t.decoys.append(str(decoy))
            else:
                t.output(decoy)
                t.input(out)
        else:
            raise ValueError(kind)
        r = writer_run(t, writer, out)
        got = t.release_fifo(box) if box else None
        if is_dir or kind == "devfull":
            return t.error(r, f"a directory writer accepted {kind}" if is_dir else "wrote to a full device")
        if kind == "fifo":
            return t.either(r, lambda r: None if got else "nothing arrived through the FIFO")
        if kind == "symlink-file":
            def check(r: Result) -> str | None:
                if not out.is_symlink():
                    return "the link was replaced instead of written through"
                content = decoy.read_bytes()
                return "link target not written" if content == b"old content\n" or not content else None
            return t.either(r, check)
        if kind == "devstdout":
            return t.either(r, lambda r: None if r.out.strip() else "nothing on stdout")
        return t.either(r)
    return fn


for _w in ("translate", "bench-json", "bench-markdown"):
    for _kind in ("devnull", "devfull", "fifo", "symlink-file", "devstdout"):
        add("security", f"output-{_kind}/{_w}", special_output_case(_w, _kind))
for _w in ("onnx", "quantize", "random-checkpoint", "verify-report"):
    for _kind in ("devnull", "devfull", "fifo", "symlink-file"):
        add("security", f"output-{_kind}/{_w}", special_output_case(_w, _kind))


# -- deeply nested JSON ---------------------------------------------------------------------------------

def deep_manifest_case(kind: str, reader: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        m = t.copy_model(t.ctx.tiny())
        if kind == "whole-list":
            (m / "manifest.json").write_text(nested_json(100_000))
        elif kind == "whole-dict":
            (m / "manifest.json").write_text(nested_json(100_000, "dict"))
        else:  # a valid manifest with one deeply nested value inside
            text = (m / "manifest.json").read_text()
            (m / "manifest.json").write_text(text.replace('"tool":', f'"deep": {nested_json(100_000)}, "tool":', 1))
        return t.either(reader_run(t, reader, m)) if kind == "inner" else t.error(reader_run(t, reader, m))
    return fn


for _kind in ("whole-list", "whole-dict", "inner"):
    for _reader in ("translate", "inspect", "check", "quantize"):
        add("tracebacks", f"deep-json-manifest-{_kind}/{_reader}", deep_manifest_case(_kind, _reader))


def deep_tokenizer_case(reader: str, kind: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        m = t.copy_model(t.ctx.tiny())
        tok = m / "tokenizer.json"
        if kind == "whole":
            tok.write_text(nested_json(100_000))
        else:
            data = json.loads(tok.read_text())
            tok.write_text(json.dumps(data).replace('"truncation": null', f'"truncation": {nested_json(100_000)}', 1))
        rehash(m)
        return t.error(reader_run(t, reader, m))
    return fn


for _reader in ("translate", "inspect", "check", "quantize"):
    for _kind in ("whole", "inner"):
        add("tracebacks", f"deep-json-tokenizer-{_kind}/{_reader}", deep_tokenizer_case(_reader, _kind))


# seed checkpoint (no vocabulary inside) for --vocab cases
ck_variant("seed", "tiny", """
st = ck['config']
settings = Namespace(src_vocab_size=st['src_vocab_size'], trg_vocab_size=st['trg_vocab_size'],
                     src_pad_idx=1, trg_pad_idx=1, d_model=16, d_word_vec=16, d_inner_hid=32, d_k=8, d_v=8,
                     n_head=2, n_layers=1, dropout=0.1, proj_share_weight=True, embs_share_weight=True,
                     scale_emb_or_prj='prj', max_token_seq_len=100)
out = {'epoch': 3, 'settings': settings, 'model': ck['model']}
""")


def vocab_case(content: Callable[[Trial], bytes], command: str, expect: str, vname: str = "vocab.json"
               ) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        ck = t.copy_ck(t.ctx.ckpts()["seed"])
        v = t.text(vname, content(t))
        if command == "onnx":
            t.output(t.p("out"))
            r = t.run("tfm-export", "onnx", "--checkpoint", ck, "--vocab", v, "--output", t.p("out"))
        else:
            r = t.run("tfm-run", "translate", "--model", ck, "--vocab", v, TINY_SENT)
        if expect == "error":
            return t.error(r)
        if expect == "ok":
            return t.ok(r)
        return t.either(r)
    return fn


for _cmd in ("onnx", "translate"):
    add("tracebacks", f"deep-json-vocab-list/{_cmd}",
        vocab_case(lambda t: nested_json(100_000).encode(), _cmd, "error"))
    add("tracebacks", f"deep-json-vocab-dict/{_cmd}",
        vocab_case(lambda t: nested_json(100_000, "dict").encode(), _cmd, "error"))
    add("tracebacks", f"seed-vocab-plain/{_cmd} (control)",
        vocab_case(lambda t: t.ctx.seed_vocab().read_bytes(), _cmd, "ok", "vocab.txt"))


# -- pathological tokenizer regex ---------------------------------------------------------------------

def regex_case(pattern: str, line: str, reader: str = "translate") -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        m = t.copy_model(t.ctx.tiny())
        tok = m / "tokenizer.json"
        data = json.loads(tok.read_text())
        data["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            {"type": "WhitespaceSplit"}]}
        tok.write_text(json.dumps(data))
        rehash(m)
        if reader == "translate":
            inp = t.text("long.txt", line + "\n")
            r = t.run("tfm-run", "translate", "--model", m, "--input", inp, "--truncate")
        else:
            r = reader_run(t, reader, m)
        return t.either(r)
    return fn


add("security", "tokenizer-regex-nested-quantifier/translate", regex_case(r"(a+)+$", "a" * 50_000 + "!"))
add("security", "tokenizer-regex-word-alternation/translate", regex_case(r"(\w|\w\w)*$", "w" * 50_000 + "!"))
add("security", "tokenizer-regex-backref/translate", regex_case(r"((w\d)\s?)*\2$", "w1 " * 20_000 + "!"))
add("security", "tokenizer-regex-invalid/translate", regex_case(r"(((", "w1"))
add("security", "tokenizer-regex-invalid/check", regex_case(r"(((", "w1", "check"))
add("security", "tokenizer-regex-invalid/quantize", regex_case(r"(((", "w1", "quantize"))


# -- data loss: outputs that are inputs --------------------------------------------------------------

def same_as_input_case(kind: str) -> Callable[[Trial], tuple[str, str]]:
    """translate --output aimed at one of its own inputs."""
    def fn(t: Trial) -> tuple[str, str]:
        m = t.copy_model(t.ctx.tiny())
        inp = t.text("in.txt", TINY_SENT + "\n")
        args: list[Any] = ["--input", inp]
        if kind == "input":
            out = inp
        elif kind == "input-via-symlink":
            out = t.p("alias.txt")
            os.symlink(inp, out)
            t.input(out)
        elif kind == "input-via-dotdot":
            (t.p("sub")).mkdir()
            out = Path(str(t.p("sub")) + "/../in.txt")
        elif kind == "input-via-hardlink":  # replacing the link (not writing through it) keeps in.txt intact
            out = t.p("hard.txt")
            os.link(inp, out)
            t.output(out)
            return t.either(t.run("tfm-run", "translate", "--model", m, *args, "--output", out),
                            lambda r: None if inp.read_text() == TINY_SENT + "\n" else "input overwritten")
        elif kind == "input-relative":
            out = Path("./in.txt")
        elif kind in ("manifest", "tokenizer", "encoder"):
            out = m / {"manifest": "manifest.json", "tokenizer": "tokenizer.json", "encoder": "encoder.onnx"}[kind]
        elif kind == "model-dir":
            out = m
        elif kind in ("checkpoint", "ckpt-tokenizer"):
            ck = t.copy_ck(t.ctx.tiny_ck())
            out = ck if kind == "checkpoint" else ck.parent / "tokenizer.json"
            return t.error(t.run("tfm-run", "translate", "--model", ck, "--input", inp, "--output", out))
        else:
            raise ValueError(kind)
        return t.error(t.run("tfm-run", "translate", "--model", m, *args, "--output", out))
    return fn


for _kind in ("input", "input-via-symlink", "input-via-dotdot", "input-via-hardlink", "input-relative", "manifest",
              "tokenizer", "encoder", "model-dir", "checkpoint", "ckpt-tokenizer"):
    add("data-loss", f"translate-output-is-{_kind}", same_as_input_case(_kind))


def dir_output_is_input_case(writer: str, kind: str, force: bool) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        extra = ["--force"] if force else []
        if writer == "onnx":
            ck = t.copy_ck(t.ctx.tiny_ck())
            vocab = t.text("vocab.txt", t.ctx.seed_vocab().read_text())
            out = {"checkpoint": ck, "ckpt-dir": ck.parent, "ckpt-tokenizer": ck.parent / "tokenizer.json",
                   "parent-of-ckpt-dir": t.dir, "cwd": t.dir, "vocab": vocab}[kind]
            args = ["tfm-export", "onnx", "--checkpoint", ck, "--output", out, *extra]
            if kind == "vocab":
                seed = t.copy_ck(t.ctx.ckpts()["seed"], "seed")
                args = ["tfm-export", "onnx", "--checkpoint", seed, "--vocab", vocab, "--output", out, *extra]
            return t.error(t.run(*args))
        m = t.copy_model(t.ctx.tiny())
        calib = t.text("calib.txt", t.ctx.calib().read_text())
        out = {"model-dir": m, "manifest": m / "manifest.json", "inside-model": m / "sub", "calibration": calib,
               "parent-of-model": t.dir, "cwd": t.dir}[kind]
        if writer == "quantize":
            args = ["tfm-export", "quantize", "--model", m, "--precision", "int8", "--calibration", calib,
                    "--output", out, *extra]
        else:
            args = ["tfm-export", "trt", "--model", m, "--output", out, *extra]
        return t.error(t.run(*args))
    return fn


for _kind in ("checkpoint", "ckpt-dir", "ckpt-tokenizer", "parent-of-ckpt-dir", "cwd", "vocab"):
    add("data-loss", f"onnx-output-is-{_kind}", dir_output_is_input_case("onnx", _kind, False))
    add("data-loss", f"onnx-output-is-{_kind}-force", dir_output_is_input_case("onnx", _kind, True))
for _w in ("quantize", "trt"):
    for _kind in ("model-dir", "manifest", "inside-model", "calibration", "parent-of-model", "cwd"):
        add("data-loss", f"{_w}-output-is-{_kind}-force", dir_output_is_input_case(_w, _kind, True))


def other_output_is_input_case(kind: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        m = t.copy_model(t.ctx.tiny())
        inp = t.text("in.txt", TINY_SENT + "\n")
        bench = ["tfm-run", "bench", "--model", m, "--backends", "ort-fp32", "--batch-sizes", 1, "--beam-sizes", 1,
                 "--sentences", 2, "--repeats", 2, "--min-time", 0, "--output-length", 4]
        if kind == "bench-json-is-input":
            r = t.run(*bench, "--input", inp, "--json", inp, timeout=2 * t.ctx.timeout)
        elif kind == "bench-json-is-manifest":
            r = t.run(*bench, "--json", m / "manifest.json", timeout=2 * t.ctx.timeout)
        elif kind == "bench-markdown-is-checkpoint":
            ck = t.copy_ck(t.ctx.tiny_ck())
            bench[3] = ck
            r = t.run(*bench, "--markdown", ck, timeout=2 * t.ctx.timeout)
        elif kind == "bench-plot-is-tokenizer":
            r = t.run(*bench, "--plot", m / "tokenizer.json", timeout=2 * t.ctx.timeout)
        elif kind == "bench-work-dir-is-model":
            r = t.run(*bench, "--work-dir", m, timeout=2 * t.ctx.timeout)
        elif kind == "bench-json-is-work-dir-file":
            r = t.run(*bench, "--work-dir", m, "--json", m / "encoder.onnx", timeout=2 * t.ctx.timeout)
        elif kind == "verify-report-is-model":
            i8 = t.copy_model(t.ctx.int8(), "i8")
            r = t.run("tfm-export", "verify", "--model", i8, "--reference", m, "--input", inp, "--report", m,
                      "--beam-size", 1, "--min-agreement", 0, timeout=2 * t.ctx.timeout)
        elif kind == "verify-report-is-quantized-model":
            i8 = t.copy_model(t.ctx.int8(), "i8")
            r = t.run("tfm-export", "verify", "--model", i8, "--input", inp, "--report", i8,
                      "--beam-size", 1, "--min-agreement", 0, timeout=2 * t.ctx.timeout)
        elif kind == "verify-report-is-input-file":
            i8 = t.copy_model(t.ctx.int8(), "i8")
            r = t.run("tfm-export", "verify", "--model", i8, "--input", inp, "--report", inp,
                      "--beam-size", 1, "--min-agreement", 0, timeout=2 * t.ctx.timeout)
        else:
            raise ValueError(kind)
        return t.error(r)
    return fn


for _kind in ("bench-json-is-input", "bench-json-is-manifest", "bench-markdown-is-checkpoint",
              "bench-plot-is-tokenizer", "bench-work-dir-is-model", "bench-json-is-work-dir-file",
              "verify-report-is-model", "verify-report-is-quantized-model", "verify-report-is-input-file"):
    add("data-loss", _kind, other_output_is_input_case(_kind))


# -- data loss: --force on a directory of the user's ------------------------------------------------------

def thesis_case(writer: str, variant: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        out = t.p("thesis")
        out.mkdir()
        t.decoy(out / "thesis.tex", b"\\documentclass{book} % ten years of work\n")
        t.decoy(out / "data" / "results.csv", b"a,b\n1,2\n")
        if variant == "foreign-manifest":
            t.decoy(out / "manifest.json", json.dumps({"format": "my-lab-dataset", "version": 2}).encode())
        elif variant == "broken-manifest":
            t.decoy(out / "manifest.json", b'{"format": "tfm-export-model", ')
        elif variant == "manifest-dir":
            (out / "manifest.json").mkdir()
        r = writer_run(t, writer, out, ("--force",))
        return t.error(r, "replaced a directory that is not a tfm-export artifact")
    return fn


for _w in ("onnx", "quantize", "trt"):
    for _variant in ("plain", "foreign-manifest", "broken-manifest", "manifest-dir"):
        if _w == "trt" and _variant in ("broken-manifest", "manifest-dir"):
            continue
        add("data-loss", f"force-on-user-dir-{_variant}/{_w}", thesis_case(_w, _variant))


def engine_writer_bare(t: Trial, out: Path, extra: tuple = ()) -> Result:
    return t.run("tfm-export", "trt", "--model", t.ctx.tiny(), "--output", out, *extra)


def overwrite_ckpt_case(writer: str, force: bool, what: str = "ckpt") -> Callable[[Trial], tuple[str, str]]:
    """random-checkpoint / train-demo over an existing trained checkpoint."""
    def fn(t: Trial) -> tuple[str, str]:
        out = t.p("trained")
        shutil.copytree(t.ctx.demo_ck() if what == "ckpt" else t.ctx.tiny_ck(), out)
        if what == "tokenizer-only":
            (out / "ckpt.pt").unlink()
        if what == "thesis":
            shutil.rmtree(out)
            out.mkdir()
            t.decoy(out / "thesis.tex")
        extra = ("--force",) if force else ()
        if force:
            t.output(out / "ckpt.pt", out / "tokenizer.json")
            r = writer_run(t, writer, out, extra, timeout=3 * t.ctx.timeout)

            def check(r: Result) -> str | None:
                return None if (out / "ckpt.pt").is_file() and (out / "tokenizer.json").is_file() else "not written"
            return t.ok(r, check)
        t.input(out)
        r = writer_run(t, writer, out, extra, timeout=3 * t.ctx.timeout)
        if what == "thesis":  # a directory without a checkpoint: writing beside thesis.tex is fine
            t.inputs.remove(str(out))
            t.output(out / "ckpt.pt", out / "tokenizer.json")
            return t.either(r)
        return t.error(r, "replaced an existing checkpoint without --force")
    return fn


for _w in ("random-checkpoint", "train-demo"):
    add("data-loss", f"{_w}-over-ckpt", overwrite_ckpt_case(_w, False))
    add("data-loss", f"{_w}-over-ckpt-force (control)", overwrite_ckpt_case(_w, True))
    add("data-loss", f"{_w}-over-tokenizer-only", overwrite_ckpt_case(_w, False, "tokenizer-only"))
    add("data-loss", f"{_w}-beside-thesis", overwrite_ckpt_case(_w, False, "thesis"))


# -- data loss: disk full ----------------------------------------------------------------------------

def fill(path: Path) -> None:
    """Fill the file system holding `path` (a 256 KiB tmpfs) to the last byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for size in (65536, 4096, 1):
            while True:
                try:
                    if os.write(fd, b"\0" * size) < size:
                        break
                except OSError:
                    break
    finally:
        os.close(fd)


def disk_full_case(writer: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        fs = t.ctx.tmpfs()
        if fs is None:
            raise Skip("cannot mount a tmpfs here (not root?); the /dev/full output cases stand in")
        d = fs / re.sub(r"\W", "_", t.case.name)
        d.mkdir()
        t.after.append(lambda: shutil.rmtree(d, ignore_errors=True))
        name, inner = writer_out_names(writer)
        out = d / name
        previous: dict[Path, bytes] = {}
        if inner:
            if writer in ("onnx", "quantize"):
                shutil.copytree(t.ctx.tiny() if writer == "onnx" else t.ctx.int8(), out)
                for p in out.iterdir():
                    previous[p] = p.read_bytes()
            else:
                out.mkdir()
                previous[out / "ckpt.pt"] = b"previous checkpoint\n"
        else:
            previous[out] = b'{"previous": "valid JSON"}\n' if writer.startswith("bench") else b"previous\n"
        for p, data in previous.items():
            p.write_bytes(data)
        filler = d / "filler"
        t.output(filler)
        fill(filler)
        for p in previous:
            t.input(p)
        extra = ("--force",) if inner else ()
        try:
            r = writer_run(t, writer, out, extra, timeout=2 * t.ctx.timeout)
        finally:
            filler.unlink()
        verdict = t.error(r, "wrote to a full disk?")
        for p, data in previous.items():
            if not p.exists() or p.read_bytes() != data:
                return "input-modified", f"previous {p.name} damaged by a failed write on a full disk"
        return verdict
    return fn


for _w in ("translate", "bench-json", "bench-markdown", "onnx", "quantize", "random-checkpoint"):
    add("data-loss", f"disk-full/{_w}", disk_full_case(_w))


# -- silent wrong answers: poisoned weights -------------------------------------------------------------

WEIGHT_POISON = {
    "nan": "sd['encoder.layer_stack.0.pos_ffn.w_1.weight'][0, 0] = float('nan')",
    "inf": "sd['decoder.layer_stack.0.enc_attn.fc.weight'][1, 1] = float('inf')",
    "neg-inf": "sd['encoder.layer_norm.bias'][0] = float('-inf')",
    "int-weight": "sd['encoder.layer_stack.0.pos_ffn.w_2.weight'] = "
                  "sd['encoder.layer_stack.0.pos_ffn.w_2.weight'].long()",
    "all-int": "ck['model'] = {k: v.round().to(torch.int32) for k, v in sd.items()}",
    "bool-weight": "sd['encoder.layer_norm.weight'] = sd['encoder.layer_norm.weight'] > 0",
    "complex-weight": "sd['encoder.layer_norm.weight'] = sd['encoder.layer_norm.weight'].to(torch.complex64)",
    "missing-weight": "del sd['decoder.layer_norm.bias']",
    "extra-weight": "sd['surplus.weight'] = torch.zeros(3)",
    "wrong-shape": "sd['encoder.layer_norm.weight'] = torch.ones(17)",
    "not-a-tensor": "sd['encoder.layer_norm.weight'] = [1.0] * 16",
    "shared-differ": "sd['trg_word_prj.weight'] = sd['trg_word_prj.weight'].clone() + 1",
    "pos-table-nan": "sd['encoder.position_enc.pos_table'][0, 3, 0] = float('nan')",
    "huge-finite": "sd['encoder.layer_stack.0.pos_ffn.w_1.weight'] *= 1e38",
}
for _k, _code in WEIGHT_POISON.items():
    ck_variant(f"poison-{_k}", "tiny", _code)
ck_variant("poison-nan-demo", "demo", "k = [k for k in sd if k.endswith('w_1.weight')][0]\nsd[k][0, 0] = float('nan')")
ck_variant("poison-fp16", "tiny", "ck['model'] = {k: v.half() for k, v in sd.items()}")


def poison_case(key: str, command: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        ck = t.copy_ck(t.ctx.ckpts()[f"poison-{key}"])
        if command == "onnx":
            out = t.p("out")
            t.output(out)
            r = t.run("tfm-export", "onnx", "--checkpoint", ck, "--output", out)
        elif command == "eval-demo":
            r = t.run("tfm-export", "eval-demo", "--checkpoint", ck, "--show-misses", 0, timeout=3 * t.ctx.timeout)
        else:
            r = t.run("tfm-run", "translate", "--model", ck, TINY_SENT)
        if key == "huge-finite":  # legal floats; overflow may be refused or produce some output
            return t.either(r)
        if key == "fp16":
            return t.either(r)
        return t.error(r, f"{key} weights accepted")
    return fn


for _k in WEIGHT_POISON:
    add("wrong-answer", f"weights-{_k}/onnx", poison_case(_k, "onnx"))
    if _k in ("nan", "inf", "int-weight", "shared-differ"):
        add("wrong-answer", f"weights-{_k}/translate-torch", poison_case(_k, "translate"))
add("wrong-answer", "weights-nan-demo/eval-demo", poison_case("nan-demo", "eval-demo"))
add("wrong-answer", "weights-fp16/onnx", poison_case("fp16", "onnx"))


# -- silent wrong answers: text in, text out ---------------------------------------------------------------

def demo_text_case(content: bytes | None, args: tuple, expected: list[str] | None, how: str = "file",
                   expect: str = "ok") -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        m = t.ctx.demo()
        t.input(m)
        if how == "file":
            inp = t.text("in.txt", content)
            r = t.run("tfm-run", "translate", "--model", m, "--input", inp, *args)
        elif how == "stdin":
            r = t.run("tfm-run", "translate", "--model", m, *args, input=content)
        else:
            r = t.run("tfm-run", "translate", "--model", m, *args)

        def check(r: Result) -> str | None:
            got = r.out.split("\n")
            if got and got[-1] == "":
                got = got[:-1]
            return None if got == expected else f"output {short(repr(got), 80)}, expected {short(repr(expected), 60)}"
        if expect == "error":
            return t.error(r)
        if expect == "either":
            return t.either(r, check if expected is not None else None)
        return t.ok(r, check if expected is not None else None)
    return fn


Q = DEMO_TGT
add("wrong-answer", "bom-input-file", demo_text_case(b"\xef\xbb\xbfforty-two\nforty-two\n", (), [Q, Q]))
add("wrong-answer", "bom-stdin", demo_text_case(b"\xef\xbb\xbfforty-two\nforty-two\n", (), [Q, Q], "stdin"))
add("wrong-answer", "bom-crlf-input-file", demo_text_case(b"\xef\xbb\xbfforty-two\r\nforty-two\r\n", (), [Q, Q]))
add("wrong-answer", "crlf-input-file", demo_text_case(b"forty-two\r\nforty-two\r\n", (), [Q, Q]))
add("wrong-answer", "cr-only-input-file", demo_text_case(b"forty-two\rforty-two\r", (), None, expect="either"))
add("wrong-answer", "bom-text-argument", demo_text_case(None, ("\ufeffforty-two",), None, "args", expect="either"))
add("wrong-answer", "bom-input-jsonl", demo_text_case(b"\xef\xbb\xbfforty-two\n", ("--format", "jsonl"), None))
add("wrong-answer", "double-bom-input-file", demo_text_case(b"\xef\xbb\xbf\xef\xbb\xbfforty-two\n", (), None,
                                                            expect="either"))
add("wrong-answer", "utf16-input-file", demo_text_case("forty-two\n".encode("utf-16"), (), [Q], expect="either"))
add("wrong-answer", "latin1-input-file", demo_text_case("forty-two caf\xe9\n".encode("latin-1"), (), None,
                                                        expect="error"))
add("wrong-answer", "no-final-newline", demo_text_case(b"forty-two\nforty-two", (), [Q, Q]))
add("wrong-answer", "empty-lines-kept", demo_text_case(b"forty-two\n\n\nforty-two\n", (), [Q, "", "", Q]))
add("wrong-answer", "blank-line-only-spaces", demo_text_case(b"forty-two\n   \t \nforty-two\n", (), [Q, "", Q],
                                                             expect="either"))
add("wrong-answer", "nul-byte-in-line", demo_text_case(b"forty\x00-two\nforty-two\n", (), None, expect="either"))
add("wrong-answer", "newline-inside-text-argument", demo_text_case(None, ("forty-two\nforty-two",), None, "args",
                                                                   expect="either"))
add("wrong-answer", "empty-text-argument", demo_text_case(None, ("", DEMO_SRC), ["", Q], "args"))
add("wrong-answer", "unicode-line-separator", demo_text_case("forty-two\u2028forty-two\n".encode(), (), None,
                                                             expect="either"))
add("wrong-answer", "empty-input-file", demo_text_case(b"", (), [], expect="either"))
add("wrong-answer", "text-and-input-together", demo_text_case(b"forty-two\n", (DEMO_SRC,), None, expect="error"))
add("wrong-answer", "text-and-stdin", demo_text_case(b"one\n", (DEMO_SRC,), [Q], "stdin", expect="either"))
add("wrong-answer", "long-line-no-truncate", demo_text_case(("forty-two " * 5000 + "\n").encode(), (), None,
                                                            expect="error"))
add("wrong-answer", "long-line-truncate", demo_text_case(("forty-two " * 5000 + "\n").encode(), ("--truncate",),
                                                         None, expect="ok"))
add("wrong-answer", "beam-nbest-jsonl", demo_text_case(b"forty-two\n", ("--beam-size", 4, "--n-best", 2, "--format",
                                                                        "jsonl"), None))
add("wrong-answer", "nbest-above-beam", demo_text_case(b"forty-two\n", ("--beam-size", 1, "--n-best", 3, "--format",
                                                                        "jsonl"), None, expect="error"))
add("wrong-answer", "demo-oracle-greedy (control)", demo_text_case(None, (DEMO_SRC,), [Q], "args"))
add("wrong-answer", "demo-oracle-beam4 (control)", demo_text_case(None, ("--beam-size", 4, DEMO_SRC), [Q], "args"))
add("wrong-answer", "max-length-1", demo_text_case(None, ("--max-length", 1, DEMO_SRC), None, "args",
                                                   expect="either"))


def option_case(args: tuple, backend: str = "onnxruntime", env: dict | None = None, expect: str = "error",
                beam: int = 2) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        m = t.ctx.demo()
        t.input(m)
        model = t.ctx.demo_ck() / "ckpt.pt" if backend == "torch" else m
        if backend == "torch":
            t.input(t.ctx.demo_ck())
        r = t.run("tfm-run", "translate", "--model", model, "--backend", backend, "--beam-size", beam, *args,
                  DEMO_SRC, env=env, timeout=t.ctx.timeout)
        if expect == "error":
            return t.error(r)
        return t.either(r, says(DEMO_TGT))
    return fn


for _lp in ("nan", "inf", "-inf", "1e308", "-1e308", "11", "-0", "0x10", "1e-400"):
    for _backend in ("onnxruntime", "torch"):
        _expect = "either" if _lp in ("-0", "1e-400") else "error"
        add("wrong-answer", f"length-penalty-{_lp}/{_backend}", option_case(("--length-penalty", _lp), _backend,
                                                                            expect=_expect))
for _th in ("4096", "100000", "-1", "9"):
    for _backend in ("onnxruntime", "torch"):
        add("wrong-answer", f"threads-{_th}/{_backend}", option_case(("--threads", _th), _backend))
for _th in ("100000", "abc", "-3", "4096"):
    add("wrong-answer", f"env-TFM_THREADS-{_th}/onnxruntime", option_case((), env={"TFM_THREADS": _th}))
add("wrong-answer", "env-TFM_ORT_OPT_LEVEL-bogus", option_case((), env={"TFM_ORT_OPT_LEVEL": "turbo"}))
add("wrong-answer", "ort-trt-with-torch-backend", option_case(("--ort-trt",), "torch"))
add("wrong-answer", "ort-trt-on-cpu", option_case(("--ort-trt",), "onnxruntime"))
add("wrong-answer", "device-cuda-without-gpu", option_case(("--device", "cuda"), "onnxruntime", expect="either"))
add("wrong-answer", "backend-tensorrt-on-model-dir", option_case((), "tensorrt", expect="either"))
add("wrong-answer", "demo-oracle-torch (control)", option_case((), "torch", expect="either", beam=1))
add("wrong-answer", "no-memory-arena (control)", option_case(("--no-memory-arena",), expect="either"))
add("wrong-answer", "memory-arena-spinning (control)", option_case(("--memory-arena", "--spinning"), expect="either"))
add("wrong-answer", "env-TFM_ORT_ARENA-bogus", option_case((), env={"TFM_ORT_ARENA": "sometimes"}))


def bench_threads_case(threads: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        out = t.p("b.json")
        t.output(out)
        return t.error(writer_run(t, "bench-json", out, ("--threads", threads)))
    return fn


for _th in ("4096", "100000"):
    add("wrong-answer", f"bench-threads-{_th}", bench_threads_case(_th))


def train_threads_case(t: Trial) -> tuple[str, str]:
    out = t.p("demo")
    t.output(out)
    return t.error(t.run("tfm-export", "train-demo", "--steps", 1, "--batch-size", 2, "--threads", 100000,
                         "--output", out))


add("wrong-answer", "train-demo-threads-100000", train_threads_case)


def bench_model_case(kind: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        src = {"int8": t.ctx.int8}[kind]() if kind == "int8" else None
        if kind == "fp16":
            src = t.p("fp16")
            r0 = t.ctx.run(["tfm-export", "quantize", "--model", t.ctx.tiny(), "--precision", "fp16", "--output", src],
                           cwd=t.dir)
            if r0.rc != 0:
                raise Skip(f"fp16 quantize failed: {short(r0.err)}")
        m = t.copy_model(src, "q")
        out = t.p("b.json")
        t.output(out)
        r = t.run("tfm-run", "bench", "--model", m, "--backends", "ort-fp32", "--batch-sizes", 1, "--beam-sizes", 1,
                  "--sentences", 2, "--repeats", 2, "--min-time", 0, "--output-length", 4, "--json", out,
                  timeout=2 * t.ctx.timeout)

        def check(r: Result) -> str | None:
            text = out.read_text() if out.exists() else ""
            return f"timed a {kind} directory" + (" and labelled it ort-fp32" if "ort-fp32" in text else "")
        return t.either(r, check)
    return fn


add("wrong-answer", "bench-model-int8-dir", bench_model_case("int8"))
add("wrong-answer", "bench-model-fp16-dir", bench_model_case("fp16"))


def bench_args_case(args: tuple, expect: str = "error",
                    mem_gb: float | None = None) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        out = t.p("b.json")
        t.output(out)
        base = {"--backends": "ort-fp32", "--batch-sizes": "1", "--beam-sizes": "1", "--sentences": "2",
                "--repeats": "2", "--min-time": "0", "--output-length": "4"}
        for i in range(0, len(args), 2):
            base[args[i]] = args[i + 1]
        flat = [x for kv in base.items() for x in kv]
        r = t.run("tfm-run", "bench", "--model", t.ctx.tiny(), *flat, "--json", out, timeout=2 * t.ctx.timeout,
                  mem_gb=mem_gb)
        if expect == "ok":
            def check(r: Result) -> str | None:
                try:
                    json.loads(out.read_text())
                except Exception as exc:
                    return f"--json not valid JSON: {exc!r}"
                return None
            return t.ok(r, check)
        return t.error(r) if expect == "error" else t.either(r)
    return fn


add("tracebacks", "bench-beam-sizes-100000", bench_args_case(("--beam-sizes", "100000")))
add("tracebacks", "bench-beam-sizes-empty", bench_args_case(("--beam-sizes", "")))
add("tracebacks", "bench-beam-sizes-0", bench_args_case(("--beam-sizes", "0")))
add("tracebacks", "bench-batch-sizes-abc", bench_args_case(("--batch-sizes", "abc")))
add("tracebacks", "bench-batch-sizes-negative", bench_args_case(("--batch-sizes", "-4")))
add("tracebacks", "bench-batch-sizes-1e9", bench_args_case(("--batch-sizes", "1000000000"), "either", mem_gb=10))
add("tracebacks", "bench-backends-bogus", bench_args_case(("--backends", "ort-fp32,warp-drive")))
add("tracebacks", "bench-backends-empty", bench_args_case(("--backends", ",")))
add("tracebacks", "bench-sentences-1e9", bench_args_case(("--sentences", "1000000000"), "either", mem_gb=10))
add("tracebacks", "bench-output-length-1e9", bench_args_case(("--output-length", "1000000000"), "either"))
add("tracebacks", "bench-min-time-nan", bench_args_case(("--min-time", "nan")))
add("tracebacks", "bench-min-time-inf", bench_args_case(("--min-time", "inf"), "either"))
add("tracebacks", "bench-json-valid (control)", bench_args_case((), "ok"))


# -- races, signals, leftovers -----------------------------------------------------------------------

def staging_of(folder: Path, name: str) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.startswith(f".{name}.") and p.name.endswith(".partial")]


def wait_for(cond: Callable[[], bool], p: subprocess.Popen, limit: float) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end and p.poll() is None:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def slow_writer_args(t: Trial, command: str, out: Path) -> list[Any]:
    if command == "onnx":
        return ["tfm-export", "onnx", "--checkpoint", t.ctx.tiny_ck() / "ckpt.pt", "--output", out]
    return ["tfm-export", "quantize", "--model", t.ctx.tiny(), "--precision", "int8", "--calibration",
            t.ctx.calib_big(), "--output", out]


def signal_case(command: str, sig: signal.Signals, delay: float) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        out = t.p("out")
        t.output(out)
        args = slow_writer_args(t, command, out)
        p = t.popen(*args)
        start = time.monotonic()
        time.sleep(delay)
        try:
            os.kill(p.pid, sig)
        except ProcessLookupError:
            pass
        r = t.wait(p, args, start=start)
        if r.rc == 130 and out.exists():
            problem = model_dir_ok(out)
            if problem:
                return "silent-wrong", f"interrupted, and {out.name} exists but is damaged: {problem}"
        return t.interrupted(r, lambda: model_dir_ok(out))
    return fn


for _cmd in ("onnx", "quantize"):
    for _sig in (signal.SIGINT, signal.SIGTERM):
        for _delay in (0.2, 0.5, 1.0, 1.5, 3.0):
            add("races", f"{_sig.name}-at-{_delay}s/{_cmd}", signal_case(_cmd, _sig, _delay))
    add("races", f"SIGHUP-at-3.0s/{_cmd}", signal_case(_cmd, signal.SIGHUP, 3.0))


def sigkill_case(command: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        out = t.p("out")
        t.output(out)
        args = slow_writer_args(t, command, out)
        p = t.popen(*args)
        saw = wait_for(lambda: bool(staging_of(t.dir, "out")), p, t.ctx.timeout)
        time.sleep(0.3)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.communicate()
        left = staging_of(t.dir, "out")
        r = t.run(*args)
        verdict = t.ok(r, lambda r: model_dir_ok(out))
        still = staging_of(t.dir, "out")
        if still:
            return "leftover", f"stale staging {still[0].name} survived a second run"
        note = "staging seen and killed" if saw and left else "killed (no staging left to clean)" if saw else \
            "finished before the kill"
        return verdict[0], f"{verdict[1]}; {note}"
    return fn


add("races", "SIGKILL-then-rerun/onnx", sigkill_case("onnx"))
add("races", "SIGKILL-then-rerun/quantize", sigkill_case("quantize"))


def foreign_staging_case(t: Trial) -> tuple[str, str]:
    """A staging-like directory of a LIVE process (this battery) and a user dir with our suffix must survive."""
    out = t.p("out")
    t.output(out)
    live = t.p(f".out.{os.getpid()}.abc.partial")
    live.mkdir()
    t.decoy(live / "keep.txt")
    r = t.run(*slow_writer_args(t, "onnx", out))
    return t.either(r, lambda r: model_dir_ok(out))


add("races", "live-foreign-staging-beside-output/onnx", foreign_staging_case)


def dir_appears_case(command: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        out = t.p("out")
        t.output(out)
        args = slow_writer_args(t, command, out)
        p = t.popen(*args)
        start = time.monotonic()
        wait_for(lambda: bool(staging_of(t.dir, "out")), p, t.ctx.timeout)
        if p.poll() is not None:
            raise Skip("the writer finished before the directory could be created")
        out.mkdir()
        (out / "user.txt").write_bytes(b"the user's file, made while the export ran\n")
        r = t.wait(p, args, start=start)
        if not (out / "user.txt").exists():
            return "silent-wrong", f"a directory created during the run was replaced without --force (exit {r.rc})"
        return t.error(r, "exit 0 but the output is the user's directory")
    return fn


add("races", "dir-created-during-run/onnx", dir_appears_case("onnx"))
add("races", "dir-created-during-run/quantize", dir_appears_case("quantize"))


def concurrent_case(command: str, force: bool) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        out = t.p("out")
        t.output(out)
        args = slow_writer_args(t, command, out) + (["--force"] if force else [])
        p1 = t.popen(*args)
        time.sleep(0.3)
        p2 = t.popen(*args)
        start = time.monotonic()
        r1 = t.wait(p1, args, timeout=3 * t.ctx.timeout, start=start)
        r2 = t.wait(p2, args, timeout=3 * t.ctx.timeout, start=start)
        for r in (r1, r2):
            bad = base_problem(r)
            if bad:
                return bad
        for r in (r1, r2):
            if r.rc != 0 and not is_clean_error(r):
                return "multi-line-error", short(" | ".join(r.err_lines[-2:]))
        problem = model_dir_ok(out)
        if problem:
            return "silent-wrong", problem
        if r1.rc == 0 and r2.rc == 0 and not force:
            return "silent-wrong", "both writers exited 0 on one --output without --force"
        return "ok" if r1.rc == 0 and r2.rc == 0 else "clean-error", \
            f"exits {r1.rc}/{r2.rc}; " + short((r2.err_lines or r1.err_lines or [""])[0], 80)
    return fn


add("races", "two-writers-one-output/onnx", concurrent_case("onnx", False))
add("races", "two-writers-one-output/quantize", concurrent_case("quantize", False))
add("races", "two-writers-one-output-force/quantize", concurrent_case("quantize", True))


def stream_case(script: str, expect: str, setup: str = "tiny") -> Callable[[Trial], tuple[str, str]]:
    """A shell redirection around one command: {X}/{R} are tfm-export/tfm-run, {M} the model, {O} an output."""
    def fn(t: Trial) -> tuple[str, str]:
        m = t.ctx.tiny()
        t.input(m)
        out = t.p("out.txt")
        t.output(out)
        cmd = script.format(X=shlex_q(t.ctx.bin / "tfm-export"), R=shlex_q(t.ctx.bin / "tfm-run"), M=shlex_q(m),
                            O=shlex_q(out), CK=shlex_q(t.p("ck")))
        if "{CK}" in script:
            t.output(t.p("ck"))
        r = t.sh(cmd)
        if expect == "error":
            return t.error(r, "output lost")
        if expect == "nonzero":  # stderr is closed too: only the exit status can tell
            bad = base_problem(r)
            return bad or (("clean-error", f"exit {r.rc}") if r.rc else ("silent-wrong", "exit 0"))
        if expect == "file":
            return t.ok(r, lambda r: None if out.exists() and out.read_text().strip() else "--output empty")
        return t.either(r)
    return fn


def shlex_q(p: Any) -> str:
    import shlex
    return shlex.quote(str(p))


add("races", "stdout-closed/translate", stream_case("{R} translate --model {M} 'w1 w2' >&-", "error"))
add("races", "stdout-closed/translate-jsonl", stream_case("{R} translate --model {M} --format jsonl 'w1' >&-", "error"))
add("races", "stdout-closed/inspect", stream_case("{X} inspect --model {M} >&-", "error"))
add("races", "stdout-closed/check", stream_case("{X} check --model {M} >&-", "error"))
add("races", "stdout-closed/translate-to-file", stream_case("{R} translate --model {M} 'w1 w2' --output {O} >&-",
                                                            "file"))
add("races", "stdout-closed/random-checkpoint",
    stream_case("{X} random-checkpoint --d-model 8 --heads 1 --layers 1 --ffn 8 --vocab-size 12 --output {CK} >&-",
                "either"))
add("races", "stdout-dev-full/translate", stream_case("{R} translate --model {M} 'w1 w2' >/dev/full", "error"))
add("races", "stdout-dev-full/inspect", stream_case("{X} inspect --model {M} >/dev/full", "error"))
add("races", "stdin-closed/translate", stream_case("{R} translate --model {M} <&-", "error"))
add("races", "stdin-closed-with-text/translate", stream_case("{R} translate --model {M} 'w1' <&-", "either"))
add("races", "stdin-dev-null/translate", stream_case("{R} translate --model {M} </dev/null", "either"))
add("races", "stderr-closed-on-error/translate", stream_case("{R} translate --model /nonexistent 'w1' 2>&-", "nonzero"))
add("races", "all-closed/translate", stream_case("{R} translate --model {M} 'w1' <&- >&- 2>&-", "nonzero"))


def broken_pipe_case(t: Trial) -> tuple[str, str]:
    m = t.ctx.tiny()
    inp = t.text("in.txt", "".join(f"w{i % 30} w{(i * 7) % 30}\n" for i in range(120)))
    args = ["tfm-run", "translate", "--model", m, "--input", inp, "--batch-size", 4, "--max-length", 20]
    p = t.popen(*args)
    start = time.monotonic()
    p.stdout.readline()
    p.stdout.close()
    try:
        p.wait(timeout=t.ctx.timeout)
        err = p.stderr.read()
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        err, timed_out = p.stderr.read(), True
    r = Result(args, p.returncode, "", err.decode("utf-8", "replace"), timed_out, time.monotonic() - start,
               t.ctx.timeout)
    bad = base_problem(r)
    if bad:
        return bad
    if r.rc == 0 or is_clean_error(r) or (r.rc != 0 and not r.err_lines):
        return "clean-error" if r.rc else "ok", f"reader went away: exit {r.rc}"
    return "multi-line-error", short(" | ".join(r.err_lines[-3:]))


add("races", "stdout-reader-goes-away/translate", broken_pipe_case)


def sigint_stdin_case(t: Trial, delay: float = 4.0) -> tuple[str, str]:
    args = ["tfm-run", "translate", "--model", t.ctx.tiny()]
    t.snap()
    p = subprocess.Popen(t.ctx.argv(args), cwd=t.dir, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=t.ctx.env, start_new_session=True, preexec_fn=child_setup())
    start = time.monotonic()
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    r = t.wait(p, args, start=start)
    return t.interrupted(r, lambda: "exit 0 although interrupted while reading stdin")


add("races", "SIGINT-while-reading-stdin/translate", sigint_stdin_case)
for _delay in (0.5, 1.5, 2.5):
    add("races", f"SIGINT-at-{_delay}s-stdin-open/translate", lambda t, d=_delay: sigint_stdin_case(t, d))


# -- tracebacks: checkpoint settings of the wrong type or range --------------------------------------------

CONFIG_BAD = {
    "dropout-lots": "cfg['dropout'] = 'lots'", "dropout-2.0": "cfg['dropout'] = 2.0",
    "dropout-neg": "cfg['dropout'] = -1", "dropout-nan": "cfg['dropout'] = float('nan')",
    "dropout-none": "cfg['dropout'] = None",
    "pad-out-of-range": "cfg['src_pad_idx'] = 40", "pad-negative": "cfg['src_pad_idx'] = -1",
    "pad-string": "cfg['src_pad_idx'] = '1'", "pad-float": "cfg['trg_pad_idx'] = 1.5",
    "d_model-bool": "cfg['d_model'] = True", "d_model-0": "cfg['d_model'] = 0", "d_model-neg": "cfg['d_model'] = -5",
    "d_model-1e12-float": "cfg['d_model'] = 1e12", "d_model-1e12-int": "cfg['d_model'] = 10**12",
    "d_model-17": "cfg['d_model'] = 17",
    "n_layers-float": "cfg['n_layers'] = 1.5", "n_layers-0": "cfg['n_layers'] = 0",
    "n_layers-1e6": "cfg['n_layers'] = 10**6",
    "n_head-0": "cfg['n_head'] = 0", "d_k-1e9": "cfg['d_k'] = 10**9", "d_inner-1e12": "cfg['d_inner'] = 10**12",
    "n_position-1e9": "cfg['n_position'] = 10**9", "n_position-0": "cfg['n_position'] = 0",
    "n_position-neg": "cfg['n_position'] = -1",
    "n_position-3": "cfg['n_position'] = 3",
    "vocab-1e9": "cfg['src_vocab_size'] = 10**9; cfg['trg_vocab_size'] = 10**9",
    "vocab-0": "cfg['src_vocab_size'] = 0", "vocab-mismatch": "cfg['trg_vocab_size'] = 41",
    "scale-bogus": "cfg['scale_emb_or_prj'] = 'bogus'",
    "share-string": "cfg['embs_share_weight'] = 'yes'",
    "missing-d_model": "del cfg['d_model']", "unknown-key": "cfg['warp_factor'] = 9",
    "config-list": "ck['config'] = [1, 2]", "config-none": "ck['config'] = None",
    "format-version-99": "ck['format_version'] = 99",
    "format-other": "ck['format'] = 'someone-else'", "model-list": "ck['model'] = [1, 2]",
    "tokenizer-field-missing": "del ck['tokenizer']",
    "whole-list": "out = [1, 2, 3]",
    "text-file": "out = b'this is not a checkpoint\\n'", "empty-file": "out = b''",
    "random-bytes": "out = os.urandom(4096)", "zip-not-torch": "import io, zipfile\nb = io.BytesIO()\n"
    "zipfile.ZipFile(b, 'w').writestr('a.txt', 'x')\nout = b.getvalue()",
    "truncated": "import io\nb = io.BytesIO()\ntorch.save(ck, b)\nout = b.getvalue()[: len(b.getvalue()) // 2]",
    "legacy-pickle-format": "import io\nb = io.BytesIO()\ntorch.save(ck, b, _use_new_zipfile_serialization=False)\n"
    "out = b.getvalue()",
    "seed-settings-dict": "out = {'settings': dict(ck['config']), 'model': ck['model']}",
    "seed-settings-bad-d_model": "out = {'settings': Namespace(**{**ck['config'], 'd_model': 'x', 'd_word_vec': 16, "
    "'d_inner_hid': 32}), 'model': ck['model']}",
    "seed-settings-missing": "out = {'settings': Namespace(d_model=16), 'model': ck['model']}",
}
for _k, _code in CONFIG_BAD.items():
    ck_variant(f"cfg-{_k}", "tiny", TINY_CFG + _code)
CONFIG_FINE = ("unknown-key", "legacy-pickle-format")  # may be accepted


def config_case(key: str, command: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        ck = t.copy_ck(t.ctx.ckpts()[f"cfg-{key}"])
        extra = ["--vocab", t.ctx.seed_vocab()] if key.startswith("seed-") else []
        if command == "onnx":
            out = t.p("out")
            t.output(out)
            r = t.run("tfm-export", "onnx", "--checkpoint", ck, *extra, "--output", out, mem_gb=12)
        elif command == "translate":
            r = t.run("tfm-run", "translate", "--model", ck, *extra, TINY_SENT, mem_gb=12)
        else:
            m = t.copy_model(t.ctx.tiny())
            r = t.run("tfm-export", "verify", "--model", m, "--checkpoint", ck, *extra, "--samples", 1, "--steps", 2,
                      "--beam-size", 1, mem_gb=12)
        return t.either(r) if key in CONFIG_FINE else t.error(r)
    return fn


for _k in CONFIG_BAD:
    add("tracebacks", f"ckpt-config-{_k}/onnx", config_case(_k, "onnx"))
for _k in ("dropout-lots", "d_model-bool", "n_position-1e9", "truncated"):
    add("tracebacks", f"ckpt-config-{_k}/translate", config_case(_k, "translate"))
for _k in ("n_position-1e9", "text-file"):
    add("tracebacks", f"ckpt-config-{_k}/verify", config_case(_k, "verify"))


# -- tracebacks: manifests ---------------------------------------------------------------------------------

MISSING_KEYS = ("format", "format_version", "model", "tokenizer", "tokenizer.source", "tokenizer.target", "limits",
                "limits.max_source_length", "limits.max_target_length", "special_tokens", "precision", "opset",
                "graphs", "graphs.encoder", "graphs.encoder.file", "graphs.encoder.sha256", "graphs.decoder_step",
                "graphs.decoder_step.file", "graphs.decoder_step.sha256", "files", "source_checkpoint",
                "optimizations", "model.d_model", "model.n_position", "model.src_vocab_size", "model.n_layers",
                "graphs.encoder.inputs", "graphs.decoder_step.outputs")
OPTIONAL_KEYS = ("graphs.encoder.inputs", "graphs.decoder_step.outputs", "source_checkpoint")


def manifest_missing_case(key: str, reader: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        m = t.copy_model(t.ctx.tiny())
        man = load_manifest(m)
        del_dotted(man, key)
        save_manifest(m, man)
        r = reader_run(t, reader, m)
        if reader == "translate":  # harmless if the answer is still right
            ref = t.ctx.tiny_ref()
            return t.either(r, lambda r: None if r.out == ref else f"wrong translation {short(r.out, 40)!r}")
        return t.either(r) if key in OPTIONAL_KEYS else t.error(r)
    return fn


for _key in MISSING_KEYS:
    add("tracebacks", f"manifest-missing-{_key}/translate", manifest_missing_case(_key, "translate"))
for _key in ("model", "limits", "files", "graphs.decoder_step"):
    for _reader in ("inspect", "check", "quantize"):
        add("tracebacks", f"manifest-missing-{_key}/{_reader}", manifest_missing_case(_key, _reader))
for _key in ("model.d_model", "model.n_layers", "model.n_head", "model.d_k", "model.src_vocab_size",
             "model.trg_vocab_size", "model.n_position", "model.d_inner"):
    add("tracebacks", f"manifest-missing-{_key}/inspect", manifest_missing_case(_key, "inspect"))

MANIFEST_VALUES: dict[str, tuple[str, Any]] = {
    "max_target_length-string": ("limits.max_target_length", "200"),
    "max_target_length-0": ("limits.max_target_length", 0),
    "max_target_length-1e9": ("limits.max_target_length", 10**9),
    "max_target_length-201": ("limits.max_target_length", 201),
    "max_target_length-null": ("limits.max_target_length", None),
    "max_target_length-bool": ("limits.max_target_length", True),
    "max_target_length-float": ("limits.max_target_length", 2.5),
    "max_source_length-list": ("limits.max_source_length", [1]),
    "limits-string": ("limits", "big"),
    "d_model-list": ("model.d_model", [16]), "d_model-string": ("model.d_model", "16"),
    "d_model-bool": ("model.d_model", True), "d_model-0": ("model.d_model", 0), "d_model-32": ("model.d_model", 32),
    "n_head-0": ("model.n_head", 0), "n_head-3": ("model.n_head", 3),
    "n_position-1e9": ("model.n_position", 10**9), "n_position-neg": ("model.n_position", -1),
    "vocab-1e9": ("model.src_vocab_size", 10**9), "vocab-39": ("model.trg_vocab_size", 39),
    "dropout-lots": ("model.dropout", "lots"), "pad-99": ("model.src_pad_idx", 99),
    "model-string": ("model", "x"), "model-null": ("model", None), "model-list": ("model", []),
    "model-empty": ("model", {}),
    "precision-fp64": ("precision", "fp64"), "precision-null": ("precision", None),
    "precision-int8-no-mode": ("precision", "int8"), "precision-fp16-claimed": ("precision", "fp16"),
    "opset-string": ("opset", "17"), "opset-0": ("opset", 0), "opset-bool": ("opset", True),
    "opset-1e9": ("opset", 10**9),
    "special-eos-5": ("special_tokens", {"bos": 2, "eos": 5, "pad": 1, "unk": 0}),
    "special-null": ("special_tokens", None),
    "files-list": ("files", []), "files-bad-sha": ("files", {"tokenizer.json": "abc"}),
    "files-null": ("files", None), "files-empty": ("files", {}),
    "graphs-list": ("graphs", []), "graphs-null": ("graphs", None),
    "graphs-encoder-string": ("graphs.encoder", "encoder.onnx"),
    "encoder-sha-zeros": ("graphs.encoder.sha256", "0" * 64), "encoder-sha-null": ("graphs.encoder.sha256", None),
    "encoder-sha-int": ("graphs.encoder.sha256", 5), "encoder-file-int": ("graphs.encoder.file", 5),
    "encoder-file-null": ("graphs.encoder.file", None), "encoder-file-empty": ("graphs.encoder.file", ""),
    "encoder-file-dot": ("graphs.encoder.file", "."),
    "tokenizer-string": ("tokenizer", "tokenizer.json"), "tokenizer-null": ("tokenizer", None),
    "tokenizer-source-list": ("tokenizer.source", ["tokenizer.json"]),
    "format_version-1": ("format_version", 1), "format_version-3": ("format_version", 3),
    "format_version-string": ("format_version", "2"), "format_version-null": ("format_version", None),
    "format-engines": ("format", "tfm-export-engines"), "format-null": ("format", None),
    "format-upper": ("format", "TFM-EXPORT-MODEL"),
    "optimizations-string": ("optimizations", "none"), "source_checkpoint-string": ("source_checkpoint", "x"),
    "optimizations-numbers": ("optimizations", [1, 2]),
    "encoder-inputs-bogus": ("graphs.encoder.inputs", [{"name": "evil", "dtype": "int64", "shape": [1]}]),
}
MANIFEST_VALUES_FINE = ("encoder-inputs-bogus", "source_checkpoint-string", "optimizations-string")


def manifest_value_case(key: str, reader: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        m = t.copy_model(t.ctx.tiny())
        man = load_manifest(m)
        dotted, value = MANIFEST_VALUES[key]
        set_dotted(man, dotted, value)
        save_manifest(m, man)
        r = reader_run(t, reader, m, timeout=None)
        if reader == "translate":  # a false claim the runtime never relies on is harmless if the answer is right
            ref = t.ctx.tiny_ref()
            return t.either(r, lambda r: None if r.out == ref else f"wrong translation {short(r.out, 40)!r}")
        return t.either(r) if key in MANIFEST_VALUES_FINE else t.error(r)
    return fn


for _key in MANIFEST_VALUES:
    add("tracebacks", f"manifest-{_key}/translate", manifest_value_case(_key, "translate"))
for _key in ("max_target_length-string", "d_model-list", "model-string", "n_position-1e9", "vocab-1e9",
             "precision-fp16-claimed", "graphs-encoder-string", "special-eos-5", "optimizations-numbers",
             "model-empty"):
    for _reader in ("inspect", "check", "quantize"):
        add("tracebacks", f"manifest-{_key}/{_reader}", manifest_value_case(_key, _reader))


def manifest_file_case(kind: str, reader: str) -> Callable[[Trial], tuple[str, str]]:
    """The manifest file itself hostile."""
    def fn(t: Trial) -> tuple[str, str]:
        m = t.copy_model(t.ctx.tiny())
        mf = m / "manifest.json"
        text = mf.read_text()
        expect = "error"
        if kind == "list":
            mf.write_text("[]")
        elif kind == "null":
            mf.write_text("null")
        elif kind == "string":
            mf.write_text('"manifest"')
        elif kind == "number":
            mf.write_text("42")
        elif kind == "empty-object":
            mf.write_text("{}")
        elif kind == "empty-file":
            mf.write_text("")
        elif kind == "truncated":
            mf.write_text(text[: len(text) // 2])
        elif kind == "non-utf8":
            mf.write_bytes(text.replace('"tool": "tfm-export"', '"tool": "tfm-\xe9xport"').encode("latin-1"))
        elif kind == "utf16":
            mf.write_bytes(text.encode("utf-16"))
        elif kind == "bom":
            mf.write_bytes(b"\xef\xbb\xbf" + text.encode())
            expect = "either"
        elif kind == "nan-literal":
            mf.write_text(re.sub(r'"max_target_length": \d+', '"max_target_length": NaN', text))
        elif kind == "infinity-literal":
            mf.write_text(re.sub(r'"n_position": \d+', '"n_position": Infinity', text))
        elif kind == "huge-int-literal":
            mf.write_text(re.sub(r'"max_target_length": \d+', '"max_target_length": ' + "9" * 5000, text))
        elif kind == "duplicate-keys":
            mf.write_text(text.replace('"precision": "fp32"', '"precision": "fp32", "precision": "int8"'))
        elif kind == "sparse-600MB":
            with open(mf, "r+b") as f:
                f.truncate(600 << 20)
        elif kind == "directory":
            mf.unlink()
            mf.mkdir()
        elif kind == "fifo":
            mf.unlink()
            os.mkfifo(mf)
        elif kind == "symlink-dev-null":
            mf.unlink()
            os.symlink("/dev/null", mf)
        elif kind == "symlink-outside-copy":
            t.text("outside/manifest.json", text)
            mf.unlink()
            os.symlink("../outside/manifest.json", mf)
            expect = "either"
        elif kind == "unreadable":
            mf.chmod(0)  # root reads it anyway; a non-root run gets EACCES
            expect = "either"
        else:
            raise ValueError(kind)
        r = reader_run(t, reader, m)
        return t.error(r) if expect == "error" else t.either(r)
    return fn


MANIFEST_FILE_KINDS = ("list", "null", "string", "number", "empty-object", "empty-file", "truncated", "non-utf8",
                       "utf16", "bom", "nan-literal", "infinity-literal", "huge-int-literal", "duplicate-keys",
                       "sparse-600MB", "directory", "fifo", "symlink-dev-null", "symlink-outside-copy", "unreadable")
for _kind in MANIFEST_FILE_KINDS:
    add("tracebacks", f"manifest-file-{_kind}/translate", manifest_file_case(_kind, "translate"))
for _kind in ("list", "non-utf8", "fifo", "sparse-600MB", "nan-literal"):
    for _reader in ("inspect", "check", "quantize"):
        add("tracebacks", f"manifest-file-{_kind}/{_reader}", manifest_file_case(_kind, _reader))


def graph_swap_case(kind: str, reader: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        m = t.copy_model(t.ctx.tiny())
        man = load_manifest(m)
        if kind == "same-graph-twice":
            man["graphs"]["decoder_step"]["file"] = "encoder.onnx"
        elif kind == "graphs-swapped":
            graphs = man["graphs"]
            graphs["encoder"]["file"], graphs["decoder_step"]["file"] = "decoder_step.onnx", "encoder.onnx"
        elif kind == "encoder-of-other-model":
            shutil.copyfile(t.ctx.demo() / "encoder.onnx", m / "encoder.onnx")
        elif kind == "decoder-of-other-model":
            shutil.copyfile(t.ctx.demo() / "decoder_step.onnx", m / "decoder_step.onnx")
        elif kind == "both-graphs-of-other-model":
            for g in ("encoder.onnx", "decoder_step.onnx"):
                shutil.copyfile(t.ctx.demo() / g, m / g)
        elif kind == "graph-not-onnx":
            (m / "encoder.onnx").write_text("this is not a protobuf\n")
        elif kind == "graph-empty":
            (m / "encoder.onnx").write_bytes(b"")
        elif kind == "graph-truncated":
            data = (m / "decoder_step.onnx").read_bytes()
            (m / "decoder_step.onnx").write_bytes(data[: len(data) // 2])
        elif kind == "graph-is-directory":
            (m / "encoder.onnx").unlink()
            (m / "encoder.onnx").mkdir()
        elif kind == "int8-graph-in-fp32-dir":
            shutil.copyfile(t.ctx.int8() / load_manifest(t.ctx.int8())["graphs"]["decoder_step"]["file"],
                            m / "decoder_step.onnx")
        else:
            raise ValueError(kind)
        save_manifest(m, man)
        rehash(m)
        r = reader_run(t, reader, m)
        if reader == "inspect":  # it describes whatever is there; refusing is optional
            return t.either(r)
        if kind == "int8-graph-in-fp32-dir" and reader == "translate":  # honours the contract; output may differ
            return t.either(r)
        return t.error(r)
    return fn


for _kind in ("same-graph-twice", "graphs-swapped", "encoder-of-other-model", "decoder-of-other-model",
              "both-graphs-of-other-model", "graph-not-onnx", "graph-empty", "graph-truncated", "graph-is-directory",
              "int8-graph-in-fp32-dir"):
    for _reader in ("translate", "inspect", "check", "quantize"):
        if _reader != "translate" and _kind in ("graph-empty", "graph-is-directory", "graph-truncated"):
            continue
        add("tracebacks", f"graph-{_kind}/{_reader}", graph_swap_case(_kind, _reader))


def bad_tokenizer_case(kind: str, reader: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        m = t.copy_model(t.ctx.tiny())
        tok = m / "tokenizer.json"
        data = json.loads(tok.read_text())
        if kind == "garbage":
            tok.write_text("this is not JSON {")
        elif kind == "not-a-tokenizer":
            tok.write_text(json.dumps({"model": 5}))
        elif kind == "json-list":
            tok.write_text(json.dumps([1, 2, 3]))
        elif kind == "empty":
            tok.write_text("")
        elif kind == "vocab-too-small":
            del data["model"]["vocab"]["w35"]
            tok.write_text(json.dumps(data))
        elif kind == "eos-wrong-id":
            v = data["model"]["vocab"]
            v["</s>"], v["w0"] = v["w0"], v["</s>"]
            for a in data["added_tokens"]:
                if a["content"] == "</s>":
                    a["id"] = v["</s>"]
            tok.write_text(json.dumps(data))
        elif kind == "other-models-tokenizer":
            shutil.copyfile(t.ctx.demo_ck() / "tokenizer.json", tok)
        elif kind == "non-utf8":
            tok.write_bytes(tok.read_bytes().replace(b'"w1"', b'"w\xff"'))
        elif kind == "unknown-model-type":
            data["model"]["type"] = "QuantumLevel"
            tok.write_text(json.dumps(data))
        else:
            raise ValueError(kind)
        rehash(m)
        return t.error(reader_run(t, reader, m), "a tokenizer that does not fit was accepted")
    return fn


for _kind in ("garbage", "not-a-tokenizer", "json-list", "empty", "vocab-too-small", "eos-wrong-id",
              "other-models-tokenizer", "non-utf8", "unknown-model-type"):
    add("tracebacks", f"tokenizer-{_kind}/check", bad_tokenizer_case(_kind, "check"))
    if _kind in ("garbage", "not-a-tokenizer", "vocab-too-small", "eos-wrong-id"):
        for _reader in ("quantize", "inspect", "translate", "verify"):
            add("tracebacks", f"tokenizer-{_kind}/{_reader}", bad_tokenizer_case(_kind, _reader))


# -- tracebacks: vocabularies for seed checkpoints ------------------------------------------------------

def big_vocab(t: Trial) -> bytes:
    words = [b"<unk>", b"<blank>", b"<s>", b"</s>"]
    n = 0
    chunks = [b"\n".join(words)]
    size = 0
    while size < 61 << 20:
        chunk = b"".join(b"\ntok%09d" % i for i in range(n, n + 100_000))
        chunks.append(chunk)
        size += len(chunk)
        n += 100_000
    return b"".join(chunks) + b"\n"


def seed_vocab_bytes(t: Trial, transform: Callable[[list[str]], list[str]]) -> bytes:
    words = t.ctx.seed_vocab().read_text().split("\n")[:-1]
    return ("\n".join(transform(words)) + "\n").encode()


def _swap_eos(w: list[str]) -> list[str]:
    w = list(w)
    w[3], w[4] = w[4], w[3]
    return w


VOCAB_BAD: dict[str, tuple[Callable[[Trial], bytes], str]] = {
    "61MB-plain": (big_vocab, "vocab.txt"),
    "eos-wrong-id": (lambda t: seed_vocab_bytes(t, _swap_eos), "vocab.txt"),
    "too-small": (lambda t: seed_vocab_bytes(t, lambda w: w[:-1]), "vocab.txt"),
    "too-large": (lambda t: seed_vocab_bytes(t, lambda w: w + ["extra"]), "vocab.txt"),
    "duplicates": (lambda t: seed_vocab_bytes(t, lambda w: w[:-1] + [w[5]]), "vocab.txt"),
    "json-dict-string-ids": (lambda t: json.dumps({w: str(i) for i, w in enumerate(
        t.ctx.seed_vocab().read_text().split())}).encode(), "vocab.json"),
    "json-dict-gaps": (lambda t: json.dumps({w: i * 2 for i, w in enumerate(
        t.ctx.seed_vocab().read_text().split())}).encode(), "vocab.json"),
    "json-list-of-ints": (lambda t: json.dumps(list(range(40))).encode(), "vocab.json"),
    "json-list-nested": (lambda t: json.dumps([["a"]] * 40).encode(), "vocab.json"),
    "empty": (lambda t: b"", "vocab.txt"),
    "binary": (lambda t: os.urandom(2000), "vocab.bin"),
    "blank-lines": (lambda t: b"\n" * 40, "vocab.txt"),
    "crlf": (lambda t: seed_vocab_bytes(t, lambda w: w).replace(b"\n", b"\r\n"), "vocab.txt"),
    "bom": (lambda t: b"\xef\xbb\xbf" + seed_vocab_bytes(t, lambda w: w), "vocab.txt"),
}
VOCAB_FINE = ("crlf", "bom")

for _k, (_content, _name) in VOCAB_BAD.items():
    add("tracebacks", f"seed-vocab-{_k}/onnx", vocab_case(_content, "onnx",
                                                          "either" if _k in VOCAB_FINE else "error", _name))
    if _k in ("61MB-plain", "eos-wrong-id", "binary", "bom"):
        add("tracebacks", f"seed-vocab-{_k}/translate",
            vocab_case(_content, "translate", "either" if _k in VOCAB_FINE else "error", _name))


def vocab_path_case(kind: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        ck = t.copy_ck(t.ctx.ckpts()["seed"])
        v = t.text("vocab.txt", t.ctx.seed_vocab().read_bytes())
        if kind == "dev-null":
            vocabs = ["/dev/null"]
        elif kind == "directory":
            vocabs = [t.dir]
        elif kind == "three-times":
            vocabs = [v, v, v]
        elif kind == "missing":
            vocabs = [t.p("nope.txt")]
        elif kind == "none-given":
            vocabs = []
        else:
            raise ValueError(kind)
        flat = [x for vv in vocabs for x in ("--vocab", vv)]
        return t.error(t.run("tfm-run", "translate", "--model", ck, *flat, TINY_SENT))
    return fn


for _kind in ("dev-null", "directory", "three-times", "missing", "none-given"):
    add("tracebacks", f"seed-vocab-path-{_kind}/translate", vocab_path_case(_kind))


# -- tracebacks: outputs that cannot be written ----------------------------------------------------------------

def readonly_case(writer: str, what: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        folder = t.p("immutable")
        folder.mkdir()
        name, inner = writer_out_names(writer)
        out = folder / name
        if what == "file":
            out.write_bytes(b"old\n")
            t.input(out)
        if subprocess.run(["chattr", "+i", str(folder if what == "dir" else out)], capture_output=True).returncode:
            raise Skip("chattr +i not permitted here")
        try:
            r = writer_run(t, writer, out, ("--force",) if inner and writer in ("onnx", "quantize") else ())
        finally:
            subprocess.run(["chattr", "-i", str(folder if what == "dir" else out)], capture_output=True)
        return t.error(r)
    return fn


for _w in WRITERS:
    add("tracebacks", f"read-only-dir/{_w}", readonly_case(_w, "dir"))
for _w in ("translate", "bench-json"):
    add("tracebacks", f"read-only-existing-file/{_w}", readonly_case(_w, "file"))


def empty_output_case(writer: str, value: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        if value:  # a blank name is a (strange) name: what lands there is the named output
            t.output(t.p(value))
        if writer == "trt":
            return t.error(t.run("tfm-export", "trt", "--model", t.ctx.tiny(), "--output", value))
        if writer == "bench-plot":
            return t.error(writer_run(t, "bench-plot", Path(value)))
        return t.error(writer_run(t, writer, value))  # type: ignore[arg-type]
    return fn


for _w in WRITERS + ("trt", "bench-plot"):
    add("tracebacks", f"output-empty-string/{_w}", empty_output_case(_w, ""))
for _w in ("onnx", "translate", "random-checkpoint"):
    add("tracebacks", f"output-blank/{_w}", empty_output_case(_w, " "))
add("tracebacks", "output-dot-force/onnx", lambda t: t.error(writer_run(t, "onnx", ".", ("--force",))))
add("tracebacks", "output-dotdot-force/quantize", lambda t: t.error(writer_run(t, "quantize", "..", ("--force",))))
add("tracebacks", "output-parent-is-file/translate",
    lambda t: t.error(writer_run(t, "translate", t.text("afile", "x") / "out.txt")))
add("tracebacks", "output-parent-is-file/onnx",
    lambda t: t.error(writer_run(t, "onnx", t.text("afile", "x") / "model")))
add("tracebacks", "output-is-directory/translate", lambda t: t.error(writer_run(t, "translate", t.dir)))
add("tracebacks", "output-name-too-long/translate", lambda t: t.error(writer_run(t, "translate", t.p("x" * 300))))
add("tracebacks", "output-name-too-long/onnx", lambda t: t.error(writer_run(t, "onnx", t.p("x" * 300))))
add("tracebacks", "output-control-chars/translate",
    lambda t: (t.output(t.p("out\x01\x7f\n.txt")), t.either(writer_run(t, "translate", t.p("out\x01\x7f\n.txt"))))[1])


def big_option_case(args: list[Any], expect: str = "error",
                    mem_gb: float | None = 12) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        full = [a if not callable(a) else a(t) for a in args]
        r = t.run(*full, mem_gb=mem_gb, timeout=2 * t.ctx.timeout)
        return t.error(r) if expect == "error" else t.either(r)
    return fn


TINY_VERIFY = ["tfm-export", "verify", "--model", lambda t: t.ctx.tiny(), "--checkpoint",
               lambda t: t.ctx.tiny_ck() / "ckpt.pt"]
add("tracebacks", "verify-beam-size-100000", big_option_case([*TINY_VERIFY, "--beam-size", 100000]))
add("tracebacks", "verify-samples-1e9", big_option_case([*TINY_VERIFY, "--samples", 10**9], "either"))
add("tracebacks", "verify-steps-1e9", big_option_case([*TINY_VERIFY, "--samples", 1, "--steps", 10**9, "--beam-size",
                                                       1], "either"))
add("tracebacks", "verify-atol-nan", big_option_case([*TINY_VERIFY, "--samples", 1, "--steps", 2, "--atol", "nan"]))
add("tracebacks", "verify-rtol-negative", big_option_case([*TINY_VERIFY, "--samples", 1, "--steps", 2, "--rtol", "-1"]))
add("tracebacks", "translate-max-length-1e9", big_option_case(["tfm-run", "translate", "--model",
                                                               lambda t: t.ctx.tiny(), "--max-length", 10**9,
                                                               TINY_SENT], "either"))
add("tracebacks", "translate-batch-size-1e9", big_option_case(["tfm-run", "translate", "--model",
                                                               lambda t: t.ctx.tiny(), "--batch-size", 10**9,
                                                               TINY_SENT], "either"))
add("tracebacks", "translate-beam-64-batch-1e4", big_option_case(["tfm-run", "translate", "--model",
                                                                  lambda t: t.ctx.tiny(), "--beam-size", 64,
                                                                  "--max-length", 5, TINY_SENT], "either"))
add("tracebacks", "eval-demo-beam-size-100000", big_option_case(["tfm-export", "eval-demo", "--model",
                                                                 lambda t: t.ctx.tiny(), "--beam-size", 100000]))
add("tracebacks", "quantize-calibration-max-length-1e9",
    big_option_case(["tfm-export", "quantize", "--model", lambda t: t.ctx.tiny(), "--precision", "int8",
                     "--calibration", lambda t: t.ctx.calib(), "--calibration-max-length", 10**9, "--output",
                     lambda t: (t.output(t.p("q")), t.p("q"))[1]], "either"))
add("tracebacks", "trt-max-batch-1e9", big_option_case(["tfm-export", "trt", "--model", lambda t: t.ctx.tiny(),
                                                        "--max-batch", 10**9, "--output",
                                                        lambda t: (t.output(t.p("e")), t.p("e"))[1]]))
add("tracebacks", "check-n_position-1e9-rehashed", big_option_case(
    ["tfm-export", "check", "--model", lambda t: _claim_positions(t, 10**9)]))


def _claim_positions(t: Trial, n: int) -> Path:
    m = t.copy_model(t.ctx.tiny())
    man = load_manifest(m)
    man["model"]["n_position"] = n
    man["limits"]["max_source_length"] = man["limits"]["max_target_length"] = n
    save_manifest(m, man)
    return m


# -- more hostile paths: odd --model arguments, wrong kinds of directory ---------------------------------------

def model_arg_case(kind: str, command: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        if kind == "checkpoint-file":
            model = t.ctx.tiny_ck() / "ckpt.pt"
        elif kind == "dev-null":
            model = Path("/dev/null")
        elif kind == "fifo":
            model = t.p("fifo")
            os.mkfifo(model)
        elif kind == "missing":
            model = t.p("nope")
        elif kind == "empty-dir":
            model = t.p("empty")
            model.mkdir()
        elif kind == "manifest-only":
            model = t.p("mo")
            model.mkdir()
            shutil.copyfile(t.ctx.tiny() / "manifest.json", model / "manifest.json")
        elif kind == "engine-manifest":
            model = t.copy_model(t.ctx.tiny())
            man = load_manifest(model)
            man["format"] = "tfm-export-engines"
            save_manifest(model, man)
        elif kind == "int8-dir":
            model = t.ctx.int8()
        elif kind == "text-file-pt":
            model = t.text("model.pt", "not a checkpoint")
        else:
            raise ValueError(kind)
        if command == "inspect":
            r = t.run("tfm-export", "inspect", "--model", model)
        elif command == "translate":
            r = t.run("tfm-run", "translate", "--model", model, TINY_SENT)
        elif command == "quantize":
            t.output(t.p("q"))
            r = t.run("tfm-export", "quantize", "--model", model, "--precision", "fp16", "--output", t.p("q"))
        elif command == "bench":
            t.output(t.p("b.json"))
            r = t.run("tfm-run", "bench", "--model", model, "--backends", "ort-fp32", "--sentences", 2, "--repeats",
                      2, "--min-time", 0, "--output-length", 4, "--batch-sizes", 1, "--beam-sizes", 1, "--json",
                      t.p("b.json"))
        else:
            r = t.run("tfm-export", "eval-demo", "--model", model)
        if kind in ("checkpoint-file", "int8-dir") and command in ("translate", "inspect"):
            return t.either(r)
        return t.error(r)
    return fn


for _kind in ("checkpoint-file", "dev-null", "fifo", "missing", "empty-dir", "manifest-only", "engine-manifest",
              "int8-dir", "text-file-pt"):
    for _cmd in ("inspect", "translate", "quantize"):
        add("misc", f"model-arg-{_kind}/{_cmd}", model_arg_case(_kind, _cmd))
for _kind in ("fifo", "dev-null", "engine-manifest"):
    add("misc", f"model-arg-{_kind}/bench", model_arg_case(_kind, "bench"))
    add("misc", f"model-arg-{_kind}/eval-demo", model_arg_case(_kind, "eval-demo"))


def calibration_case(kind: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        out = t.p("q")
        t.output(out)
        extra: list[Any] = []
        if kind == "none":
            pass
        elif kind == "dev-null":
            extra = ["--calibration", "/dev/null"]
        elif kind == "empty":
            extra = ["--calibration", t.text("c.txt", "")]
        elif kind == "binary":
            extra = ["--calibration", t.text("c.bin", os.urandom(3000))]
        elif kind == "blank-lines":
            extra = ["--calibration", t.text("c.txt", "\n\n\n")]
        elif kind == "unknown-words":
            extra = ["--calibration", t.text("c.txt", "zzz qqq\nxxx\n")]
        elif kind == "fifo-with-writer":
            f = t.p("c.fifo")
            os.mkfifo(f)
            t.input(f)

            def write() -> None:
                with open(f, "wb") as w:
                    w.write(t.ctx.calib().read_bytes())
            th = threading.Thread(target=write, daemon=True)
            th.start()
            t.threads.append(th)
            extra = ["--calibration", f]
        else:
            raise ValueError(kind)
        r = t.run("tfm-export", "quantize", "--model", t.ctx.tiny(), "--precision", "int8", *extra, "--output", out)
        if kind in ("unknown-words", "fifo-with-writer"):
            if kind == "fifo-with-writer" and t.threads[-1].is_alive():
                try:
                    os.close(os.open(t.p("c.fifo"), os.O_RDONLY | os.O_NONBLOCK))
                except OSError:
                    pass
            return t.either(r, lambda r: model_dir_ok(out))
        return t.error(r)
    return fn


for _kind in ("none", "dev-null", "empty", "binary", "blank-lines", "unknown-words", "fifo-with-writer"):
    add("misc", f"quantize-calibration-{_kind}", calibration_case(_kind))


def contradictory_case(args: list[Any]) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        full = [a if not callable(a) else a(t) for a in args]
        return t.error(t.run(*full))
    return fn


def _out(name: str) -> Callable[[Trial], Path]:
    return lambda t: (t.output(t.p(name)), t.p(name))[1]


add("misc", "trt-fp16-and-int8", contradictory_case(["tfm-export", "trt", "--model", lambda t: t.ctx.tiny(), "--fp16",
                                                     "--int8", "--output", _out("e")]))
add("misc", "check-trt-without-gpu", contradictory_case(["tfm-export", "check", "--model", lambda t: t.ctx.tiny(),
                                                         "--trt"]))
add("misc", "quantize-fp16-with-mode", contradictory_case(["tfm-export", "quantize", "--model", lambda t: t.ctx.tiny(),
                                                           "--precision", "fp16", "--mode", "static", "--output",
                                                           _out("q")]))
add("misc", "quantize-int8-of-int8", contradictory_case(["tfm-export", "quantize", "--model", lambda t: t.ctx.int8(),
                                                         "--precision", "int8", "--mode", "dynamic", "--output",
                                                         _out("q")]))
add("misc", "verify-int8-reference-int8", contradictory_case(
    ["tfm-export", "verify", "--model", lambda t: t.ctx.int8(), "--reference", lambda t: t.ctx.int8(), "--input",
     lambda t: t.ctx.calib()]))
add("misc", "verify-int8-empty-input", contradictory_case(
    ["tfm-export", "verify", "--model", lambda t: t.ctx.int8(), "--input", lambda t: t.text("e.txt", "")]))
add("misc", "verify-int8-without-input", contradictory_case(["tfm-export", "verify", "--model",
                                                             lambda t: t.ctx.int8()]))
add("misc", "verify-fp32-wrong-checkpoint", contradictory_case(
    ["tfm-export", "verify", "--model", lambda t: t.ctx.tiny(), "--checkpoint", lambda t: t.ctx.demo_ck() / "ckpt.pt",
     "--samples", 1, "--steps", 2]))
add("misc", "eval-demo-on-tiny-model", lambda t: t.either(t.run("tfm-export", "eval-demo", "--model", t.ctx.tiny(),
                                                                "--show-misses", 0, timeout=3 * t.ctx.timeout)))


# -- more in the same spirit ---------------------------------------------------------------------------------

def link_swap_case(target: str, reader: str) -> Callable[[Trial], tuple[str, str]]:
    """A file of the model directory replaced by a link to an identical copy outside it: the manifest still
    matches byte for byte, only containment can refuse it."""
    def fn(t: Trial) -> tuple[str, str]:
        m = t.copy_model(t.ctx.tiny())
        name = {"tokenizer": "tokenizer.json", "encoder": "encoder.onnx", "decoder": "decoder_step.onnx"}[target]
        copy = t.text(f"outside/{name}", (m / name).read_bytes())
        (m / name).unlink()
        os.symlink(copy, m / name)
        return t.error(reader_run(t, reader, m), f"{name} is a link out of the directory")
    return fn


for _target in ("tokenizer", "encoder", "decoder"):
    for _reader in ("translate", "inspect", "check", "quantize"):
        add("security", f"model-file-linked-outside-{_target}/{_reader}", link_swap_case(_target, _reader))


def ckpt_tokenizer_link_case(command: str) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        ck = t.copy_ck(t.ctx.tiny_ck())
        copy = t.text("outside/tokenizer.json", (ck.parent / "tokenizer.json").read_bytes())
        (ck.parent / "tokenizer.json").unlink()
        os.symlink(copy, ck.parent / "tokenizer.json")
        if command == "onnx":
            t.output(t.p("out"))
            r = t.run("tfm-export", "onnx", "--checkpoint", ck, "--output", t.p("out"))
        else:
            r = t.run("tfm-run", "translate", "--model", ck, TINY_SENT)
        return t.error(r, "followed tokenizer.json out of the checkpoint's directory")
    return fn


add("security", "ckpt-tokenizer-file-linked-outside/onnx", ckpt_tokenizer_link_case("onnx"))
add("security", "ckpt-tokenizer-file-linked-outside/translate", ckpt_tokenizer_link_case("translate"))


def model_dir_symlink_case(t: Trial) -> tuple[str, str]:
    """The whole model directory reached through a link: legitimate, must work."""
    link = t.p("model-link")
    os.symlink(t.ctx.tiny(), link)
    ref = t.ctx.tiny_ref()
    return t.ok(t.run("tfm-run", "translate", "--model", link, TINY_SENT),
                lambda r: None if r.out == ref else "differs from the direct path")


add("control", "control/model-dir-via-symlink", model_dir_symlink_case)


def fifo_input_case(command: str) -> Callable[[Trial], tuple[str, str]]:
    """An input given as a pipe (`--input <(generate)`): read once, or refused; never a hang."""
    def fn(t: Trial) -> tuple[str, str]:
        f = t.p("in.fifo")
        os.mkfifo(f)
        t.input(f)
        payload = {"translate": TINY_SENT + "\n", "verify": t.ctx.calib().read_text(), "bench": TINY_SENT + "\n",
                   "onnx": "", "vocab": t.ctx.seed_vocab().read_text()}[command].encode()

        def write() -> None:
            try:
                for _ in range(3):  # serve up to three opens, then stop
                    with open(f, "wb") as w:
                        w.write(payload)
            except OSError:
                pass
        th = threading.Thread(target=write, daemon=True)
        th.start()
        if command == "translate":
            r = t.run("tfm-run", "translate", "--model", t.ctx.tiny(), "--input", f)
        elif command == "verify":
            r = t.run("tfm-export", "verify", "--model", t.ctx.int8(), "--input", f, "--beam-size", 1,
                      "--min-agreement", 0, timeout=2 * t.ctx.timeout)
        elif command == "bench":
            t.output(t.p("b.json"))
            r = writer_run(t, "bench-json", t.p("b.json"), ("--input", f))
        elif command == "onnx":
            t.output(t.p("out"))
            r = t.run("tfm-export", "onnx", "--checkpoint", f, "--output", t.p("out"))
        else:
            t.output(t.p("out"))
            r = t.run("tfm-export", "onnx", "--checkpoint", t.ctx.ckpts()["seed"] / "ckpt.pt", "--vocab", f,
                      "--output", t.p("out"))
        for _ in range(3):  # unblock the writer thread if the tool never opened the pipe
            try:
                os.close(os.open(f, os.O_RDONLY | os.O_NONBLOCK))
            except OSError:
                pass
        th.join(2)
        if command == "onnx":
            return t.error(r)
        return t.either(r)
    return fn


for _cmd in ("translate", "verify", "bench", "onnx", "vocab"):
    add("misc", f"input-is-fifo/{_cmd}", fifo_input_case(_cmd))


def jsonl_escape_case(t: Trial) -> tuple[str, str]:
    texts = ['say "forty-two"', "back\\slash", "tab\there", "\u00e9\u00e8 \U0001F600", "</s> <s> <blank> <unk>"]
    r = t.run("tfm-run", "translate", "--model", t.ctx.demo(), "--format", "jsonl", *texts)

    def check(r: Result) -> str | None:
        lines = r.out.splitlines()
        if len(lines) != len(texts):
            return f"{len(lines)} JSON lines for {len(texts)} inputs"
        for line in lines:
            try:
                json.loads(line)
            except ValueError:
                return f"invalid JSON line {short(line, 50)!r}"
        return None
    return t.ok(r, check)


add("wrong-answer", "jsonl-hostile-characters", jsonl_escape_case)


def special_tokens_text_case(t: Trial) -> tuple[str, str]:
    r = t.run("tfm-run", "translate", "--model", t.ctx.demo(), "</s> </s> <s>", "<blank>", "forty-two </s> nine")
    return t.either(r, lambda r: None if len(r.out.splitlines()) == 3 else f"{len(r.out.splitlines())} lines for 3")


add("wrong-answer", "special-tokens-as-text", special_tokens_text_case)


def long_token_case(t: Trial) -> tuple[str, str]:
    inp = t.text("in.txt", "x" * 1_000_000 + "\nforty-two\n")
    r = t.run("tfm-run", "translate", "--model", t.ctx.demo(), "--input", inp)
    return t.either(r, lambda r: None if r.out.splitlines()[-1:] == [DEMO_TGT] else "second line wrong")


add("wrong-answer", "one-megabyte-token", long_token_case)


def many_empty_lines_case(t: Trial) -> tuple[str, str]:
    inp = t.text("in.txt", "\n" * 200_000 + "forty-two\n")
    r = t.run("tfm-run", "translate", "--model", t.ctx.demo(), "--input", inp)
    return t.either(r, lambda r: None if r.out.count("\n") == 200_001 and r.out.endswith(DEMO_TGT + "\n")
                    else "line alignment lost")


add("wrong-answer", "200k-empty-lines", many_empty_lines_case)


# -- everyday use: streaming, file modes, errors that name the fix, checks that do not cry wolf -----------------

def stream_proc(t: Trial, *args: Any) -> subprocess.Popen:
    """tfm-run translate reading a pipe the case writes to, unbuffered both ways."""
    argv = t.ctx.argv(["tfm-run", "translate", "--model", t.ctx.demo(), *args])  # fixtures before the snapshot
    t.snap()
    return subprocess.Popen(argv, cwd=t.dir,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=t.ctx.env,
                            start_new_session=True, preexec_fn=child_setup(), bufsize=0)


def line_within(p: subprocess.Popen, seconds: float) -> bytes | None:
    import select
    if not select.select([p.stdout], [], [], seconds)[0]:
        return None
    return p.stdout.readline()


def stream_first_line_case(t: Trial) -> tuple[str, str]:
    """The first translation must come back while the writer still holds the second line."""
    p, start = stream_proc(t), time.monotonic()
    p.stdin.write(f"{DEMO_SRC}\n".encode())
    first = line_within(p, t.ctx.timeout)
    if first is None:
        os.killpg(p.pid, signal.SIGKILL)
        t.wait(p, ["translate"], start=start)
        return "silent-wrong", "no output while stdin stayed open: waited for the whole input"
    p.stdin.write(b"seven\n")
    r = t.wait(p, ["translate"], start=start)  # closes stdin: the end of the input
    r.out = first.decode() + r.out
    return t.ok(r, lambda r: None if r.out_lines == [DEMO_TGT, "sept"] else f"got {r.out_lines!r}")


def stream_sigint_case(to_file: bool) -> Callable[[Trial], tuple[str, str]]:
    """Ctrl-C after two translations: stdout keeps them; --output stays as it was, they are in OUTPUT.partial."""
    def fn(t: Trial) -> tuple[str, str]:
        out = t.p("out.txt")
        partial = t.p("out.txt.partial")
        t.output(out, partial)
        out.write_text("previous\n")
        p, start = stream_proc(t, *(["--output", out] if to_file else [])), time.monotonic()
        p.stdin.write(f"{DEMO_SRC}\nseven\n".encode())
        if to_file:
            temps = lambda: [f for f in t.dir.iterdir() if f.name.startswith(".out.txt.")]  # noqa: E731
            wait_for(lambda: any(f.stat().st_size > 15 for f in temps() if f.exists()), p, t.ctx.timeout)
            written = []
        else:
            written = [line_within(p, t.ctx.timeout), line_within(p, t.ctx.timeout)]
        p.send_signal(signal.SIGINT)
        r = t.wait(p, ["translate"], start=start)
        bad = base_problem(r)
        if bad:
            return bad
        if r.rc != 130 or len(r.err_lines) != 1 or not r.err_lines[0].startswith("interrupted"):
            return "silent-wrong", f"exit {r.rc}, stderr {short(' | '.join(r.err_lines))!r}"
        if to_file:
            kept = partial.read_text() if partial.exists() else None
            if out.read_text() != "previous\n" or kept != f"{DEMO_TGT}\nsept\n":
                return "silent-wrong", f"output {out.read_text()!r}, partial {kept!r}"
            return "clean-error", short(r.err_lines[0])
        if [w.decode().strip() if w else None for w in written] != [DEMO_TGT, "sept"]:
            return "silent-wrong", f"written before the signal: {written!r}"
        return "clean-error", "exit 130 with both translations written"
    return fn


def stream_fifo_input_case(t: Trial) -> tuple[str, str]:
    """--input FIFO streams like stdin: the first translation is out before the writer sends the second line."""
    fifo = t.p("in.fifo")
    os.mkfifo(fifo)
    t.input(fifo)
    args = ["tfm-run", "translate", "--model", t.ctx.demo(), "--input", fifo]
    t.snap()
    p = subprocess.Popen(t.ctx.argv(args), cwd=t.dir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=t.ctx.env, start_new_session=True, preexec_fn=child_setup(),
                         bufsize=0)
    start = time.monotonic()
    with open(fifo, "wb", buffering=0) as writer:
        writer.write(f"{DEMO_SRC}\n".encode())
        first = line_within(p, t.ctx.timeout)
        if first is not None:
            writer.write(b"seven\n")
    r = t.wait(p, args, start=start)
    if first is None:
        return base_problem(r) or ("silent-wrong", "no output before the FIFO's writer closed it")
    r.out = first.decode() + r.out
    return t.ok(r, lambda r: None if r.out_lines == [DEMO_TGT, "sept"] else f"got {r.out_lines!r}")


def stream_error_output_case(t: Trial) -> tuple[str, str]:
    """A bad line far into a file: one error naming it, and --output neither written nor left partial."""
    lines = [DEMO_SRC] * 300
    lines[260] = "forty-two " * 300
    inp = t.text("in.txt", "\n".join(lines) + "\n")
    out = t.p("out.txt")
    t.output(out, t.p("out.txt.partial"))
    r = t.run("tfm-run", "translate", "--model", t.ctx.demo(), "--input", inp, "--output", out, "--batch-size", 4)
    verdict = t.names_fix(r, "line 261", "--truncate")
    if verdict[0] == "clean-error" and (out.exists() or t.p("out.txt.partial").exists()):
        return "silent-wrong", "a failed run left an output"
    return verdict


add("everyday", "stream-first-line-before-eof/translate", stream_first_line_case)
add("everyday", "stream-SIGINT-keeps-stdout/translate", stream_sigint_case(False))
add("everyday", "stream-SIGINT-keeps-partial-output/translate", stream_sigint_case(True))
add("everyday", "stream-fifo-input/translate", stream_fifo_input_case)
add("everyday", "stream-error-at-line-261-with-output/translate", stream_error_output_case)


def mode_case(writer: str, mask: int, replace: bool) -> Callable[[Trial], tuple[str, str]]:
    """New files get 0666 & ~umask, replaced files keep their mode (0640 here), whatever the umask."""
    def fn(t: Trial) -> tuple[str, str]:
        if writer == "translate":
            target = t.p("out.txt")
            args = ["tfm-run", "translate", "--model", t.ctx.tiny(), "--output", target, TINY_SENT]
            t.output(target)
        elif writer == "random-checkpoint":
            target = t.p("ck") / "ckpt.pt"
            args = ["tfm-export", "random-checkpoint", "--d-model", 8, "--heads", 1, "--layers", 1, "--ffn", 8,
                    "--vocab-size", 12, "--output", t.p("ck"), *(["--force"] if replace else [])]
            t.output(t.p("ck"))
        else:  # verify --report: the markdown report of an int8 directory
            target = t.p("rep") / "precision-report.md"
            args = ["tfm-export", "verify", "--model", t.ctx.int8(), "--input", t.ctx.calib(), "--beam-size", 1,
                    "--min-agreement", 0, "--report", t.p("rep")]
            t.output(t.p("rep"))
        if replace:
            target.parent.mkdir(exist_ok=True)
            target.write_bytes(b"old\n")
            target.chmod(0o640)
        r = t.sh(f"umask {mask:03o}; exec {t.ctx.sh_quote(args)}", timeout=2 * t.ctx.timeout)
        want = 0o640 if replace else 0o666 & ~mask

        def check(r: Result) -> str | None:
            got = stat.S_IMODE(target.stat().st_mode)
            return None if got == want else f"{target.name} is {got:04o}, expected {want:04o}"
        return t.ok(r, check)
    return fn


for _writer in ("translate", "random-checkpoint", "verify-report"):
    for _mask in (0o022, 0o077):
        for _replace in (False, True):
            add("everyday", f"mode-umask{_mask:03o}-{'replaced' if _replace else 'new'}/{_writer}",
                mode_case(_writer, _mask, _replace))


def hf_dir(t: Trial) -> Path:
    """Where a Hugging Face model directory is given for something else (a config.json is what marks one)."""
    d = t.p("hf")
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "marian"}')
    (d / "model.safetensors").write_bytes(b"weights")
    t.input(d)
    return d


def fix_case(make: Callable[[Trial], list[Any]], *fragments: Callable[[Trial], str] | str
             ) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        args = make(t)
        return t.names_fix(t.run(*args), *[f(t) if callable(f) else f for f in fragments])
    return fn


def ck_dir(t: Trial) -> Path:
    return t.copy_ck(t.ctx.tiny_ck()).parent


add("everyday", "model-is-hf-dir/translate", fix_case(
    lambda t: ["tfm-run", "translate", "--model", hf_dir(t), "x"], "tfm-export onnx --checkpoint", "--backend torch"))
add("everyday", "model-is-checkpoint-dir/translate", fix_case(
    lambda t: ["tfm-run", "translate", "--model", ck_dir(t), "x"], lambda t: str(t.p("ck", "ckpt.pt"))))
add("everyday", "model-is-checkpoint-dir-torch/translate", fix_case(
    lambda t: ["tfm-run", "translate", "--model", ck_dir(t), "--backend", "torch", "x"],
    lambda t: f"pass the checkpoint inside it, {t.p('ck', 'ckpt.pt')}"))
add("everyday", "model-is-hf-dir/inspect", fix_case(
    lambda t: ["tfm-export", "inspect", "--model", hf_dir(t)], "tfm-export onnx --checkpoint"))
add("everyday", "checkpoint-is-safetensors-file/onnx", fix_case(
    lambda t: ["tfm-export", "onnx", "--checkpoint", hf_dir(t) / "model.safetensors", "--output", _out("m")(t)],
    lambda t: f"pass the directory itself, {t.p('hf')}"))
add("everyday", "checkpoint-is-config-json/onnx", fix_case(
    lambda t: ["tfm-export", "onnx", "--checkpoint", hf_dir(t) / "config.json", "--output", _out("m")(t)],
    "pass the directory itself"))
add("everyday", "checkpoint-is-checkpoint-dir/onnx", fix_case(
    lambda t: ["tfm-export", "onnx", "--checkpoint", ck_dir(t), "--output", _out("m")(t)],
    lambda t: f"pass the checkpoint inside it, {t.p('ck', 'ckpt.pt')}"))
add("everyday", "quantize-int8-without-calibration", fix_case(
    lambda t: ["tfm-export", "quantize", "--model", t.ctx.tiny(), "--precision", "int8", "--output", _out("q")(t)],
    "--calibration FILE", "--mode dynamic"))
add("everyday", "verify-fp32-without-checkpoint", fix_case(
    lambda t: ["tfm-export", "verify", "--model", t.ctx.tiny()], "exported from ckpt.pt", "--checkpoint PATH"))


def sigint_sweep_case(t: Trial) -> tuple[str, str]:
    """Ctrl-C at 20 moments of an export's first two seconds (PyTorch and ONNX loading): each one line, exit 130,
    nothing left (an extension module interrupted while it initialised used to abort with a C++ dump, exit 134)."""
    out = t.p("out")
    t.output(out)
    args = slow_writer_args(t, "onnx", out)
    outcomes = Counter()
    for i in range(20):
        p = t.popen(*args)
        start = time.monotonic()
        time.sleep(0.1 * (i + 1))
        p.send_signal(signal.SIGINT)
        r = t.wait(p, args, start=start)
        bad = base_problem(r)
        if bad:
            return bad[0], f"SIGINT at {0.1 * (i + 1):.1f}s: {bad[1]}"
        if r.rc == 0:
            problem = model_dir_ok(out)
            if problem:
                return "silent-wrong", problem
            shutil.rmtree(out)
        elif r.rc != 130 or r.err_lines != ["interrupted"]:
            return "multi-line-error", f"SIGINT at {0.1 * (i + 1):.1f}s: exit {r.rc}: {short(' | '.join(r.err_lines))}"
        left = staging_of(t.dir, "out")
        if left:
            return "leftover", f"{left[0].name} after SIGINT at {0.1 * (i + 1):.1f}s"
        outcomes[r.rc] += 1
    return "clean-error", f"{outcomes[130]} interrupted, {outcomes[0]} finished first"


add("everyday", "SIGINT-sweep-first-2s/onnx", sigint_sweep_case)


def verify_seed_case(t: Trial) -> tuple[str, str]:
    """A seed checkpoint carries no vocabulary; the directory exported from it does, so verify needs no --vocab."""
    ck = t.copy_ck(t.ctx.ckpts()["seed"])
    m = _out("m")(t)
    t.ctx.run(["tfm-export", "onnx", "--checkpoint", ck, "--vocab", t.ctx.seed_vocab(), "--output", m], cwd=t.dir)
    return t.ok(t.run("tfm-export", "verify", "--model", m, "--checkpoint", ck, "--samples", 2, "--steps", 2,
                      "--beam-size", 2, timeout=2 * t.ctx.timeout))


def verify_wrong_graph_case(t: Trial) -> tuple[str, str]:
    """A decoder step with scaled weights and its hash updated in the manifest: verify must fail it, and not as
    near-ties."""
    m = t.copy_model(t.ctx.tiny(), protect=False)
    t.output(m)
    shutil.copyfile(t.ctx.graphs()["decoder_step.onnx"], m / "decoder_step.onnx")
    rehash(m)
    r = t.run("tfm-export", "verify", "--model", m, "--checkpoint", t.ctx.tiny_ck() / "ckpt.pt", "--samples", 4,
              "--steps", 3, "--beam-size", 2, timeout=2 * t.ctx.timeout)
    return t.names_fix(r, "parity check failed", "diverging")


def verify_int8_names_case(t: Trial) -> tuple[str, str]:
    """int8 verify shows the sentences whose translation differs from fp32, as many as its table counts."""
    r = t.run("tfm-export", "verify", "--model", t.ctx.int8(), "--input", t.ctx.calib(), "--beam-size", 1,
              "--min-agreement", 0, timeout=2 * t.ctx.timeout)

    def check(r: Result) -> str | None:
        row = next((line for line in r.out_lines if line.startswith("| greedy |")), "")
        identical, total = map(int, row.split("|")[2].split()[0].split("/")) if row else (0, 0)
        named = sum(1 for line in r.out_lines if line.startswith("  '") and " -> " in line)
        said = f"greedy: differs from fp32 on {total - identical} sentence(s):" in r.out
        if not row or (identical < total and (not said or named != min(5, total - identical))):
            return f"{identical}/{total} identical but {named} sentences named"
        return None
    return t.ok(r, check)


add("everyday", "verify-seed-export-without-vocab", verify_seed_case)
add("everyday", "verify-wrong-graph-still-fails", verify_wrong_graph_case)
add("everyday", "verify-int8-names-differing-sentences", verify_int8_names_case)


def provenance_case(t: Trial) -> tuple[str, str]:
    """The manifest names its checkpoint by file name and sha256, never by a path of the machine that made it."""
    manifest = (t.ctx.tiny() / "manifest.json").read_text()
    source = json.loads(manifest)["source_checkpoint"]
    if str(t.ctx.root) in manifest or "path" in source:
        return "silent-wrong", f"manifest records {short(json.dumps(source), 80)}"
    if source.get("file") != "ckpt.pt" or source.get("sha256") != sha(t.ctx.tiny_ck() / "ckpt.pt"):
        return "silent-wrong", f"source_checkpoint is {short(json.dumps(source), 80)}"
    return "ok", "file name and sha256 only"


def version_case(tool: str) -> Callable[[Trial], tuple[str, str]]:
    return lambda t: t.ok(t.run(tool, "--version"), lambda r: None if re.fullmatch(
        rf"{tool} \d+\.\d+\.\d+\n", r.out) else f"printed {r.out!r}")


def jsonl_truncated_case(t: Trial) -> tuple[str, str]:
    r = t.run("tfm-run", "translate", "--model", t.ctx.demo(), "--format", "jsonl", "--max-length", 2, DEMO_SRC,
              "seven")

    def check(r: Result) -> str | None:
        rows = [json.loads(line) for line in r.out_lines]
        marks = [row.get("truncated") for row in rows]
        return None if marks == [True, False] else f"truncated marks {marks!r}"
    return t.ok(r, check)


add("everyday", "manifest-records-no-paths/onnx", provenance_case)
add("everyday", "version/tfm-run", version_case("tfm-run"))
add("everyday", "version/tfm-export", version_case("tfm-export"))
add("everyday", "jsonl-marks-max-length-cut/translate", jsonl_truncated_case)


# -- positive controls: the same commands on honest inputs ----------------------------------------------------

def control(args_fn: Callable[[Trial], list[Any]], check: Callable[[Trial, Result], str | None] | None = None,
            timeout_mult: float = 1) -> Callable[[Trial], tuple[str, str]]:
    def fn(t: Trial) -> tuple[str, str]:
        r = t.run(*args_fn(t), timeout=timeout_mult * t.ctx.timeout)
        return t.ok(r, (lambda r: check(t, r)) if check else None)
    return fn


add("control", "control/translate-tiny", control(lambda t: ["tfm-run", "translate", "--model", t.ctx.tiny(),
                                                            TINY_SENT],
                                                 lambda t, r: None if r.out == t.ctx.tiny_ref() else "differs"))
add("control", "control/inspect", control(lambda t: ["tfm-export", "inspect", "--model", t.ctx.tiny()]))
add("control", "control/check", control(lambda t: ["tfm-export", "check", "--model", t.ctx.tiny()]))
for _prec, _extra in (("fp16", []), ("int8-static", ["--calibration"]), ("int8-dynamic", ["--mode", "dynamic"])):
    add("control", f"control/quantize-{_prec}", control(
        lambda t, p=_prec, e=_extra: ["tfm-export", "quantize", "--model", t.ctx.tiny(), "--precision",
                                      p.split("-")[0], *(e if e != ["--calibration"] else ["--calibration",
                                                                                           t.ctx.calib()]),
                                      "--output", _out("q")(t)],
        lambda t, r: model_dir_ok(t.p("q"))))
add("control", "control/onnx-seed-checkpoint", control(
    lambda t: ["tfm-export", "onnx", "--checkpoint", t.ctx.ckpts()["seed"] / "ckpt.pt", "--vocab", t.ctx.seed_vocab(),
               "--output", _out("m")(t)], lambda t, r: model_dir_ok(t.p("m"))))
add("control", "control/onnx-force-replaces-model", control(
    lambda t: ["tfm-export", "onnx", "--checkpoint", t.ctx.tiny_ck() / "ckpt.pt", "--output",
               (_out("m")(t), shutil.copytree(t.ctx.tiny(), t.p("m")))[0], "--force"],
    lambda t, r: model_dir_ok(t.p("m"))))
add("control", "control/verify-fp32", control(
    lambda t: ["tfm-export", "verify", "--model", t.ctx.tiny(), "--checkpoint", t.ctx.tiny_ck() / "ckpt.pt",
               "--samples", 2, "--steps", 3, "--beam-size", 2],
    timeout_mult=2))
add("control", "control/verify-int8-report", control(
    lambda t: ["tfm-export", "verify", "--model", t.ctx.int8(), "--input", t.ctx.calib(), "--beam-size", 1,
               "--min-agreement", 0, "--report", _out("rep")(t)],
    lambda t, r: None if (t.p("rep") / "precision-report.md").is_file() else "no report", timeout_mult=2))
add("control", "control/eval-demo", control(
    lambda t: ["tfm-export", "eval-demo", "--model", t.ctx.demo(), "--show-misses", 0], timeout_mult=4))
add("control", "control/translate-output-file", control(
    lambda t: ["tfm-run", "translate", "--model", t.ctx.demo(), DEMO_SRC, "--output", _out("o.txt")(t)],
    lambda t, r: None if t.p("o.txt").read_text().strip() == DEMO_TGT else "wrong file content"))


# ==================================================================================================
# main
# ==================================================================================================

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=str(REPO / ".venv/bin"), help="directory with tfm-export, tfm-run, python")
    ap.add_argument("-k", dest="pattern", action="append", default=[],
                    help="run only cases whose name or class contains SUBSTR (repeatable: any)")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per subprocess (default 60)")
    args = ap.parse_args()
    cases = [c for c in CASES if not args.pattern or any(p in c.name or p == c.cls for p in args.pattern)]
    if args.list:
        for c in cases:
            print(f"{c.cls} {c.name}")
        print(f"{len(cases)} cases")
        return 0
    bin_dir = Path(args.bin)
    if not bin_dir.is_absolute():
        bin_dir = (REPO / bin_dir) if (REPO / bin_dir).exists() else bin_dir.resolve()
    for tool in ("tfm-export", "tfm-run", "python"):
        if not (bin_dir / tool).exists():
            print(f"Error: {bin_dir / tool} not found; run `make setup` or pass --bin", file=sys.stderr)
            return 2
    root = Path(tempfile.mkdtemp(prefix="tfm-hostile-"))
    _ROOT[0] = str(root)
    KEEP[0] = args.keep
    ctx = Ctx(bin_dir.resolve(), root, args.timeout)
    counts: Counter = Counter()
    findings: list[str] = []
    started = time.monotonic()
    print(f"# {len(cases)} cases, scratch {root}", flush=True)
    try:
        for case in cases:
            t0 = time.monotonic()
            verdict, reason = run_case(ctx, case)
            counts[verdict] += 1
            line = f"{verdict} {case.cls} {case.name}: {reason.replace(str(root), '$T')}"
            print(f"{line}  [{time.monotonic() - t0:.0f}s]", flush=True)
            if verdict in FINDINGS:
                findings.append(line)
    except KeyboardInterrupt:
        print("# interrupted", flush=True)
    finally:
        ctx.cleanup()
        if args.keep:
            print(f"# kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    total = sum(counts.values())
    print(f"\n# {total} cases in {time.monotonic() - started:.0f}s: "
          + ", ".join(f"{v} {counts[v]}" for v in FINE + FINDINGS if counts[v]))
    if findings:
        print(f"# {len(findings)} findings:")
        for line in findings:
            print("  " + line)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
