"""The C++ example's --ids mode, held to tfm-run on models it has no tokenizer for: the same token ids and n-best
scores on a random base-size export and on a random tiny Marian (generate()'s beam rule, banned and stopping ids
where they change outputs)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from support.cpp import assert_same_ids_and_scores, built_translator

from tfm_export import Translator
from tfm_export.core.batching import pad_batch
from tfm_export.core.tokenizer import plain_word_tokenizer
from tfm_export.runtime.translator import DecodeOptions


@pytest.fixture(scope="module")
def tfm_translate() -> Path:
    return built_translator()


@pytest.mark.slow
def test_base_size_export_decodes_the_ids_tfm_run_does(tfm_translate, base_onnx):
    """Random weights of the base config (vocab 32,000): 4 sources, 12 tokens at most (a random model rarely ends
    earlier: the ranking, length penalty and scores are what is compared)."""
    _, model = base_onnx
    rng = np.random.default_rng(0)
    sources = [[2, *rng.integers(4, 32000, rng.integers(3, 12)).tolist(), 3] for _ in range(4)]
    assert_same_ids_and_scores(tfm_translate, model, sources, max_length=12)


VOCAB = 101


@pytest.fixture(scope="module")
def tiny_marian(tmp_path_factory) -> Path:
    """A random tiny Marian (transformers, no download) exported by tfm-export, whose </s> is a token it generates
    mid-sentence for about half of the inputs and whose most frequent other token is banned (hf_oracle), so
    stopping and banning change outputs; beam search follows generate()'s rule. Its tokenizer is a plain word
    list: the C++ example reads ids, as an app with its own SentencePiece tokenizer would give them."""
    transformers = pytest.importorskip("transformers", reason="the tiny Marian needs the hf extra")
    from support.hf_oracle import randomize, retarget_stop

    from tfm_export.graphs.pipeline import export_model_dir
    from tfm_export.model.loading import load_checkpoint

    root = tmp_path_factory.mktemp("marian")
    torch.manual_seed(3)
    config = transformers.MarianConfig(
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64, vocab_size=VOCAB, pad_token_id=VOCAB - 1,
        decoder_start_token_id=VOCAB - 1, eos_token_id=0, activation_function="swish", scale_embedding=True)
    model = randomize(transformers.MarianMTModel(config), 2.0)
    src = torch.from_numpy(pad_batch(marian_sources(), VOCAB - 1))
    with torch.no_grad():
        out = model.generate(input_ids=src, attention_mask=(src != VOCAB - 1).long(), num_beams=1, do_sample=False,
                             eos_token_id=None, max_length=21)
    retarget_stop(model, [tuple(row) for row in out[:, 1:].tolist()], force_eos=False)
    model.generation_config.max_length = 24
    model.save_pretrained(root / "hf")
    words = ["<unk>", "<blank>", "<s>", "</s>", *(f"w{i}" for i in range(4, VOCAB))]
    plain_word_tokenizer(words, "tiny marian").save(root / "hf" / "tokenizer.json")
    export_model_dir(load_checkpoint(root / "hf"), root / "onnx", progress=False)
    return root / "onnx"


def marian_sources() -> list[list[int]]:
    """24 random sources framed as Marian's tokenizer frames them: ids, then </s> (0)."""
    rng = np.random.default_rng(11)
    return [[*rng.integers(3, VOCAB - 2, rng.integers(1, 15)).tolist(), 0] for _ in range(24)]


def test_tiny_marian_decodes_the_ids_tfm_run_does(tfm_translate, tiny_marian):
    manifest = json.loads((tiny_marian / "manifest.json").read_text())
    assert manifest["token_rules"]["beam_rule"] == "transformers" and len(manifest["token_rules"]["banned"]) == 2
    want = Translator.load(tiny_marian).translate_ids(marian_sources(), DecodeOptions(batch_size=1))
    assert len({len(h[0].tokens) for h in want}) >= 3  # stops at </s> at several lengths
    assert_same_ids_and_scores(tfm_translate, tiny_marian, marian_sources(), max_length=23)
