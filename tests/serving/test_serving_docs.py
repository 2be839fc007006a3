"""docs/serving.md as a new user follows it, and `tfm-export serve`'s one-line errors.

The page's `sh runnable` and `python runnable` blocks run as written, in order, from a directory laid out like the
repository's root (its .venv and models linked in): export, write the repository, start the server
in the background, send the page's requests, stop the server with SIGINT (Ctrl-C). The answers must be the
in-process Translator's on the directory the page exported, the server must stop with status 0 and no
traceback. Where the kernel allows, everything runs in a private network namespace, so the page's fixed ports
(8000-8002) cannot meet another server.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.common import REPO
from support.triton_server import SERVING_VENV, serving_environment

from tfm_export import DecodeOptions, Translator
from tfm_export.cli.export_cli import main as export_main
from tfm_export.serving.contract import SERVE_PORTS

PAGE = REPO / "docs" / "serving.md"
RUNNABLE = re.compile(r"^```(sh|python) runnable\n(.*?)^```$", re.MULTILINE | re.DOTALL)
READY = "Ctrl-C stops it."
# what the page's commands use from the repository's root (`tfm-export serve` finds .venv-serving beside .venv's
# real place, not in the working directory)
LINKED = (".venv", "models")


def runnable_blocks() -> list[tuple[str, str]]:
    return RUNNABLE.findall(PAGE.read_text(encoding="utf-8"))


def _serves(code: str) -> bool:
    return "tfm-export serve" in code


def _namespace() -> list[str] | None:
    """A command prefix that runs in a private network namespace with loopback up, where the kernel allows one."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return None
    for prefix in (["unshare", "--net"], ["unshare", "--net", "--map-root-user"]):
        probe = subprocess.run([*prefix, "ip", "link", "set", "lo", "up"], capture_output=True)
        if probe.returncode == 0:
            return prefix
    return None


def _ports_free() -> bool:
    for port in SERVE_PORTS:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return False
    return True


def _script(blocks: list[tuple[str, str]], work: Path, isolated: bool) -> str:
    """One bash script: each block in turn (its output and status kept), the serving block in the background
    (its own process group, as a terminal's foreground job is) until the others are done, then SIGINT to it."""
    lines = ["ip link set lo up"] if isolated else []
    for index, (language, code) in enumerate(blocks):
        path = work / f"block{index}.{'py' if language == 'python' else 'sh'}"
        path.write_text(code)
        run = f".venv/bin/python {path}" if language == "python" else f"bash -eo pipefail {path}"
        if _serves(code):
            lines += ["set -m", f"{run} > serve.out 2>&1 &", "server=$!", "set +m",
                      f"for i in $(seq 600); do grep -q '{READY}' serve.out && break; kill -0 $server || break; "
                      "sleep 0.5; done"]
        else:
            lines.append(f"{run} > out{index}.txt 2>&1; echo $? > out{index}.status")
    lines += ["kill -INT -- -$server", "status=0; wait $server || status=$?", "echo $status > serve.status"]
    return "\n".join(lines) + "\n"


def test_the_page_walks_through_every_step():
    """Export and repository, serve, a request with curl and one with tritonclient: in that order. The README's
    serving section shows the same commands, and points here."""
    blocks = runnable_blocks()
    assert [_serves(code) for _, code in blocks] == [False, True, False, False]
    assert "tfm-export triton" in blocks[0][1] and "curl" in blocks[2][1] and "tritonclient" in blocks[3][1]
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Serving on Triton Inference Server"):]
    section = section[:section.index("\n## ", 1)]
    assert "docs/serving.md" in section
    page_lines = {line.strip() for _, code in blocks for line in code.splitlines()}
    shown = [line.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.DOTALL)
             for line in block.splitlines() if line.strip().startswith(".venv/bin/")]
    assert shown and set(shown) <= page_lines


@pytest.mark.slow  # a minute; the server tests beside it hold what the page shows
def test_the_page_runs_as_written(tmp_path):
    serving_environment()  # or a skip that says how to build it
    prefix = _namespace()
    if prefix is None and not _ports_free():
        pytest.skip(f"no private network namespace here, and a port of {SERVE_PORTS} is taken")
    for name in LINKED:
        (tmp_path / name).symlink_to(REPO / name)
    blocks = runnable_blocks()
    (tmp_path / "page.sh").write_text(_script(blocks, tmp_path, prefix is not None))
    subprocess.run([*(prefix or []), "bash", "page.sh"], cwd=tmp_path, timeout=900, check=True)

    for index, (_, code) in enumerate(blocks):
        if not _serves(code):
            output = (tmp_path / f"out{index}.txt").read_text()
            assert (tmp_path / f"out{index}.status").read_text().strip() == "0", (code, output, _read(tmp_path /
                                                                                                      "serve.out"))
    serve = (tmp_path / "serve.out").read_text()
    assert READY in serve and serve.rstrip().endswith("stopped") and "Traceback" not in serve, serve
    assert (tmp_path / "serve.status").read_text().strip() == "0", serve

    translator = Translator.load(tmp_path / "build" / "demo-onnx")
    request = json.loads(re.search(r"-d '(.*)'", blocks[2][1], re.DOTALL).group(1))
    texts = request["inputs"][0]["data"]
    want = translator.translate(texts, DecodeOptions(**request["parameters"]))
    answer = {o["name"]: o for o in json.loads((tmp_path / "out2.txt").read_text())["outputs"]}
    assert answer["TRANSLATION"]["data"] == [t.text for t in want]
    assert answer["N_BEST"]["data"] == [a.text for t in want for a in t.n_best]
    assert answer["N_BEST_COUNT"]["data"] == [t.n_best_count for t in want]
    greedy_beam4 = translator.translate(texts, DecodeOptions(beam_size=4))
    assert (tmp_path / "out3.txt").read_text().strip() == str([t.text for t in greedy_beam4])


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _serve(*args: str | Path):
    return CliRunner().invoke(export_main, ["serve", *map(str, args)])


def test_serve_errors_are_one_line(demo_onnx, tmp_path, monkeypatch):
    """Not a repository, an interpreter without the server, a port in use: one line naming what to do, exit 1,
    and no temporary directory left behind."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    repository = tmp_path / "repo"
    assert CliRunner().invoke(export_main, ["triton", "--model", str(demo_onnx), "--output", str(repository)]
                              ).exit_code == 0
    cases = {("--repository", demo_onnx): "is not a model repository written by `tfm-export triton`; write one",
             ("--repository", repository, "--serving-python", tmp_path / "none"):
                 "cannot run it (No such file or directory); build it with `make serving-env`",
             ("--repository", repository, "--serving-python", shutil.which("true")):
                 "is not a Python 3 interpreter that runs; build it with `make serving-env`",
             ("--repository", repository, "--serving-python", sys.executable):  # .venv: numpy 2, no pytriton
                 "has no nvidia-pytriton; build it with `make serving-env`"}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        if (SERVING_VENV / ".installed").exists():
            cases[("--repository", repository, "--http-port", port, "--serving-python",
                   SERVING_VENV / "bin" / "python")] = f"HTTP port {port} on 127.0.0.1: Address already in use"
        for args, message in cases.items():
            result = _serve(*args)
            assert result.exit_code == 1 and message in result.output, (args, result.output)
            assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert list((tmp_path / "tmp").iterdir()) == []
