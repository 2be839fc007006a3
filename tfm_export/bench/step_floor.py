"""How fast a whole decoder step is in ONNX Runtime on this machine: decoder_step_search (what tfm-run runs on the
CPU: the cache written in place, the search's reduction inside) alone, with no loop around it, timed at its best
over thread counts and spinning. Where the step 1.25x CTranslate2 allows takes less than this, no loop around
this graph meets the target; what the loop adds on top is the Python between steps."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from torch import nn

from ..core.errors import TfmExportError, first_line
from ..core.graph_spec import (
    CACHE_LENGTH,
    DEFAULT_OPSET,
    ENCODER_ATTENTION_MASK,
    FORCED_TOKEN,
    INPUT_IDS,
    TOKEN_BIAS,
    Graph,
    cache_head_sizes,
    cache_names,
)
from ..core.graph_spec import search_step_spec as spec_of
from ..graphs.export import export_bound
from ..graphs.onnx_io import save_graph
from ..runtime.session import SessionOptions, has_cuda_provider
from .kernel_floor import best_run_ms

GRAPH = Graph.DECODER_STEP_SEARCH
REPLAY = "CUDA graph replay"


def step_inputs(model: nn.Module, batch: int, beam: int, cache_length: int,
                source_length: int) -> dict[str, np.ndarray]:
    """decoder_step_search's inputs for `batch` sources of `beam` rows each after `cache_length` tokens: random
    keys/values (their values do not change the time) in buffers with room for the new token."""
    cfg, rng, rows, names = model.config, np.random.default_rng(0), batch * beam, cache_names(model.config)
    cache_length = min(cache_length, cfg.n_position - 1)
    feeds = {INPUT_IDS: np.full((rows, 1), 4, np.int64),
             ENCODER_ATTENTION_MASK: np.ones((batch, source_length), np.int64),
             CACHE_LENGTH: np.array(cache_length, np.int64),
             TOKEN_BIAS: np.zeros(cfg.trg_vocab_size, np.float32), FORCED_TOKEN: np.array(-1, np.int64)}
    for cached, count, length in ((names.self_inputs, rows, cache_length + 1), (names.cross_inputs, batch,
                                                                                 source_length)):
        for name, size in zip(cached, cache_head_sizes(cfg), strict=True):
            feeds[name] = rng.standard_normal((count, cfg.n_head, length, size), dtype=np.float32)
    return feeds


@contextlib.contextmanager
def exported_step(model: nn.Module) -> Iterator[Path]:
    """The model's decoder_step_search in a temporary file: exported once, for every cell timed on it."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / GRAPH.filename
        save_graph(export_bound(model.eval(), spec_of(model.config), DEFAULT_OPSET), path)
        yield path


def step_floor_ms(graph: Path, model: nn.Module, batch: int, beam: int, cache_length: int, source_length: int,
                  threads: int = 0, device: str = "cpu") -> dict[str, float]:
    """Best step time (ms) of decoder_step_search (`graph`, from exported_step) for `batch` sources x `beam` rows
    after `cache_length` cached tokens, per setting: on the CPU `threads` intra-op threads and one, each spinning
    within the run and sleeping; on a GPU ("cuda") the one setting, every tensor in its memory."""
    feeds = step_inputs(model, batch, beam, cache_length, source_length)
    names = cache_names(model.config)
    present = dict(zip(names.self_inputs, names.self_outputs, strict=True)).get  # each buffer, written in place
    if device == "cuda":
        return {"CUDA": best_run_ms(graph, feeds, SessionOptions(device="cuda"), present)}
    best = {}
    for count in dict.fromkeys((threads, 1)):
        for spinning in (True, False):
            label = f"{count or 'all'} thread{'s' if count != 1 else ''}, {'spinning' if spinning else 'sleeping'}"
            options = SessionOptions(intra_op_threads=count, spinning=spinning, memory_arena=False)  # as tfm-run
            best[label] = best_run_ms(graph, feeds, options, present)
    return best


def graph_unavailable() -> str | None:
    """Why the step cannot be captured as a CUDA graph here, or None."""
    return None if has_cuda_provider() else "CUDA graphs need ONNX Runtime's CUDA provider, which this one lacks"


def replay_ms(graph: Path, model: nn.Module, batch: int, beam: int, cache_length: int, source_length: int) -> float:
    """Best replay time (ms) of the step (as step_floor_ms times it on a GPU) captured once as a CUDA graph: the
    step with no launch cost, what a captured decode's step approaches. Raises, saying why, where it cannot be
    captured (no CUDA provider; a node off the CUDA provider, a Memcpy or a kernel that cannot be captured)."""
    why = graph_unavailable()
    if why:
        raise TfmExportError(why)
    names = cache_names(model.config)
    present = dict(zip(names.self_inputs, names.self_outputs, strict=True)).get
    feeds = step_inputs(model, batch, beam, cache_length, source_length)
    try:
        return best_run_ms(graph, feeds, SessionOptions(device="cuda", cuda_graphs=True), present,
                           captured=True)
    except TfmExportError:
        raise
    except Exception as exc:  # onnxruntime's own types: a capture that failed
        raise TfmExportError(f"the step could not be captured ({first_line(exc)})") from None
