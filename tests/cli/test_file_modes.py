"""Files written for the user have the mode any program's files have: new ones 0666 (directories 0777) less the
umask, replaced ones keep theirs. The oracle is the umask itself and the mode the user set on the old file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from support.common import tiny_config

from tfm_export.artifacts.staging import staged_directory
from tfm_export.cli.run_cli import main as run_main
from tfm_export.core.files import write_text_atomically
from tfm_export.core.tokenizer import Vocabulary, plain_word_tokenizer
from tfm_export.model.checkpoint import save_checkpoint
from tfm_export.model.transformer import Transformer

WORDS = ["<unk>", "<blank>", "<s>", "</s>", *[f"t{i}" for i in range(9)]]
KEPT = 0o640  # what a user set on a file before a command replaced it


@pytest.fixture(params=[0o022, 0o077], ids=["umask022", "umask077"])
def mask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def replaced(path: Path) -> Path:
    path.write_text("old\n")
    path.chmod(KEPT)
    return path


def test_text_outputs_new_and_replaced(mask, tmp_path):
    write_text_atomically(tmp_path / "new.json", "{}\n")  # bench --json, verify's markdown report
    write_text_atomically(replaced(tmp_path / "old.json"), "{}\n")
    assert mode(tmp_path / "new.json") == 0o666 & ~mask
    assert mode(tmp_path / "old.json") == KEPT


def test_checkpoint_and_translations(mask, tmp_path):
    torch.manual_seed(0)
    tok = plain_word_tokenizer(WORDS, "test")
    ckpt = save_checkpoint(Transformer(tiny_config(n_position=8)).eval(), Vocabulary(tok, tok), tmp_path / "ckpt.pt")
    assert mode(ckpt) == mode(tmp_path / "tokenizer.json") == 0o666 & ~mask
    replaced(tmp_path / "old.txt")
    for name in ("new.txt", "old.txt"):
        result = CliRunner().invoke(run_main, ["translate", "--model", str(ckpt), "--max-length", "3",
                                               "--output", str(tmp_path / name), "t1 t2"])
        assert result.exit_code == 0, result.output
    assert mode(tmp_path / "new.txt") == 0o666 & ~mask
    assert mode(tmp_path / "old.txt") == KEPT


def test_precision_report(mask, tmp_path):
    from tfm_export.verify.precision import ErrorStats, PrecisionReport, write_report
    stats = ErrorStats.of("encoder outputs", [np.ones(8, np.float32)], [np.zeros(8, np.float32)])
    report = PrecisionReport(tmp_path / "m", tmp_path / "p", "int8", 1, [stats], [], 0.97)
    (tmp_path / "report").mkdir()
    replaced(tmp_path / "report" / "precision-report.md")
    written = write_report(report, tmp_path / "report")
    assert {p.name: mode(p) for p in written} == {"errors-encoder.png": 0o666 & ~mask,
                                                   "precision-report.md": KEPT}


def test_model_directory(mask, tmp_path):
    with staged_directory(tmp_path / "model", force=False) as staging:
        (staging / "manifest.json").write_text("{}")
    assert mode(tmp_path / "model") == 0o777 & ~mask
    assert mode(tmp_path / "model" / "manifest.json") == 0o666 & ~mask
