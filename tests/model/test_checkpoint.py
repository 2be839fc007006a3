"""Loading seed-format and own-format checkpoints, and refusing everything else clearly."""

from __future__ import annotations

import json
import os
import pickle
import zipfile

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from support.common import listing, tiny_config, unwritable_dir
from support.seed_oracle import save_seed_checkpoint, seed_forward, seed_settings, seed_state_dict, seed_vocab

from tfm_export.cli.run_cli import main as run_main
from tfm_export.core.errors import CheckpointError, VocabularyError
from tfm_export.core.tokenizer import Vocabulary, plain_word_tokenizer
from tfm_export.model.checkpoint import save_checkpoint
from tfm_export.model.loading import load_checkpoint
from tfm_export.model.transformer import Transformer


@pytest.fixture
def seed_files(tmp_path):
    opt = seed_settings()
    state = seed_state_dict(opt)
    ckpt = tmp_path / "model.chkpt"
    save_seed_checkpoint(ckpt, opt, state)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(seed_vocab(opt.src_vocab_size)) + "\n")
    return ckpt, vocab, opt, state


def test_seed_checkpoint_loads_unchanged_and_matches_oracle(seed_files):
    path, vocab, opt, state = seed_files
    ckpt = load_checkpoint(path, [vocab])
    assert ckpt.kind == "seed" and ckpt.vocab.shared
    for name, tensor in state.items():
        assert torch.equal(ckpt.model.state_dict()[name], tensor), name
    src, trg = np.array([[2, 5, 6, 3]]), np.array([[2, 7, 8]])
    with torch.no_grad():
        got = ckpt.model(torch.from_numpy(src), torch.from_numpy(trg)).double().numpy()
    np.testing.assert_allclose(got, seed_forward(state, opt, src, trg), atol=1e-4)


@pytest.mark.parametrize("fmt", ["json-list", "json-dict", "lines"])
def test_seed_checkpoint_with_split_vocabularies(tmp_path, fmt):
    opt = seed_settings(embs_share_weight=False, src_vocab_size=9, trg_vocab_size=12)
    save_seed_checkpoint(tmp_path / "m.chkpt", opt, seed_state_dict(opt))
    files = []
    for side, size in (("src", 9), ("trg", 12)):
        tokens = seed_vocab(size)
        f = tmp_path / f"{side}.vocab"
        if fmt == "json-list":
            f.write_text(json.dumps(tokens))
        elif fmt == "json-dict":
            f.write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
        else:
            f.write_text("\n".join(tokens))
        files.append(f)
    ckpt = load_checkpoint(tmp_path / "m.chkpt", files)
    assert not ckpt.vocab.shared
    assert (ckpt.vocab.source.vocab_size, ckpt.vocab.target.vocab_size) == (9, 12)
    assert ckpt.vocab.source.encode("w1 w4 unknown") == [5, 8, 0]


def test_own_format_round_trips_with_tokenizer_beside_it(tmp_path, tiny_model):
    tok = plain_word_tokenizer([*["<unk>", "<blank>", "<s>", "</s>"], *[f"t{i}" for i in range(9)]], "test")
    path = save_checkpoint(tiny_model, Vocabulary(tok, tok), tmp_path / "ckpt.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt", "tokenizer.json"]
    ckpt = load_checkpoint(path)
    assert ckpt.kind == "tfm-export" and ckpt.config == tiny_model.config
    src, trg = torch.tensor([[2, 5, 3]]), torch.tensor([[2, 6]])
    with torch.no_grad():
        assert torch.equal(ckpt.model(src, trg), tiny_model(src, trg))
    assert ckpt.vocab.source.encode("t1 t2") == [5, 6]
    assert len(ckpt.sha256) == 64


def test_unsafe_pickle_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    bad = tmp_path / "evil.pt"
    bad.write_bytes(pickle.dumps({"model": Evil()}))
    with pytest.raises(CheckpointError, match=r"evil.pt: refused: the pickle wants to import posix.system"):
        load_checkpoint(bad)
    assert not marker.exists()


def test_torch_save_with_foreign_class_is_refused(tmp_path):
    torch.save({"settings": zipfile.ZipInfo("x"), "model": {}}, tmp_path / "foreign.pt")
    with pytest.raises(CheckpointError, match=r"refused: the pickle wants to import .*zipfile.ZipInfo"):
        load_checkpoint(tmp_path / "foreign.pt")


