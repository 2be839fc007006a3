"""decoder_step_search itself: its K candidates per row against an independent reduction of its own logits (log-
softmax in PyTorch, the rules, a stable sort), ties included; its in-place cache write against PyTorch's cached
keys/values; and the graph as every model gets it (standard ops, no control flow, K a constant)."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from support.backends import step_backend
from support.common import short_sources, tiny_config
from support.search_graph import assert_standard_search_step

from tfm_export.artifacts.model_dir import read_manifest
from tfm_export.core.graph_spec import SEARCH_BEAMS, Graph, search_top_k
from tfm_export.core.token_rules import SEED_RULES, TokenRules
from tfm_export.core.tokenizer import BOS_ID, EOS_ID, FIRST_TOKEN_ID
from tfm_export.graphs.pipeline import export_model_dir
from tfm_export.model.cache import ConcatCache
from tfm_export.model.checkpoint import save_checkpoint
from tfm_export.model.loading import load_checkpoint
from tfm_export.model.synthetic import random_checkpoint
from tfm_export.runtime.backends import INPLACE
from tfm_export.runtime.decoding import StepRule

SEARCH = Graph.DECODER_STEP_SEARCH


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A random model (vocabulary 40, more than K) and one whose logits are all equal (every candidate a tie)."""
    made = {}
    for name in ("random", "tied"):
        root = tmp_path_factory.mktemp(name)
        cfg = tiny_config(src_vocab_size=40, trg_vocab_size=40, proj_share_weight=False)
        base = load_checkpoint(random_checkpoint(cfg, root / "base", seed=2))
        if name == "tied":
            with torch.no_grad():
                base.model.trg_word_prj.weight.zero_()
        (root / "ckpt").mkdir()
        ckpt = load_checkpoint(save_checkpoint(base.model, base.vocab, root / "ckpt" / "ckpt.pt"))
        export_model_dir(ckpt, root / "model", progress=False)
        made[name] = (ckpt, root / "model")
    return made


def _reference_candidates(logits: np.ndarray, rule: StepRule) -> tuple[np.ndarray, np.ndarray]:
    """log_softmax over every token, then the rules, then all tokens ranked by value, ties to the lower id."""
    logp = torch.log_softmax(torch.from_numpy(logits).double(), dim=-1).numpy()
    if rule.forced is not None:
        logp = np.where(np.arange(logits.shape[1]) == rule.forced, 0.0, -np.inf)[None].repeat(len(logits), 0)
    else:
        logp[:, list(rule.rules.banned)] = -np.inf
        if not rule.allow_eos:
            logp[:, rule.rules.eos] = -np.inf
    ids = np.broadcast_to(np.arange(logits.shape[1]), logp.shape)
    order = np.lexsort((ids, -logp), axis=1)
    return np.take_along_axis(logp, order, axis=1), order


RULES = {"seed": StepRule(SEED_RULES, 1), "eos barred": StepRule(SEED_RULES, 1, allow_eos=False),
         "forced": StepRule(SEED_RULES, 1, forced=7), "forced id 0": StepRule(SEED_RULES, 1, forced=0),
         "more banned": StepRule(TokenRules(banned=(1, 5, 30), eos=9), 1, allow_eos=False)}


@pytest.mark.parametrize("rule", RULES, ids=list(RULES))
@pytest.mark.parametrize("name", ["random", "tied"])
def test_the_graphs_candidates_are_its_logits_ranked_under_the_rules(models, name, rule):
    ckpt, directory = models[name]
    backend = step_backend(directory, INPLACE)
    k = search_top_k(ckpt.config)
    assert k == 2 * SEARCH_BEAMS < ckpt.config.trg_vocab_size
    state = backend.expand(backend.encode(short_sources(40, 3, 0)), 2)
    rng = np.random.default_rng(1)
    for _ in range(3):
        tokens = rng.integers(FIRST_TOKEN_ID, ckpt.config.trg_vocab_size, state.rows)
        state, found = backend.step(state, tokens, RULES[rule])
        values, ids = _reference_candidates(found.logits, RULES[rule])
        finite = np.isfinite(values[:, :k])
        np.testing.assert_allclose(found.values[finite], values[:, :k][finite], atol=1e-5)
        assert np.array_equal(np.isfinite(found.values), finite)
        if name == "tied" or rule.startswith("forced"):  # ties everywhere: the order is the ids' own
            assert np.array_equal(found.ids, ids[:, :k])
        else:
            assert np.array_equal(found.ids[finite], ids[:, :k][finite])


