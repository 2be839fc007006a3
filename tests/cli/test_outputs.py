"""Every output is written whole or not at all, in the place the user named and nowhere else: devices and
pipes written in place, links written through, inputs and unrelated directories never replaced, stale
staging directories of dead runs removed, interruptions at any moment clean."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.common import DEMO_CKPT, REPO, listing, tiny_config

from tfm_export.artifacts.manifest import ModelDirError
from tfm_export.artifacts.staging import staged_directory
from tfm_export.cli.export_cli import main as export_main
from tfm_export.cli.run_cli import main as run_main
from tfm_export.core.errors import TfmExportError
from tfm_export.core.files import PARTIAL_SUFFIX, streamed_text, write_atomically, write_text_atomically


def test_a_failed_write_leaves_the_previous_file_and_no_temporary(tmp_path):
    target = tmp_path / "bench.json"
    target.write_text('{"previous": true}')

    def half_then_fail(tmp: Path) -> None:
        tmp.write_text('{"trunc')
        raise OSError(28, "No space left on device")

    with pytest.raises(TfmExportError, match=r"bench.json: cannot write the JSON \(No space left on device\)"):
        write_atomically({target: half_then_fail}, "the JSON")
    assert target.read_text() == '{"previous": true}' and listing(tmp_path) == ["bench.json"]


@pytest.mark.parametrize("written", ["", "quarante-deux\n"])
def test_ctrl_c_keeps_a_partial_file_only_when_something_was_written(tmp_path, written):
    """Interrupted before the first line: no empty .partial and no message pointing at one; after it, the done
    lines are kept beside the untouched target and the message names where."""
    target = tmp_path / "out.txt"
    target.write_text("the previous run's\n")
    with pytest.raises(KeyboardInterrupt) as interrupted, streamed_text(target, "translations") as f:
        f.write(written)
        f.flush()
        raise KeyboardInterrupt
    partial = tmp_path / f"out.txt{PARTIAL_SUFFIX}"
    assert target.read_text() == "the previous run's\n"
    if written:
        assert listing(tmp_path) == ["out.txt", partial.name] and partial.read_text() == written
        assert str(interrupted.value) == f"the translations done so far are in {partial} ({target} is unchanged)"
    else:
        assert listing(tmp_path) == ["out.txt"] and str(interrupted.value) == ""


def test_links_planted_at_guessable_names_are_never_followed(tmp_path):
    decoy = tmp_path / "decoy.txt"
    decoy.write_text("precious")
    for name in (".out.txt.partial", ".out.txt.tmp", ".out.txt.old-1"):
        os.symlink(decoy, tmp_path / name)
    write_text_atomically(tmp_path / "out.txt", "translation\n")
    assert decoy.read_text() == "precious" and (tmp_path / "out.txt").read_text() == "translation\n"


def test_a_link_output_is_written_through(tmp_path):
    target = tmp_path / "real.txt"
    target.write_text("old")
    os.symlink(target, tmp_path / "link.txt")
    write_text_atomically(tmp_path / "link.txt", "new\n")
    assert (tmp_path / "link.txt").is_symlink() and target.read_text() == "new\n"


def test_devices_are_written_in_place_never_replaced(tmp_path):
    before = os.stat("/dev/null")
    write_text_atomically(Path("/dev/null"), "x\n")
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino
    with pytest.raises(TfmExportError, match=r"/dev/full: cannot write output \(No space left on device\)"):
        write_text_atomically(Path("/dev/full"), "x\n")
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_a_named_pipe_output_is_written_into(demo_onnx, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    result = CliRunner().invoke(run_main, ["translate", "--model", str(demo_onnx), "--output", str(fifo),
                                           "forty-two"])
    reader.join(timeout=30)
    assert result.exit_code == 0 and received == ["quarante-deux\n"] and stat.S_ISFIFO(os.stat(fifo).st_mode)


@pytest.mark.parametrize("command", ["onnx", "quantize"])
def test_force_never_replaces_a_directory_of_the_users_own(demo_onnx, tmp_path, command):
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "thesis.tex").write_text("years of work")
    args = (["onnx", "--checkpoint", str(DEMO_CKPT)] if command == "onnx" else
            ["quantize", "--model", str(demo_onnx), "--precision", "int8", "--mode", "dynamic"])
    result = CliRunner().invoke(export_main, [*args, "--output", str(thesis), "--force"])
    assert result.exit_code == 1 and "is not a tfm-export directory" in result.output
    assert listing(thesis) == ["thesis.tex"] and (thesis / "thesis.tex").read_text() == "years of work"


def test_random_checkpoint_replaces_a_trained_model_only_with_force(tmp_path):
    args = ["random-checkpoint", "--d-model", "8", "--heads", "2", "--layers", "1", "--ffn", "8", "--vocab-size",
            "16", "--output", str(tmp_path)]
    assert CliRunner().invoke(export_main, args).exit_code == 0
    before = (tmp_path / "ckpt.pt").read_bytes()
    again = CliRunner().invoke(export_main, [*args, "--seed", "3"])
    assert again.exit_code == 1 and "ckpt.pt: already exists; pass --force" in again.output
    assert (tmp_path / "ckpt.pt").read_bytes() == before
    assert CliRunner().invoke(export_main, [*args, "--seed", "3", "--force"]).exit_code == 0
    assert (tmp_path / "ckpt.pt").read_bytes() != before


def test_translating_a_checkpoint_never_writes_over_its_tokenizer(tmp_path):
    """The tokenizer a checkpoint names is an input too, though the command line names only the checkpoint."""
    shutil.copytree(DEMO_CKPT.parent, tmp_path / "ck", ignore=shutil.ignore_patterns("*.txt"))
    tokenizer = tmp_path / "ck" / "tokenizer.json"
    before = tokenizer.read_bytes()
    result = CliRunner().invoke(run_main, ["translate", "--model", str(tmp_path / "ck" / DEMO_CKPT.name),
                                           "--output", str(tokenizer), "forty-two"])
    assert result.exit_code == 1 and "is the input" in result.output, result.output
    assert tokenizer.read_bytes() == before


def test_train_demo_refuses_before_training_when_a_checkpoint_is_there(tmp_path):
    (tmp_path / "ckpt.pt").write_bytes(b"trained for a week")
    result = CliRunner().invoke(export_main, ["train-demo", "--output", str(tmp_path), "--steps", "1"])
    assert result.exit_code == 1 and "already exists; pass --force" in result.output
    assert (tmp_path / "ckpt.pt").read_bytes() == b"trained for a week"


def test_a_directory_that_appears_during_the_write_is_not_replaced(tmp_path):
    output = tmp_path / "model"
    with pytest.raises(ModelDirError, match="directory is not empty"):
        with staged_directory(output, force=False) as staging:
            (staging / "manifest.json").write_text("{}")
            output.mkdir()  # another process writes here meanwhile
            (output / "theirs.txt").write_text("theirs")
    assert listing(tmp_path) == ["model", "model/theirs.txt"]


def test_stale_staging_of_a_dead_run_is_removed_and_a_live_one_respected(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".model.{dead.pid}.abc123.partial"
    stale.mkdir()
    (stale / "encoder.onnx").write_bytes(b"half")
    with staged_directory(tmp_path / "model", force=False) as staging:
        (staging / "manifest.json").write_text("{}")
    assert listing(tmp_path) == ["model", "model/manifest.json"]
    live = tmp_path / f".other.{os.getppid()}.xyz.partial"
    live.mkdir()
    with pytest.raises(ModelDirError, match=f"another tfm-export \\(process {os.getppid()}\\) is writing it"):
        with staged_directory(tmp_path / "other", force=False):
            pass
    assert live.exists()


def test_an_interrupt_while_the_staging_directory_is_made_leaves_nothing(tmp_path, monkeypatch):
    """Ctrl-C between mkdtemp's mkdir and its return (the directory exists, its name is not known yet)."""
    import tempfile
    made = tempfile.mkdtemp

    def interrupted(*args, **kwargs):
        made(*args, **kwargs)
        raise KeyboardInterrupt
    monkeypatch.setattr(tempfile, "mkdtemp", interrupted)
    with pytest.raises(KeyboardInterrupt), staged_directory(tmp_path / "model", force=False):
        pass
    assert listing(tmp_path) == []


