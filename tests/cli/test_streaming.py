"""`tfm-run translate` as a stream: output as input arrives, in input order, and Ctrl-C keeps what is done.

The oracle is the same command run on the whole input at once (and the demo's known translations); the
timing claims are orderings (the first translation is read before the second line is written), never durations.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tfm_export.cli.run_cli import main as run_main

TFM_RUN = Path(sys.executable).parent / "tfm-run"
WAIT_S = 120  # generous: a shared machine may load the model slowly; a pass never waits this long


def start(*args: str) -> subprocess.Popen:
    """The command as a user's shell runs it: stdout a pipe, so block-buffered unless the command flushes."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return subprocess.Popen([str(TFM_RUN), "translate", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**env, "TFM_THREADS": "1"}, bufsize=0)


def read_line(proc: subprocess.Popen) -> bytes:
    """The next output line, or a failure if none comes while the input stays open."""
    ready, _, _ = select.select([proc.stdout], [], [], WAIT_S)
    if not ready:
        proc.kill()
        pytest.fail(f"no output within {WAIT_S} s while stdin stayed open: the translation waited for the "
                    "whole input")
    return proc.stdout.readline()


def test_first_translation_arrives_before_the_second_line_is_written(demo_onnx):
    proc = start("--model", str(demo_onnx))
    proc.stdin.write(b"forty-two\n")
    proc.stdin.flush()
    first = read_line(proc)  # the second line is not written yet
    proc.stdin.write(b"seven\n\none hundred\n")
    proc.stdin.close()
    rest = proc.stdout.read()
    assert proc.wait(WAIT_S) == 0, proc.stderr.read()
    assert (first + rest).decode().split("\n") == ["quarante-deux", "sept", "", "cent", ""]


def test_ctrl_c_keeps_what_was_written_to_stdout(demo_onnx):
    proc = start("--model", str(demo_onnx), "--format", "jsonl")
    proc.stdin.write(b"forty-two\nseven\n")
    proc.stdin.flush()
    written = [read_line(proc), read_line(proc)]
    proc.send_signal(signal.SIGINT)  # stdin still open: the command waits for more input
    rest, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 130
    assert err.decode().strip() == "interrupted"
    assert rest == b""
    assert [line.decode().split('"translation": "')[1].split('"')[0] for line in written] == ["quarante-deux", "sept"]


def test_ctrl_c_with_output_keeps_the_done_lines_beside_it_and_the_old_file_untouched(demo_onnx, tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("the previous run's translations\n")
    proc = start("--model", str(demo_onnx), "--output", str(out))
    proc.stdin.write(b"forty-two\n")
    proc.stdin.flush()
    temps = lambda: [p for p in tmp_path.iterdir() if p.name.startswith(".out.txt.")]  # noqa: E731
    for _ in range(WAIT_S * 10):  # until the first translation is in the temporary file
        if any(p.read_text() for p in temps()):
            break
        select.select([], [], [], 0.1)
    else:
        proc.kill()
        pytest.fail("the first translation never reached the output while stdin stayed open")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=WAIT_S)
    partial = tmp_path / "out.txt.partial"
    assert proc.returncode == 130
    assert err.decode().strip() == f"interrupted: the translations done so far are in {partial} ({out} is unchanged)"
    assert out.read_text() == "the previous run's translations\n"
    assert partial.read_text() == "quarante-deux\n"
    assert temps() == []


def test_output_file_is_whole_after_success_and_absent_after_an_error(demo_onnx, tmp_path):
    out = tmp_path / "out.txt"
    source = tmp_path / "in.txt"
    source.write_text("forty-two\n" + "forty-two " * 300 + "\n")  # line 2 is too long for the model
    result = CliRunner().invoke(run_main, ["translate", "--model", str(demo_onnx), "--input", str(source),
                                           "--output", str(out), "--batch-size", "1"])
    assert result.exit_code == 1 and "line 2:" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]
    source.write_text("forty-two\nseven\n")
    result = CliRunner().invoke(run_main, ["translate", "--model", str(demo_onnx), "--input", str(source),
                                           "--output", str(out), "--batch-size", "1"])
    assert result.exit_code == 0 and out.read_text() == "quarante-deux\nsept\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]


def test_streamed_order_and_line_numbers_span_chunks(demo_onnx, tmp_path):
    """Many more lines than one chunk holds, lengths mixed so bucketing reorders inside each chunk: the output is
    the one-at-a-time translation of every line, in order, and an error names the line in the whole input."""
    words = ["forty-two", "seven", "nine hundred and ninety-nine thousand, nine hundred and ninety-nine", "",
             "one thousand, two hundred and thirty-four", "eighty"]
    lines = [words[(i * 7) % len(words)] for i in range(300)]
    result = CliRunner().invoke(run_main, ["translate", "--model", str(demo_onnx), "--batch-size", "4"],
                                input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    one_each = {w: CliRunner().invoke(run_main, ["translate", "--model", str(demo_onnx), w]).output.rstrip("\n")
                for w in words if w}
    assert result.output.split("\n")[:-1] == [one_each.get(w, "") for w in lines]
    lines[250] = "forty-two " * 300
    result = CliRunner().invoke(run_main, ["translate", "--model", str(demo_onnx), "--batch-size", "4"],
                                input="\n".join(lines) + "\n")
    assert result.exit_code == 1 and "Error: line 251:" in result.output


def test_jsonl_marks_a_translation_cut_by_max_length(demo_onnx):
    result = CliRunner().invoke(run_main, ["translate", "--model", str(demo_onnx), "--format", "jsonl",
                                           "--max-length", "2", "forty-two", "seven"])
    assert result.exit_code == 0, result.output
    import json
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert [(r["translation"], r["truncated"]) for r in rows] == [("quarante-", True), ("sept", False)]


def test_time_ms_is_documented_as_batch_time_per_sentence():
    result = CliRunner().invoke(run_main, ["translate", "--help"])
    assert "time_ms" in result.output and "batch" in result.output.split("time_ms")[1][:120]
