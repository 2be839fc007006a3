"""The command-line layer: --help everywhere, inputs from args/file/stdin, one-line errors."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner
from support.common import listing, tiny_config

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


def test_no_search_graph_is_the_concat_backend_and_contradicts_any_other(tiny_ckpt):
    """--no-search-graph picks onnxruntime-concat; beside --backend torch it is a usage error, not ignored."""
    result = CliRunner().invoke(run_main, ["translate", "--model", str(tiny_ckpt), "--backend", "torch",
                                           "--no-search-graph", "t1"])
    assert result.exit_code == 2 and "--no-search-graph picks onnxruntime-concat" in result.output
    result = CliRunner().invoke(run_main, ["translate", "--model", str(tiny_ckpt), "--no-search-graph", "t1"])
    assert result.exit_code == 1 and "is a checkpoint; the onnxruntime backend" in result.output


def test_version():
    from tfm_export import __version__
    for group, name in ((run_main, "tfm-run"), (export_main, "tfm-export")):
        result = CliRunner().invoke(group, ["--version"], prog_name=name)
        assert result.exit_code == 0 and result.output == f"{name} {__version__}\n"


@pytest.fixture
def not_exported(tmp_path, tiny_ckpt):
    """What users give where an exported model directory belongs: a Hugging Face directory (a config.json is
    what marks one) and the directory a checkpoint was saved in."""
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"weights")
    return tmp_path / "hf", tiny_ckpt.parent


def test_a_directory_that_is_not_exported_names_the_fix(not_exported):
    hf, checkpoint_dir = not_exported
    ckpt = checkpoint_dir / "ckpt.pt"
    export = "`tfm-export onnx --checkpoint {} --output MODEL_DIR`"
    cases = [
        (run_main, ["translate", "--model", str(hf), "x"], f"Error: {hf}: is a Hugging Face model directory, not a "
         f"tfm-export model directory; export it with {export.format(hf)}, or translate with it directly "
         "(--backend torch)"),
        (run_main, ["translate", "--model", str(checkpoint_dir), "x"], f"Error: {checkpoint_dir}: holds the checkpoint "
         f"{ckpt}, not a tfm-export model directory; export it with {export.format(ckpt)}, or give {ckpt} itself"),
        (export_main, ["inspect", "--model", str(hf)], f"Error: {hf}: is a Hugging Face model directory, not a "
         f"tfm-export model directory; export it with {export.format(hf)}"),
        (export_main, ["onnx", "--checkpoint", str(hf / "model.safetensors"), "--output", str(hf.parent / "o")],
         f"Error: {hf / 'model.safetensors'}: is one file of the Hugging Face model directory {hf}; pass the "
         f"directory itself, {hf}"),
        (export_main, ["onnx", "--checkpoint", str(checkpoint_dir), "--output", str(hf.parent / "o")],
         f"Error: {checkpoint_dir}: is a directory, not a checkpoint file; pass the checkpoint inside it, {ckpt}"),
        (run_main, ["translate", "--model", str(checkpoint_dir), "--backend", "torch", "x"],
         f"Error: {checkpoint_dir}: is a directory, not a checkpoint file; pass the checkpoint inside it, {ckpt}"),
    ]
    for group, args, message in cases:
        result = CliRunner().invoke(group, args)
        assert result.exit_code == 1 and result.output == message + "\n", result.output


def test_inspect_reads_only_checked_manifest_fields(tiny_ckpt, tmp_path):
    """A manifest without the sizes the graphs were built with is refused in one line, before anything is read
    on the strength of it (inspect printed d_model from it and died of a KeyError)."""
    from tfm_export.core.graph_spec import CONTRACT_GRAPHS
    from tfm_export.graphs.pipeline import build_manifest
    from tfm_export.model.loading import load_checkpoint
    manifest = build_manifest(load_checkpoint(tiny_ckpt), 17, {g: "0" * 64 for g in CONTRACT_GRAPHS}, {},
                              []).to_dict()
    (tmp_path / "m").mkdir()
    for edit, message in ((lambda m: m["model"].pop("d_model"), "lacks model.d_model; export the model again"),
                          (lambda m: m["optimizations"].append(7), "has an invalid optimizations; export")):
        damaged = copy.deepcopy(manifest)
        edit(damaged)
        (tmp_path / "m" / "manifest.json").write_text(json.dumps(damaged))
        result = CliRunner().invoke(export_main, ["inspect", "--model", str(tmp_path / "m")])
        assert result.exit_code == 1 and result.output.count("\n") == 1 and message in result.output, result.output


@pytest.mark.parametrize("signalled", [True, False])
def test_a_signal_deferred_past_an_import_interrupts_a_command_that_ends_first(tmp_path, signalled):
    """A Ctrl-C that came during an import, and whose second delivery the command outran (here it fails at once,
    its input missing, long before the resend), still ends it as "interrupted", exit 130; without the signal the
    same command says its own error, exit 1."""
    (tmp_path / "slow_module.py").write_text("import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\n"
                                             "time.sleep(0.5)  # the signal arrives here, inside the import\n")
    code = (f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
            "from tfm_export.cli import entry, signals\nsignals.RETRY_S = 60  # the resend comes after the command\n"
            f"signals.handle_signals()\n{'import slow_module' if signalled else ''}\n"
            f"sys.argv = ['tfm-run', 'translate', '--model', {str(tmp_path / 'missing')!r}]\nentry.run_main()\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    if signalled:
        assert (result.returncode, result.stderr) == (130, "interrupted\n"), result.stderr
    else:
        assert result.returncode == 1 and "model not found" in result.stderr, result.stderr


def test_a_signal_during_an_import_is_delivered_after_it(tmp_path):
    """An extension module interrupted while it initialises can abort the process (`import torch` ends in
    std::terminate, exit 134, when the KeyboardInterrupt reaches Python code it calls back): the CLI's handler
    sends the signal again once the import is over, so the import completes and the interrupt then unwinds."""
    (tmp_path / "slow_module.py").write_text("import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\n"
                                             "time.sleep(0.5)  # the signal arrives here, inside the import\n"
                                             "COMPLETE = True\n")
    code = (f"import sys, time\nsys.path.insert(0, {str(tmp_path)!r})\n"
            "from tfm_export.cli.signals import handle_signals\nhandle_signals()\n"
            "try:\n    import slow_module\n    time.sleep(10)\n    print('not interrupted')\n"
            "except KeyboardInterrupt:\n    print('interrupted after the import:', 'slow_module' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout == "interrupted after the import: True\n", result.stderr