def test_the_step_writes_each_new_key_and_value_in_place(models):
    """After t steps each layer's buffer holds PyTorch's cached keys/values at positions 0..t-1, in the memory
    bound to the session at the first step, and nothing (zeros) beyond: the graph wrote the new token's row at
    cache_length and nowhere else."""
    ckpt, directory = models["random"]
    model, cfg = ckpt.model, ckpt.config
    src = short_sources(40, 2, 3)
    backend = step_backend(directory, INPLACE)
    state = backend.encode(src)
    tokens = np.array([[BOS_ID, 5, 9, 11, 6], [BOS_ID, 8, 8, 12, EOS_ID]])
    for t in range(tokens.shape[1]):
        state, _ = backend.step(state, tokens[:, t], RULES["seed"])
        if t == 0:
            memory = [block.ctypes.data for block in state.buffers.blocks]
    assert [block.ctypes.data for block in state.buffers.blocks] == memory
    with torch.no_grad():
        enc, src_mask = model.encode(torch.from_numpy(src))
        empty = torch.zeros(2, cfg.n_head, 0, cfg.d_k)
        _, present = model.decoder.step(torch.from_numpy(tokens), ConcatCache([(empty, empty)] * cfg.n_layers),
                                        model.decoder.cross_keys_values(enc), src_mask)
    steps = tokens.shape[1]
    for buffer, want in zip(state.buffers.cache, [t for kv in present for t in kv], strict=True):
        np.testing.assert_allclose(buffer[:, :, :steps], want.numpy(), atol=1e-5)
        assert not buffer[:, :, steps:].any()


def test_the_search_step_is_standard_ops_with_k_a_constant(models):
    """As the export wrote it (the variant architectures' are checked in test_variants_export)."""
    ckpt, directory = models["random"]
    assert_standard_search_step(onnx.load(str(directory / SEARCH.filename)), ckpt.config)


def test_simplify_keeps_every_output_and_takes_nodes_out(models):
    """The rewrites only remove nodes: the exported step graph and its simplified form give the same outputs
    (to float32 rounding: a merged Q/K/V MatMul is free to block its sums otherwise), with the Q/K/V MatMuls of
    each layer merged into one."""
    from tfm_export.core.graph_spec import search_step_spec
    from tfm_export.graphs.export import export_graph
    from tfm_export.graphs.simplify import simplify
    from tfm_export.graphs.weights import bind
    from tfm_export.runtime.session import run
    ckpt, _ = models["random"]
    exported = export_graph(ckpt.model.eval(), search_step_spec(ckpt.config), 17, simplified=False)
    raw, weights = copy.deepcopy(exported.proto), dict(exported.weights)
    simple = simplify(exported.proto, exported.weights)
    bind(raw, weights)
    bind(simple, exported.weights)
    count = lambda proto, op: sum(n.op_type == op for n in proto.graph.node)  # noqa: E731
    assert count(simple, "MatMul") == count(raw, "MatMul") - 2 * ckpt.config.n_layers
    assert count(simple, "Reshape") < count(raw, "Reshape") and len(simple.graph.node) < len(raw.graph.node)
    feeds = step_feeds(ckpt.config, rows=6, sources=2, capacity=8, length=5)
    got, want = (run(ort.InferenceSession(p.SerializeToString()), feeds) for p in (simple, raw))
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def step_feeds(cfg, rows: int, sources: int, capacity: int, length: int) -> dict[str, np.ndarray]:
    """decoder_step_search's inputs: random filled positions, zeros beyond, a padded source."""
    from tfm_export.core.graph_spec import cache_names
    rng, names = np.random.default_rng(0), cache_names(cfg)
    mask = np.ones((sources, 7), np.int64)
    mask[-1, 4:] = 0
    feeds = {"input_ids": rng.integers(FIRST_TOKEN_ID, cfg.trg_vocab_size, (rows, 1)),
             "encoder_attention_mask": mask, "cache_length": np.array(length),
             "token_bias": np.zeros(cfg.trg_vocab_size, np.float32), "forced_token": np.array(-1)}
    for name in names.self_inputs:
        buffer = np.zeros((rows, cfg.n_head, capacity, cfg.d_k), np.float32)
        buffer[:, :, :length] = rng.standard_normal((rows, cfg.n_head, length, cfg.d_k))
        feeds[name] = buffer
    for name in names.cross_inputs:
        feeds[name] = rng.standard_normal((sources, cfg.n_head, 7, cfg.d_k)).astype(np.float32)
    return feeds


def test_an_onnx_runtime_too_old_for_the_fused_step_never_runs_it(models, monkeypatch):
    """onnxruntime 1.20 computes MultiHeadAttention's padded cross-attention wrongly: under it, translate decodes
    through decoder_step_search (and export leaves the fused graph out: the next test, in make test-slow)."""
    import onnxruntime

    from tfm_export.runtime.backends import open_backend
    from tfm_export.runtime.step_graph import FUSED
    directory = models["random"][1]
    assert FUSED.value in read_manifest(directory)["graphs"]
    monkeypatch.setattr(onnxruntime, "__version__", "1.20.1")
    backend = open_backend(directory).backend
    assert backend.decoder.get_modelmeta().custom_metadata_map["tfm_export.graph"] == SEARCH.value


@pytest.mark.slow
def test_an_onnx_runtime_too_old_for_the_fused_step_never_gets_it_exported(models, monkeypatch, tmp_path):
    import onnxruntime

    from tfm_export.runtime.step_graph import FUSED
    monkeypatch.setattr(onnxruntime, "__version__", "1.20.1")
    export_model_dir(models["random"][0], tmp_path / "model", progress=False)
    assert FUSED.value not in read_manifest(tmp_path / "model")["graphs"]
