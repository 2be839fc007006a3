"""A real tritonserver on this machine, for tests and benchmarks: the one the nvidia-pytriton wheel bundles (with
its Python backend; it has no onnxruntime or TensorRT backend), started from a Python environment that has
pytriton and tfm-export's runtime installed.

What it takes to run it outside pytriton: the backend directory holds libtriton_python.so,
triton_python_backend_utils.py and the stub built for that Python; the stub must load that interpreter's own
libpython (its LIBDIR first on LD_LIBRARY_PATH, else a system libpython3.x fails on RLock._recursion_count)
and the wheel's bundled libraries; the stub takes its site-packages from the `python3` first on PATH. The server
listens on 127.0.0.1 only, on free ports; stopping it sends SIGINT, then kills its whole process group (the
stubs too) after a timeout, and the kernel kills it if the process that started it dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import TfmExportError

READY_TIMEOUT_S = 120.0  # model loading included; ~3 s for the demo model here
STOP_TIMEOUT_S = 15.0
_PROBE = """import json, sys, sysconfig, pathlib, pytriton
root = pathlib.Path(pytriton.__file__).parent
print(json.dumps({"root": str(root), "libs": str(root.parent / "nvidia_pytriton.libs"),
                  "libdir": sysconfig.get_config_var("LIBDIR"), "version": "%d.%d" % sys.version_info[:2]}))"""


@dataclass(frozen=True)
class ServerEnvironment:
    """Where the bundled server, its Python backend and the environment's interpreter are."""

    python: Path  # the environment's interpreter (a venv's bin/python)
    server_root: Path  # pytriton/tritonserver: bin/, backends/python/, python_backend_stubs/
    libs: Path  # the wheel's bundled shared libraries
    libdir: Path  # the interpreter's own libpython
    python_version: str

    @classmethod
    def find(cls, python: Path) -> ServerEnvironment:
        """Ask the environment's interpreter; one line when it has no pytriton."""
        python = Path(os.path.abspath(python))  # absolute, but not resolved: a venv's python is a symlink
        try:
            out = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True, timeout=60)
        except OSError as exc:
            raise TfmExportError(f"{python}: cannot run it ({exc.strerror})") from None
        if out.returncode != 0:
            raise TfmExportError(f"{python}: has no nvidia-pytriton (pip install nvidia-pytriton)")
        found = json.loads(out.stdout.strip().splitlines()[-1])
        return cls(python, Path(found["root"]) / "tritonserver", Path(found["libs"]), Path(found["libdir"]),
                   found["version"])

    def process_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{self.python.parent}{os.pathsep}{env.get('PATH', '')}"
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(self.libdir), str(self.libs),
                                                             env.get("LD_LIBRARY_PATH")) if p)
        env.pop("PYTHONPATH", None)
        return env

    def backend_directory(self, work: Path) -> Path:
        """backends/python/ with the Python backend and the stub for this environment's Python."""
        target = work / "backends" / "python"
        target.mkdir(parents=True, exist_ok=True)
        for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
            shutil.copyfile(self.server_root / "backends" / "python" / name, target / name)
        stub = target / "triton_python_backend_stub"
        shutil.copyfile(self.server_root / "python_backend_stubs" / self.python_version / stub.name, stub)
        stub.chmod(0o755)
        return work / "backends"


def free_ports(count: int) -> list[int]:
    """Ports the kernel just handed out on 127.0.0.1 (closed again, so a tiny race remains)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the process that started the server dies (Linux prctl)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class LocalTritonServer:
    """`with LocalTritonServer(env, repository, work) as server:` a ready server; stopped on exit, even on errors."""

    def __init__(self, env: ServerEnvironment, repository: Path, work: Path, extra_args: tuple[str, ...] = ()) -> None:
        self.env, self.repository, self.work, self.extra_args = env, repository, work, extra_args
        self.process: subprocess.Popen | None = None
        self.http_port = self.grpc_port = self.metrics_port = 0
        self.log_path = work / "tritonserver.log"

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def __enter__(self) -> LocalTritonServer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        backends = self.env.backend_directory(self.work)
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        command = [str(self.env.server_root / "bin" / "tritonserver"), "--model-repository", str(self.repository),
                   "--backend-directory", str(backends), "--http-address", "127.0.0.1", "--http-port",
                   str(self.http_port), "--grpc-address", "127.0.0.1", "--grpc-port", str(self.grpc_port),
                   "--metrics-address", "127.0.0.1", "--metrics-port", str(self.metrics_port),
                   "--exit-timeout-secs", "5", *self.extra_args]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env.process_env(),
                                            cwd=self.work, start_new_session=True, preexec_fn=_die_with_parent)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        import tritonclient.http as http
        client = http.InferenceServerClient(self.http_url)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise TfmExportError(f"tritonserver exited with code {self.process.returncode} while starting:\n"
                                     + self.log_tail())
            with contextlib.suppress(Exception):  # connection refused until it listens
                if client.is_server_ready():
                    return
            time.sleep(0.2)
        raise TfmExportError(f"tritonserver not ready after {READY_TIMEOUT_S:.0f} s:\n" + self.log_tail())

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def pids(self) -> list[int]:
        """The server and every process it started (the Python-backend stubs): its process group."""
        if self.process is None:
            return []
        return [pid for pid in _all_pids() if _pgid(pid) == self.process.pid]

    def rss_bytes(self) -> int:
        """Resident memory of the server and its stubs together."""
        return sum(_rss(pid) for pid in self.pids())

    def stop(self) -> None:
        """SIGINT (Triton finishes what is in flight), then SIGKILL to the whole group after STOP_TIMEOUT_S."""
        if self.process is None:
            return
        group = self.process.pid
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)  # the stubs, and the server if SIGINT was not enough
        self.process.wait()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while any(_pgid(p) == group for p in _all_pids()) and time.monotonic() < deadline:
            time.sleep(0.05)


def _all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command name (which may hold spaces); [] when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return text[text.rfind(")") + 2:].split()


def _pgid(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[2]) if fields and fields[0] != "Z" else None  # a zombie holds no resources


def _rss(pid: int) -> int:
    fields = _stat_fields(pid)
    return int(fields[21]) * os.sysconf("SC_PAGE_SIZE") if fields else 0
