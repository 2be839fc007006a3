"""The reference model against hand-computed values and an independent NumPy oracle of the seed."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from support.common import tiny_config
from support.seed_oracle import seed_forward, seed_settings, seed_state_dict

from tfm_export.core.config import ModelConfig
from tfm_export.core.errors import CheckpointError
from tfm_export.model.transformer import (
    MultiHeadAttention,
    Transformer,
    get_pad_mask,
    get_subsequent_mask,
    sinusoid_table,
)


def test_position_table_matches_hand_computed_values():
    table = sinusoid_table(200, 512)
    assert table.shape == (1, 200, 512)
    assert table[0, 0, 0] == 0.0 and table[0, 0, 1] == 1.0  # sin(0), cos(0)
    for pos, j in [(1, 0), (1, 1), (7, 10), (7, 11), (150, 300), (199, 511)]:
        angle = pos / 10000 ** (2 * (j // 2) / 512)
        expected = math.sin(angle) if j % 2 == 0 else math.cos(angle)
        assert table[0, pos, j].item() == pytest.approx(expected, abs=1e-7)


def test_masks_are_the_seeds():
    seq = torch.tensor([[2, 5, 3, 1, 1], [2, 3, 1, 1, 1]])
    assert get_pad_mask(seq, 1).tolist() == [[[True, True, True, False, False]], [[True, True, False, False, False]]]
    assert get_subsequent_mask(seq[:, :3]).int().tolist() == [[[1, 0, 0], [1, 1, 0], [1, 1, 1]]]


def _hand_attention(x, wq, wk, wv, wfc, ln_w, ln_b, n_head, d_k, d_v, mask):
    """Scalar loops, straight from the formulae: LN(x + fc(concat_h softmax(q k / sqrt(dk)) v))."""
    t = len(x)
    heads = []
    for h in range(n_head):
        q = [[sum(x[i][c] * wq[h * d_k + a][c] for c in range(len(x[i]))) for a in range(d_k)] for i in range(t)]
        k = [[sum(x[i][c] * wk[h * d_k + a][c] for c in range(len(x[i]))) for a in range(d_k)] for i in range(t)]
        v = [[sum(x[i][c] * wv[h * d_v + a][c] for c in range(len(x[i]))) for a in range(d_v)] for i in range(t)]
        out = []
        for i in range(t):
            s = [sum(q[i][a] / math.sqrt(d_k) * k[j][a] for a in range(d_k)) if mask[i][j] else -1e9 for j in range(t)]
            e = [math.exp(z - max(s)) for z in s]
            p = [z / sum(e) for z in e]
            out.append([sum(p[j] * v[j][a] for j in range(t)) for a in range(d_v)])
        heads.append(out)
    concat = [[val for h in range(n_head) for val in heads[h][i]] for i in range(t)]
    result = []
    for i in range(t):
        y = [x[i][c] + sum(concat[i][a] * wfc[c][a] for a in range(len(concat[i]))) for c in range(len(x[i]))]
        mu = sum(y) / len(y)
        var = sum((z - mu) ** 2 for z in y) / len(y)
        result.append([(z - mu) / math.sqrt(var + 1e-6) * ln_w[c] + ln_b[c] for c, z in enumerate(y)])
    return result


def test_attention_matches_hand_computation_with_mask():
    torch.manual_seed(3)
    mha = MultiHeadAttention(n_head=2, d_model=4, d_k=3, d_v=2, dropout=0.0).eval()
    with torch.no_grad():
        mha.layer_norm.weight.uniform_(0.5, 1.5)
        mha.layer_norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(1, 3, 4)
    mask = torch.tensor([[[1, 1, 0], [1, 1, 0], [1, 1, 0]]])  # third key is padding
    got, attn = mha(x, x, x, mask=mask)
    expected = _hand_attention(x[0].tolist(), mha.w_qs.weight.tolist(), mha.w_ks.weight.tolist(),
                               mha.w_vs.weight.tolist(), mha.fc.weight.tolist(), mha.layer_norm.weight.tolist(),
                               mha.layer_norm.bias.tolist(), 2, 3, 2, mask[0].tolist())
    assert torch.allclose(got[0], torch.tensor(expected), atol=1e-5)
    assert (attn[..., 2] == 0).all()  # the masked key gets exactly no weight


@pytest.mark.parametrize("overrides", [
    dict(),  # shared everything, 'prj'
    dict(scale_emb_or_prj="emb"),
    dict(scale_emb_or_prj="none"),
    dict(embs_share_weight=False, src_vocab_size=9, trg_vocab_size=12),  # split vocabularies
    dict(proj_share_weight=False, embs_share_weight=False, scale_emb_or_prj="emb"),  # scaling off when unshared
    dict(proj_share_weight=False, embs_share_weight=False, scale_emb_or_prj="prj"),  # the seed's default flags
    dict(d_k=5, d_v=3, n_head=3),  # n_head * d_k != d_model
])
def test_model_equals_numpy_oracle_of_seed(overrides):
    opt = seed_settings(**overrides)
    state = seed_state_dict(opt)
    model = Transformer(ModelConfig.from_seed_settings(opt)).eval()
    model.load_state_dict(state)
    src = np.array([[2, 5, 6, 7, 3], [2, 8, 3, 1, 1]])
    trg = np.array([[2, 4, 9, 5], [2, 6, 1, 1]])
    with torch.no_grad():
        got = model(torch.from_numpy(src), torch.from_numpy(trg)).double().numpy()
    expected = seed_forward(state, opt, src, trg)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)


def test_decoder_is_causal_and_ignores_source_padding(tiny_model):
    src = torch.tensor([[2, 5, 6, 3]])
    trg = torch.tensor([[2, 7, 8, 9]])
    with torch.no_grad():
        base = tiny_model(src, trg)
        changed_future = tiny_model(src, torch.tensor([[2, 7, 11, 12]]))
        padded_src = tiny_model(torch.tensor([[2, 5, 6, 3, 1, 1]]), trg)
    assert torch.allclose(base[:, :2], changed_future[:, :2], atol=1e-6)
    assert not torch.allclose(base[:, 2:], changed_future[:, 2:], atol=1e-3)
    assert torch.allclose(base, padded_src, atol=1e-5)


def test_weight_sharing_ties_parameters_and_keeps_seed_names():
    model = Transformer(tiny_config())
    assert model.trg_word_prj.weight is model.decoder.trg_word_emb.weight is model.encoder.src_word_emb.weight
    names = model.state_dict().keys()
    for name in ["encoder.src_word_emb.weight", "decoder.trg_word_emb.weight", "trg_word_prj.weight",
                 "encoder.position_enc.pos_table", "decoder.layer_stack.1.enc_attn.fc.weight",
                 "decoder.layer_stack.0.pos_ffn.w_1.bias", "encoder.layer_norm.weight"]:
        assert name in names


def test_config_round_trips_through_json():
    cfg = tiny_config(scale_emb_or_prj="emb", d_k=5)
    assert ModelConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize("bad, message", [
    (dict(scale_emb_or_prj="both"), "scale_emb_or_prj"),
    (dict(src_vocab_size=9), "embs_share_weight needs"),
    (dict(n_head=0), "n_head must be a whole number in 1.."),
])
def test_config_rejects_impossible_settings(bad, message):
    with pytest.raises(CheckpointError, match=message):
        tiny_config(**bad)
