"""The scratch tree: fixtures built once per session (per xdist worker) and lazily, so that a -k run builds only
what its cases use, and each case's own directory, the paths it names and the snapshot before its first command."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from . import forge
from .support import (
    DEMO_SRC,
    DEMO_TGT,
    DEVICES,
    LEFTOVER_RE,
    ORDER,
    TIMEOUT,
    TINY_SENT,
    TOOLS,
    Finding,
    InputModified,
    Leftover,
    Result,
    WroteOutside,
    child_setup,
    device_state,
    finish,
    restore_device,
    short,
    show_as_t,
    snapshot,
    tool_dir,
    under,
)


class SetupError(Exception):
    pass


class Fixtures:
    """The scratch tree's shared part: models, checkpoints and texts the cases copy or read, built on first use.
    A fixture that cannot be built skips every case that needs it, with the reason."""

    def __init__(self, root: Path, timeout: float = TIMEOUT) -> None:
        self.root = root
        self.timeout = timeout
        self.fx = root / "fx"
        self.cases = root / "cases"
        self.fx.mkdir()
        self.cases.mkdir()
        self.bin = tool_dir(root)
        self._cache: dict[str, Any] = {}
        # as a user's shell runs the commands: no TFM_ settings, stdout block-buffered when it is a pipe
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TFM_") and k != "PYTHONUNBUFFERED"}
        self.env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
        show_as_t(root)

    # -- running ------------------------------------------------------------------------------------
    def argv(self, args: list[Any]) -> list[str]:
        if args and args[0] in TOOLS:
            return [str(self.bin / args[0])] + [str(a) for a in args[1:]]
        return [str(a) for a in args]

    def sh_quote(self, args: list[Any]) -> str:
        return shlex.join(self.argv(args))

    def popen(self, args: list[Any], cwd: Path, stdin: Any = subprocess.DEVNULL, env: dict | None = None,
              mem_gb: float | None = None, bufsize: int = -1) -> subprocess.Popen:
        return subprocess.Popen(self.argv(args), cwd=cwd, stdin=stdin, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env or self.env, start_new_session=True,
                                preexec_fn=child_setup(mem_gb), bufsize=bufsize)

    def run(self, args: list[Any], cwd: Path, timeout: float | None = None, input: bytes | None = None,
            stdin: Any = subprocess.DEVNULL, env: dict | None = None, mem_gb: float | None = None) -> Result:
        start = time.monotonic()
        p = self.popen(args, cwd, subprocess.PIPE if input is not None else stdin, env, mem_gb)
        return finish(p, self.argv(args), timeout or self.timeout, start, input)

    def must(self, args: list[Any], what: str) -> Result:
        r = self.run(args, cwd=self.fx, timeout=4 * self.timeout)
        if r.rc != 0:
            raise SetupError(f"{what}: exit {r.rc}: {short(r.err, 300)}")
        return r

    def cached(self, key: str, make: Callable[[], Any]) -> Any:
        """make() once; a SetupError (now or remembered) skips the case."""
        if key not in self._cache:
            try:
                self._cache[key] = make()
            except SetupError as exc:
                self._cache[key] = exc
        value = self._cache[key]
        if isinstance(value, SetupError):
            pytest.skip(f"setup failed: {short(str(value), 200)}")
        return value

    # -- fixtures -----------------------------------------------------------------------------------
    def tiny_ck(self) -> Path:
        def make() -> Path:
            d = self.fx / "tiny-ck"
            self.must(["tfm-export", "random-checkpoint", "--d-model", 16, "--heads", 2, "--layers", 1, "--ffn", 32,
                       "--vocab-size", 40, "--output", d], "random-checkpoint")
            return d
        return self.cached("tiny_ck", make)

    def tiny(self) -> Path:
        def make() -> Path:
            d = self.fx / "tiny-model"
            self.must(["tfm-export", "onnx", "--checkpoint", self.tiny_ck() / "ckpt.pt", "--output", d], "onnx tiny")
            return d
        return self.cached("tiny", make)

    def tiny_ref(self) -> str:
        """The tiny model's translation of TINY_SENT, the oracle of cases that must not change it."""
        return self.cached("tiny_ref", lambda: self.must(["tfm-run", "translate", "--model", self.tiny(), TINY_SENT],
                                                         "translate tiny").out)

    def demo_ck(self) -> Path:
        def make() -> Path:
            d = self.fx / "demo-ck"
            d.mkdir()
            for name in ("ckpt.pt", "tokenizer.json"):
                shutil.copyfile(forge.REPO / "models/demo" / name, d / name)
            return d
        return self.cached("demo_ck", make)

    def demo(self) -> Path:
        def make() -> Path:
            d = self.fx / "demo-model"
            self.must(["tfm-export", "onnx", "--checkpoint", self.demo_ck() / "ckpt.pt", "--output", d], "onnx demo")
            r = self.must(["tfm-run", "translate", "--model", d, DEMO_SRC], "translate demo")
            if r.out.strip() != DEMO_TGT:
                raise SetupError(f"demo model translates {DEMO_SRC!r} as {r.out.strip()!r}")
            return d
        return self.cached("demo", make)

    def int8(self) -> Path:
        def make() -> Path:
            d = self.fx / "tiny-int8"
            self.must(["tfm-export", "quantize", "--model", self.tiny(), "--precision", "int8", "--mode", "dynamic",
                       "--output", d], "quantize int8")
            return d
        return self.cached("int8", make)

    def text(self, name: str, content: str) -> Path:
        def make() -> Path:
            (self.fx / name).write_text(content)
            return self.fx / name
        return self.cached(name, make)

    def calib(self) -> Path:
        return self.text("calib.txt", "".join(f"w{i} w{(i * 7) % 30} w{(i * 3) % 30}\n" for i in range(12)))

    def calib_big(self) -> Path:
        """Enough calibration sentences that quantize runs for several seconds (room for a signal)."""
        return self.text("calib-big.txt", "".join(f"w{i % 36} w{(i * 7) % 36} w{(i * 3) % 36} w{(i * 5) % 36}\n"
                                                  for i in range(150)))

    def seed_vocab(self) -> Path:
        return self.text("seed-vocab.txt", "\n".join(["<unk>", "<blank>", "<s>", "</s>"] + [f"w{i}" for i in range(36)])
                         + "\n")

    def outside_tok(self) -> Path:
        """Valid tokenizers outside every checkpoint and model directory (opening them is a containment failure)."""
        def make() -> Path:
            d = self.fx / "outside"
            d.mkdir()
            shutil.copyfile(self.tiny_ck() / "tokenizer.json", d / "tokenizer.json")
            shutil.copyfile(self.demo_ck() / "tokenizer.json", d / "demo-tokenizer.json")
            os.mkfifo(d / "fifo.json")
            return d
        return self.cached("outside", make)

    def forged(self, name: str, base: str, change: forge.Change) -> Path:
        """A directory with the tiny or demo checkpoint changed by `change` (forge.forge_checkpoint) and its
        tokenizer."""
        def make() -> Path:
            src = self.tiny_ck() if base == "tiny" else self.demo_ck()
            self.outside_tok()
            d = self.fx / "ckpts" / name
            d.mkdir(parents=True)
            shutil.copyfile(src / "tokenizer.json", d / "tokenizer.json")
            try:
                forge.forge_checkpoint(src / "ckpt.pt", d / "ckpt.pt", change)
            except Exception as exc:
                raise SetupError(f"forging {name}: {exc!r}") from exc
            return d
        return self.cached(f"ckpt:{name}", make)

    def seed(self) -> Path:
        """The tiny checkpoint in the seed repository's layout (settings, no vocabulary inside)."""
        return self.forged("seed", "tiny", forge.seed_layout)

    def graphs(self) -> dict[str, Path]:
        """Tampered-but-valid encoder and decoder_step graphs, and the tiny model with external data."""
        def make() -> dict[str, Path]:
            d = self.fx / "graphs"
            d.mkdir()
            tiny, mx = self.tiny(), self.fx / "tiny-extdata"
            shutil.copytree(tiny, mx)
            try:
                for g in ("encoder.onnx", "decoder_step.onnx"):
                    forge.tamper_graph(tiny / g, d / g)
                forge.external_data(mx, "encoder.onnx")
            except Exception as exc:
                raise SetupError(f"graphs: {exc!r}") from exc
            forge.rehash(mx, extra=["encoder.onnx.data"])
            return {"encoder.onnx": d / "encoder.onnx", "decoder_step.onnx": d / "decoder_step.onnx", "extdata": mx}
        return self.cached("graphs", make)

    def tmpfs(self) -> Path | None:
        """A 256 KiB tmpfs (root only); None where mounting is not permitted."""
        def make() -> Path | None:
            d = self.root / "tmpfs"
            d.mkdir()
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(d)], capture_output=True)
            if r.returncode != 0:
                d.rmdir()
                return None
            self._cache["tmpfs_mounted"] = True
            return d
        return self.cached("tmpfs", make)

    def cleanup(self) -> None:
        """Unmount the tmpfs and clear immutable flags, so the tree can be removed."""
        if self._cache.get("tmpfs_mounted"):
            subprocess.run(["umount", str(self.root / "tmpfs")], capture_output=True)
        for p in self.root.rglob("immutable*"):
            if p.is_dir() and not p.is_symlink():
                subprocess.run(["chattr", "-i", str(p)], capture_output=True)