def _truncated(tmp_path, seed_files):
    data = seed_files[0].read_bytes()
    (tmp_path / "t.pt").write_bytes(data[: len(data) // 2])
    return tmp_path / "t.pt"


@pytest.mark.parametrize("make, message", [
    (lambda d, s: d / "missing.pt", "missing.pt: checkpoint not found"),
    (lambda d, s: d, "is a directory, not a checkpoint file"),
    (lambda d, s: (d / "e.pt").write_bytes(b"") and d / "e.pt" or d / "e.pt", "checkpoint file is empty"),
    (lambda d, s: (d / "j.pt").write_text("just some text") and d / "j.pt", "j.pt: not a PyTorch checkpoint"),
    (_truncated, "t.pt: truncated or corrupt checkpoint"),
    (lambda d, s: torch.save([1, 2], d / "l.pt") or d / "l.pt", "holds a list, expected a checkpoint dict"),
    (lambda d, s: torch.save({"state_dict": {}}, d / "f.pt") or d / "f.pt", "not a Transformer checkpoint"),
])
def test_unreadable_files_get_one_clear_line(tmp_path, seed_files, make, message):
    target = make(tmp_path, seed_files)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(target, [seed_files[1]])


def _seed_ckpt_with(tmp_path, mutate, **settings):
    opt = seed_settings(**settings)
    state = seed_state_dict(opt)
    mutate(state)
    save_seed_checkpoint(tmp_path / "m.chkpt", opt, state)
    return tmp_path / "m.chkpt"


@pytest.mark.parametrize("mutate, message", [
    (lambda s: s.pop("decoder.layer_stack.1.enc_attn.fc.weight"), "missing decoder.layer_stack.1.enc_attn.fc.weight"),
    (lambda s: s.update({"decoder.extra.weight": torch.zeros(2)}), "unexpected decoder.extra.weight"),
    (lambda s: s.update({"encoder.layer_stack.0.pos_ffn.w_1.weight": torch.zeros(7, 8)}),
     r"encoder.layer_stack.0.pos_ffn.w_1.weight has shape \(7, 8\), the config needs \(16, 8\)"),
    (lambda s: s.update({"trg_word_prj.weight": torch.zeros(11, 8)}), "should be one shared tensor but differ"),
])
def test_weights_that_do_not_fit_are_named(tmp_path, seed_files, mutate, message):
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(_seed_ckpt_with(tmp_path, mutate), [seed_files[1]])


def test_seed_checkpoint_needs_vocab(seed_files):
    with pytest.raises(VocabularyError, match="carry no vocabulary; pass --vocab"):
        load_checkpoint(seed_files[0])


def test_vocab_size_mismatch_is_explained(tmp_path, seed_files):
    small = tmp_path / "small.txt"
    small.write_text("\n".join(seed_vocab(7)))
    with pytest.raises(VocabularyError, match="small.txt: has 7 tokens but the model's source vocabulary has 11"):
        load_checkpoint(seed_files[0], [small])


def test_missing_tokenizer_beside_own_checkpoint(tmp_path, tiny_model):
    tok = plain_word_tokenizer(["<unk>", "<blank>", "<s>", "</s>", *[f"t{i}" for i in range(9)]], "test")
    save_checkpoint(tiny_model, Vocabulary(tok, tok), tmp_path / "ckpt.pt")
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(VocabularyError, match="tokenizer.json: source tokenizer named by ckpt.pt is missing"):
        load_checkpoint(tmp_path / "ckpt.pt")


def test_save_into_unwritable_directory_leaves_nothing(tmp_path, tiny_model):
    tok = plain_word_tokenizer(["<unk>", "<blank>", "<s>", "</s>", *[f"t{i}" for i in range(9)]], "test")
    with unwritable_dir(tmp_path / "locked") as locked:
        with pytest.raises(CheckpointError, match="cannot write checkpoint"):
            save_checkpoint(tiny_model, Vocabulary(tok, tok), locked / "ckpt.pt")
        assert listing(locked) == []


def test_cli_reports_bad_checkpoint_in_one_line_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "junk.pt").write_text("nope")
    before = listing(tmp_path)
    result = CliRunner().invoke(run_main, ["translate", "--model", "junk.pt", "forty-two"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == ["Error: junk.pt: not a PyTorch checkpoint (torch.load cannot "
                                                  "read it); pass the .pt/.chkpt file that training saved"]
    assert listing(tmp_path) == before


def test_model_config_from_checkpoint_rebuilds_same_architecture(seed_files):
    ckpt = load_checkpoint(seed_files[0], [seed_files[1]])
    rebuilt = Transformer(ckpt.config)
    assert rebuilt.state_dict().keys() == ckpt.model.state_dict().keys()
    assert ckpt.config == tiny_config(src_vocab_size=11, trg_vocab_size=11, d_model=8, d_inner=16, d_k=3, d_v=5,
                                      n_position=200)


def test_save_where_the_directory_is_a_file(tmp_path, tiny_model):
    tok = plain_word_tokenizer(["<unk>", "<blank>", "<s>", "</s>", *[f"t{i}" for i in range(9)]], "test")
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="output directory does not exist"):
        save_checkpoint(tiny_model, Vocabulary(tok, tok), tmp_path / "file" / "ckpt.pt")
    assert listing(tmp_path) == ["file"]


@pytest.mark.parametrize("payload, message", [
    ({"format": "tfm-export-checkpoint", "format_version": 1, "config": [1], "model": {}}, "'config' and 'model' must"),
    ({"format": "tfm-export-checkpoint", "format_version": 1, "model": {}}, "'config' and 'model' must both be dicts"),
    ({"format": "tfm-export-checkpoint", "format_version": 1, "config": {"d_model": 8}, "model": {}},
     "incomplete model config"),
    ({"settings": None, "model": [1, 2]}, "'model' is a list, expected a state_dict"),
])
def test_damaged_checkpoint_dicts_are_one_line(tmp_path, payload, message):
    torch.save(payload, tmp_path / "d.pt")
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(tmp_path / "d.pt")


def test_non_tensor_weight_is_named(tmp_path, seed_files):
    path = _seed_ckpt_with(tmp_path, lambda s: s.update({"encoder.layer_norm.bias": 3}))
    with pytest.raises(CheckpointError, match="encoder.layer_norm.bias is a int, not a tensor"):
        load_checkpoint(path, [seed_files[1]])
