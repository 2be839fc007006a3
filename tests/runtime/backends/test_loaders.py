"""How a graph becomes a session (runtime/backends/loaders.py): the contract's two sessions, which verify compares
graph by graph instead of searching, held to PyTorch's full forward."""

from __future__ import annotations

import numpy as np
import torch

from tfm_export.artifacts.model_dir import ModelDir
from tfm_export.core.graph_spec import (
    ATTENTION_MASK,
    ENCODER_ATTENTION_MASK,
    INPUT_IDS,
    LAST_HIDDEN_STATE,
    LOGITS,
    Graph,
    cache_head_sizes,
    cache_names,
)
from tfm_export.core.tokenizer import BOS_ID, EOS_ID
from tfm_export.runtime.backends.loaders import open_contract_sessions
from tfm_export.runtime.session import DEFAULT_OPTIONS


def test_the_contract_sessions_compute_what_pytorch_does(flat):
    """open_contract_sessions' encoder and first decoder step against the PyTorch model's full forward."""
    ckpt, model = flat
    sessions, _shared = open_contract_sessions(ModelDir.read(model), DEFAULT_OPTIONS)  # held while they run
    assert set(sessions) == {Graph.ENCODER, Graph.DECODER_STEP}
    pad = ckpt.config.src_pad_idx
    src = np.array([[BOS_ID, 5, 9, 7, EOS_ID], [BOS_ID, 6, 4, EOS_ID, pad]], np.int64)
    mask = (src != pad).astype(np.int64)
    encoder, step = sessions[Graph.ENCODER], sessions[Graph.DECODER_STEP]
    outputs = dict(zip([o.name for o in encoder.get_outputs()],
                       encoder.run(None, {INPUT_IDS: src, ATTENTION_MASK: mask}), strict=True))
    with torch.no_grad():
        enc, _ = ckpt.model.encode(torch.from_numpy(src))
        logits = ckpt.model(torch.from_numpy(src), torch.full((2, 1), BOS_ID)).numpy()
    real = mask.astype(bool)
    np.testing.assert_allclose(outputs[LAST_HIDDEN_STATE][real], enc.numpy()[real], atol=1e-5)
    cfg, names = ckpt.config, cache_names(ckpt.config)
    feeds = {name: np.zeros((2, cfg.n_head, 0, size), np.float32)
             for name, size in zip(names.self_inputs, cache_head_sizes(cfg), strict=True)}
    feeds |= {past: outputs[present] for past, present in zip(names.cross_inputs, names.cross_outputs, strict=True)}
    got = step.run([LOGITS], {**feeds, INPUT_IDS: np.full((2, 1), BOS_ID, np.int64), ENCODER_ATTENTION_MASK: mask})
    np.testing.assert_allclose(got[0], logits, atol=1e-5)
