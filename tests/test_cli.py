"""The command-line layer: --help everywhere, inputs from args/file/stdin, one-line errors."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner
from conftest import listing, tiny_config

from tfm_export.cli.export_cli import main as export_main
from tfm_export.cli.run_cli import main as run_main
from tfm_export.core.tokenizer import Vocabulary, plain_word_tokenizer
from tfm_export.model.checkpoint import save_checkpoint
from tfm_export.model.transformer import Transformer

WORDS = ["<unk>", "<blank>", "<s>", "</s>", *[f"t{i}" for i in range(9)]]


@pytest.fixture
def tiny_ckpt(tmp_path):
    torch.manual_seed(0)
    model = Transformer(tiny_config(n_position=8)).eval()
    tok = plain_word_tokenizer(WORDS, "test")
    return save_checkpoint(model, Vocabulary(tok, tok), tmp_path / "ckpt.pt")


@pytest.mark.parametrize("group, args", [(export_main, []), (export_main, ["train-demo"]),
                                          (export_main, ["eval-demo"]), (run_main, []),
                                          (run_main, ["translate"])])
def test_every_command_has_help(group, args):
    result = CliRunner().invoke(group, [*args, "--help"])
    assert result.exit_code == 0 and "Usage:" in result.output and len(result.output) > 200


def test_arguments_file_and_stdin_agree(tiny_ckpt, tmp_path):
    lines = ["t1 t2 t3", "", "t4", "t5 t5 t6 t7"]
    runner = CliRunner()
    base = ["translate", "--model", str(tiny_ckpt), "--max-length", "6"]
    from_args = runner.invoke(run_main, [*base, *lines])
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    from_file = runner.invoke(run_main, [*base, "--input", str(tmp_path / "in.txt")])
    from_stdin = runner.invoke(run_main, base, input="\n".join(lines) + "\n")
    assert from_args.exit_code == 0, from_args.output
    assert from_args.output == from_file.output == from_stdin.output
    out = from_args.output.split("\n")
    assert len(out) == len(lines) + 1 and out[1] == ""  # empty line in, empty line out


@pytest.mark.parametrize("args, stdin, message", [
    (["--input", "missing.txt"], None, "missing.txt: cannot read input"),
    ([], b"t1\n\xff\xfe t2\n", "<stdin>: line 2 is not valid UTF-8"),
    (["t1 t2 t3 t4 t5 t6 t7"], None, "line 1: 9 tokens with <s> and </s>, but the model takes at most 8"),
    (["--vocab", "nope.txt", "t1"], None, "nope.txt: vocabulary file not found"),
])
def test_bad_input_is_one_line_with_exit_code(tiny_ckpt, tmp_path, monkeypatch, args, stdin, message):
    monkeypatch.chdir(tmp_path)
    before = listing(tmp_path)
    result = CliRunner().invoke(run_main, ["translate", "--model", str(tiny_ckpt), *args], input=stdin)
    assert result.exit_code == 1
    assert len(result.output.strip().splitlines()) == 1 and message in result.output
    assert "Traceback" not in result.output
    assert listing(tmp_path) == before


def test_truncate_cuts_long_lines_with_a_warning(tiny_ckpt, caplog):
    result = CliRunner().invoke(run_main, ["translate", "--model", str(tiny_ckpt), "--truncate",
                                           "--max-length", "3", "t1 t2 t3 t4 t5 t6 t7"])
    assert result.exit_code == 0
    assert "line 1: cut from 9 to 8 tokens" in caplog.text


def test_unknown_backend_is_refused(tiny_ckpt):
    result = CliRunner().invoke(run_main, ["translate", "--model", str(tiny_ckpt), "--backend", "cuda-magic", "t1"])
    assert result.exit_code == 2 and "Invalid value for '--backend'" in result.output
