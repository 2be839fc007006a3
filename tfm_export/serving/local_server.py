"""A real tritonserver on this machine, for `tfm-export serve`, tests and benchmarks: the one the nvidia-pytriton
wheel bundles (with its Python backend; it has no onnxruntime or TensorRT backend), started from a Python
environment that has pytriton and tfm-export's runtime installed (`make serving-env` builds `.venv-serving`; it is
an environment of its own because pytriton pins numpy<2).

What it takes to run it outside pytriton: the backend directory holds libtriton_python.so,
triton_python_backend_utils.py and the stub built for that Python; the stub must load that interpreter's own
libpython (its LIBDIR first on LD_LIBRARY_PATH, else a system libpython3.x fails on RLock._recursion_count)
and the wheel's bundled libraries; the stub takes its site-packages from the `python3` first on PATH. The server
listens on 127.0.0.1 by default, on free ports unless told which; stopping it sends SIGINT, then kills its whole
process group (the stubs too) after a timeout, and the kernel kills it if the process that started it dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..artifacts.manifest import MANIFEST, REPOSITORY_FORMAT, manifest_format
from ..core.errors import TfmExportError
from .contract import SERVE_HOST, SERVE_PORTS, SERVING_VENV

READY_TIMEOUT_S = 120.0  # model loading included; ~3 s for the demo model here
STOP_TIMEOUT_S = 15.0
MAKE_IT = (f"build it with `make serving-env` in the tfm-export checkout (it makes {SERVING_VENV}), or pass "
           "--serving-python PYTHON of an environment with nvidia-pytriton and tfm-export")
_PROBE = """import importlib.util, json, pathlib, sys, sysconfig
missing = [m for m in ("pytriton", "tfm_export") if importlib.util.find_spec(m) is None]
root = None if "pytriton" in missing else pathlib.Path(importlib.util.find_spec("pytriton").origin).parent
print(json.dumps({"missing": missing, "root": str(root), "libs": str(root and root.parent / "nvidia_pytriton.libs"),
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
        """Ask the environment's interpreter; one line when it lacks pytriton or tfm-export."""
        python = Path(os.path.abspath(python))  # absolute, but not resolved: a venv's python is a symlink
        try:
            out = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True, timeout=60)
        except OSError as exc:
            raise TfmExportError(f"{python}: cannot run it ({exc.strerror}); {MAKE_IT}") from None
        try:
            found = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
        except (IndexError, json.JSONDecodeError):
            found = None
        if not isinstance(found, dict):
            raise TfmExportError(f"{python}: is not a Python 3 interpreter that runs; {MAKE_IT}")
        if found["missing"]:
            names = " and ".join({"pytriton": "nvidia-pytriton", "tfm_export": "tfm-export"}[m]
                                 for m in found["missing"])
            raise TfmExportError(f"{python}: has no {names}; {MAKE_IT}")
        return cls(python, Path(found["root"]) / "tritonserver", Path(found["libs"]), Path(found["libdir"]),
                   found["version"])

    @classmethod
    def locate(cls, python: Path | None = None) -> ServerEnvironment:
        """The environment of `python`; by default this interpreter's if it has pytriton, else the .venv-serving
        beside this environment (where `make serving-env` puts it in a checkout), wherever the command runs."""
        if python is not None:
            return cls.find(python)
        if importlib.util.find_spec("pytriton") is not None:
            return cls.find(Path(sys.executable))
        beside = Path(sys.prefix).parent / SERVING_VENV / "bin" / "python"
        if not beside.exists():
            raise TfmExportError(f"no tritonserver: this Python ({sys.executable}) has no nvidia-pytriton and there "
                                 f"is no {beside}; {MAKE_IT}")
        return cls.find(beside)

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


def free_ports(host: str, ports: tuple[int, int, int]) -> list[int]:
    """HTTP, gRPC and metrics ports, each checked free on `host` by binding it (0: one the kernel picks), then
    closed again (so a tiny race remains); one line for a taken one."""
    sockets = [socket.socket() for _ in ports]
    try:
        for sock, port, name in zip(sockets, ports, ("HTTP", "gRPC", "metrics"), strict=True):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as tritonserver binds it
            try:
                sock.bind((host, port))
            except OSError as exc:
                raise TfmExportError(f"{name} port {port} on {host}: {exc.strerror}; choose another port (0: any "
                                     "free one)") from None
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the process that started the server dies (Linux prctl)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class LocalTritonServer:
    """`with LocalTritonServer(env, repository, work) as server:` a ready server; stopped on exit, even on errors.
    ports: HTTP, gRPC and metrics (None: free ones; 0 in any place: a free one there)."""

    def __init__(self, env: ServerEnvironment, repository: Path, work: Path, extra_args: tuple[str, ...] = (),
                 host: str = SERVE_HOST, ports: tuple[int, int, int] | None = None) -> None:
        self.env, self.repository, self.work, self.extra_args = env, repository, work, extra_args
        self.host, self.requested_ports = host, ports or (0, 0, 0)
        self.process: subprocess.Popen | None = None
        self.http_port = self.grpc_port = self.metrics_port = 0
        self.log_path = work / "tritonserver.log"

    @property
    def http_url(self) -> str:
        return f"{self._client_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self._client_host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"{self._client_host}:{self.metrics_port}"

    @property
    def _client_host(self) -> str:
        """Where a client on this machine reaches it (a server on every address answers on 127.0.0.1)."""
        return SERVE_HOST if self.host in ("0.0.0.0", "") else self.host

    def __enter__(self) -> LocalTritonServer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.http_port, self.grpc_port, self.metrics_port = free_ports(self.host, self.requested_ports)
        backends = self.env.backend_directory(self.work)
        command = [str(self.env.server_root / "bin" / "tritonserver"), "--model-repository", str(self.repository),
                   "--backend-directory", str(backends), "--http-address", self.host, "--http-port",
                   str(self.http_port), "--grpc-address", self.host, "--grpc-port", str(self.grpc_port),
                   "--metrics-address", self.host, "--metrics-port", str(self.metrics_port),
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
                raise TfmExportError(f"tritonserver exited with code {self.process.returncode} while starting: "
                                     f"{self.exit_reason()} (its log: {self.log_path})")
            with contextlib.suppress(Exception):  # connection refused until it listens
                if client.is_server_ready():
                    return
            time.sleep(0.2)
        raise TfmExportError(f"tritonserver not ready after {READY_TIMEOUT_S:.0f} s (its log: {self.log_path})")

    def wait(self) -> None:
        """Until the server ends by itself (which is an error: it is meant to run until stopped)."""
        code = self.process.wait()
        raise TfmExportError(f"tritonserver stopped with code {code}: {self.exit_reason()} (its log: "
                             f"{self.log_path})")

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def exit_reason(self) -> str:
        """Why it ended, from its log: a model that failed to load, else its closing error line, else its last
        line (Triton's error lines start with E and a date; a CPU machine always logs a CUDA one)."""
        lines = self.log_tail(400).splitlines() or ["(no log)"]
        errors = [line.split("] ", 1)[-1].strip().strip('"') for line in lines
                  if line[:1] == "E" and line[1:5].isdigit() and "failed to load" in line]
        closing = [line for line in lines if line.startswith("error:")]
        return (errors or closing or lines[-1:])[0]

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


def repository_models(repository: Path) -> list[str]:
    """The models of a repository that `tfm-export triton` wrote, the text model first; one line otherwise."""
    if manifest_format(repository) != REPOSITORY_FORMAT:
        raise TfmExportError(f"{repository}: is not a model repository written by `tfm-export triton`; write one "
                             "with `tfm-export triton --model MODEL_DIR --output REPO`")
    return json.loads((repository / MANIFEST).read_text(encoding="utf-8"))["models"]


@contextlib.contextmanager
def serving(repository: Path, python: Path | None = None, host: str = SERVE_HOST,
            ports: tuple[int, int, int] = SERVE_PORTS) -> Iterator[tuple[LocalTritonServer, list[str]]]:
    """A ready server on a tfm-export repository, and its models, for as long as the block runs (`tfm-export
    serve`). Its backends and log live in a temporary directory, removed when it stops, kept when it failed to
    start."""
    models = repository_models(repository)
    env = ServerEnvironment.locate(python)
    work = Path(tempfile.mkdtemp(prefix="tfm-serve-"))
    server = LocalTritonServer(env, repository.resolve(), work, host=host, ports=ports)
    try:
        server.start()
    except BaseException as exc:
        if not (isinstance(exc, TfmExportError) and server.log_path.exists()):  # a log that says why stays
            shutil.rmtree(work, ignore_errors=True)
        raise
    try:
        yield server, models
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