# --------------------------------------------------------------------------------------------------
# one case: its directory, the paths it names, the snapshot before its first command
# --------------------------------------------------------------------------------------------------

class Case:
    """A case's scratch directory. Outputs may be written; inputs and decoys must not change; anything else in the
    scratch tree that appears or changes while the case runs is a finding (conftest judges it after the test)."""

    def __init__(self, fx: Fixtures, name: str) -> None:
        self.fx = fx
        self.dir = fx.cases / re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:200]
        self.dir.mkdir()
        self.outputs: list[str] = []
        self.inputs: list[str] = []
        self.decoys: list[str] = []
        self.before: dict[str, tuple] | None = None
        self.threads: list[threading.Thread] = []
        self.after: list[Callable[[], None]] = []  # run once the tree has been compared
        self.devices = device_state()
        self.failed = False

    # -- setup --------------------------------------------------------------------------------------
    def p(self, *parts: str) -> Path:
        return self.dir.joinpath(*parts)

    def output(self, *paths: Path) -> None:
        self.outputs += [str(p) for p in paths]

    def out(self, *parts: str) -> Path:
        """A path in the case's directory that the command may write."""
        path = self.p(*parts)
        self.output(path)
        return path

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

    def copy_ck(self, src_dir: Path, name: str = "ck") -> Path:
        """A protected copy of a checkpoint directory; its ckpt.pt."""
        return self.copy_model(src_dir, name) / "ckpt.pt"

    def text(self, name: str, content: str | bytes, protect: bool = True) -> Path:
        path = self.p(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
        if protect:
            self.input(path)
        return path

    # -- running ------------------------------------------------------------------------------------
    def snap(self) -> None:
        if self.before is None:
            self.before = snapshot(self.fx.root)

    def run(self, *args: Any, timeout: float | None = None, input: bytes | None = None, stdin: Any = None,
            env: dict | None = None, mem_gb: float | None = None, cwd: Path | None = None) -> Result:
        self.snap()
        return self.fx.run(list(args), cwd=cwd or self.dir, timeout=timeout, input=input,
                           stdin=subprocess.DEVNULL if stdin is None else stdin,
                           env=None if env is None else {**self.fx.env, **env}, mem_gb=mem_gb)

    def sh(self, script: str, timeout: float | None = None) -> Result:
        self.snap()
        return self.fx.run(["sh", "-c", script], cwd=self.dir, timeout=timeout)

    def popen(self, *args: Any, stdin: Any = subprocess.DEVNULL, bufsize: int = -1) -> subprocess.Popen:
        self.snap()
        return self.fx.popen(list(args), self.dir, stdin=stdin, bufsize=bufsize)

    def wait(self, p: subprocess.Popen, args: list[Any], timeout: float | None = None, start: float | None = None
             ) -> Result:
        return finish(p, [str(a) for a in args], timeout or self.fx.timeout, start or time.monotonic())

    def fifo_reader(self, path: Path) -> dict[str, Any]:
        """A thread that reads a FIFO to its end (unblocked by `release_fifo` if nothing ever writes)."""
        box: dict[str, Any] = {"data": b"", "path": path}

        def read() -> None:
            with open(path, "rb") as f:
                box["data"] = f.read()
        box["thread"] = th = threading.Thread(target=read, daemon=True)
        th.start()
        self.threads.append(th)
        return box

    def release_fifo(self, box: dict[str, Any]) -> bytes:
        th = box["thread"]
        th.join(0.5)
        if th.is_alive():
            try:
                os.close(os.open(box["path"], os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
            th.join(5)
        return box["data"]

    # -- after the case -----------------------------------------------------------------------------
    def tree_findings(self) -> list[tuple[type[Finding], str]]:
        """What appeared, vanished or changed in the scratch tree outside the outputs, and replaced devices."""
        found = self._tree_changes() if self.before is not None else []
        after = device_state()
        for dev in DEVICES:
            if after[dev] != self.devices[dev]:
                found.append((WroteOutside, f"{dev} was replaced ({self.devices[dev]} -> {after[dev]})"))
                restore_device(dev, self.devices[dev])
        return found

    def _tree_changes(self) -> list[tuple[type[Finding], str]]:
        after = snapshot(self.fx.root)
        found: list[tuple[type[Finding], str]] = []
        for path in sorted(set(self.before) | set(after)):
            old, new = self.before.get(path), after.get(path)
            if old == new:
                continue
            rel = os.path.relpath(path, self.fx.root)
            what = "appeared" if old is None else "vanished" if new is None else f"changed ({old[0]}->{new[0]})"
            if new is not None and old is None and LEFTOVER_RE.match(os.path.basename(path)):
                found.append((Leftover, f"{rel} left behind"))
            elif any(LEFTOVER_RE.match(part) for part in Path(rel).parts[:-1]):
                continue  # inside a leftover directory: reported once, with the directory
            elif under(path, self.outputs):
                continue
            elif path in self.decoys:
                found.append((WroteOutside, f"decoy {rel} {what}"))
            elif under(path, self.inputs):
                found.append((InputModified, f"{rel} {what}"))
            else:
                found.append((WroteOutside, f"{rel} {what}"))
        return found

    def judge(self, verdict: Finding | None) -> None:
        """Raise the worst of the tree's findings, naming the others and the case's own verdict; else nothing."""
        __tracebackhide__ = True
        found = sorted(self.tree_findings(), key=lambda f: ORDER.index(f[0]))
        if not found:
            return
        others = [f"{kind.verdict}: {short(reason, 150)}" for kind, reason in found[1:]]
        if verdict is not None:
            others.append(str(verdict))
        kind, reason = found[0]
        raise kind(short(reason, 150) + "".join(f"\n  also {other}" for other in others)) from verdict

    def close(self) -> None:
        """After the judgement: the case's own clean-ups, its threads, and its directory unless it failed."""
        for hook in self.after:
            try:
                hook()
            except OSError:
                pass
        for th in self.threads:
            th.join(0.1)
        if not self.failed:
            shutil.rmtree(self.dir, ignore_errors=True)