def _run_shell(command: str) -> subprocess.CompletedProcess:
    """As a user's shell runs it: without PYTHONUNBUFFERED, stdout is buffered and flushed again at exit."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, cwd=REPO, timeout=120, env=env)


def test_closed_stdout_and_stdin_are_errors_not_silent_exit_0(demo_onnx):
    tfm_run = Path(sys.executable).parent / "tfm-run"
    if not tfm_run.exists():
        pytest.skip("tfm-run is not installed in this environment (run through `make test`)")
    closed = _run_shell(f"'{tfm_run}' translate --model '{demo_onnx}' forty-two >&-")
    assert closed.returncode == 1 and closed.stderr.strip() == "Error: stdout is closed, so the output cannot be " \
        "written; redirect it to a file, or pass --output FILE where the command has it"
    assert _run_shell(f"'{tfm_run}' translate --model '{demo_onnx}' --output /dev/null forty-two >&-").returncode == 0
    tfm_export = Path(sys.executable).parent / "tfm-export"
    for command in ("inspect", "check"):  # their report is their product
        closed = _run_shell(f"'{tfm_export}' {command} --model '{demo_onnx}' >&-")
        assert closed.returncode == 1 and closed.stderr.startswith("Error: stdout is closed"), closed.stderr
        full = _run_shell(f"'{tfm_export}' {command} --model '{demo_onnx}' > /dev/full")
        assert full.returncode == 1 and full.stderr.strip() == \
            "Error: cannot write to stdout (No space left on device)", full.stderr
    full = _run_shell(f"'{tfm_run}' translate --model '{demo_onnx}' forty-two > /dev/full")
    assert full.returncode == 1 and full.stderr == "Error: cannot write the translations to stdout (No space left " \
        "on device); pass --output FILE\n", full.stderr
    no_input = _run_shell(f"'{tfm_run}' translate --model '{demo_onnx}' <&-")
    assert no_input.returncode == 1 and "stdin is closed" in no_input.stderr


@pytest.mark.parametrize(("signum", "delay"), [(signal.SIGINT, 0.3), (signal.SIGINT, 1.5), (signal.SIGTERM, 1.5),
                                               (signal.SIGHUP, 0.3)])
def test_an_interrupted_export_is_interrupted_at_any_moment(tmp_path, signum, delay):
    """Even while PyTorch's exporter is still being imported (early) or the graphs are traced (later), by any of
    the three signals: "interrupted", exit 130, nothing left."""
    tfm_export = Path(sys.executable).parent / "tfm-export"
    if not tfm_export.exists():
        pytest.skip("tfm-export is not installed in this environment (run through `make test`)")
    from tfm_export.model.synthetic import random_checkpoint
    ckpt = random_checkpoint(tiny_config(), tmp_path / "ckpt")
    process = subprocess.Popen([tfm_export, "onnx", "--checkpoint", ckpt, "--output", tmp_path / "out"],
                               stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    process.send_signal(signum)
    _, err = process.communicate(timeout=120)
    if process.returncode == 0:  # finished before the signal on a fast machine: nothing to check
        return
    if process.returncode == -signum:  # so early (a loaded machine) that the interpreter had not started
        assert err == ""
    else:
        assert process.returncode == 130 and err.strip().splitlines()[-1] == "interrupted", err
    assert "Traceback" not in err and listing(tmp_path) == ["ckpt", "ckpt/ckpt.pt", "ckpt/tokenizer.json"]
