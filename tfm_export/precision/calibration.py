"""Calibration traces: the fp32 model's own decode loop over real texts, every graph input recorded.

int8 activation ranges must come from the tensors the graphs really see: the encoder on real
sentences, and the decoder step at every position with the cache it built itself. Random tensors
would calibrate the wrong ranges (the cache's, the logits'), so this runs greedy decoding on the fp32
graphs and keeps each call's inputs. It sits after the runtime in the data flow, as `verify` does.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tqdm import tqdm

from ..core.batching import length_buckets, pad_batch
from ..core.errors import TfmExportError
from ..core.graph_spec import CONTRACT_GRAPHS, Graph, GraphSpec
from ..core.sources import encode_lines, source_ids
from ..core.tokenizer import UNK_ID, TextTokenizer
from ..runtime import decoding
from ..runtime.backends import CONCAT, open_backend, open_graph
from ..runtime.session import SessionOptions

MAX_FEEDS = 128  # per graph; a base model's decoder feeds (the whole cache) are ~10 MB each
MAX_UNKNOWN_RATE = 0.5  # above this, the texts are probably not in the model's source language
log = logging.getLogger(__name__)


class CalibrationError(TfmExportError):
    """Calibration texts that cannot calibrate this model."""


@dataclass
class Traces:
    """Graph inputs recorded while decoding: a uniform sample of at most `max_feeds` calls per graph
    (reservoir sampling, seeded), so memory stays bounded however many texts are given."""

    max_feeds: int = MAX_FEEDS
    feeds: dict[Graph, list[dict[str, np.ndarray]]] = field(default_factory=lambda: {g: [] for g in CONTRACT_GRAPHS})
    calls: dict[Graph, int] = field(default_factory=lambda: {g: 0 for g in CONTRACT_GRAPHS})
    sentences: int = 0
    unknown_rate: float = 0.0
    _rng: random.Random = field(default_factory=lambda: random.Random(0), repr=False)

    def add(self, graph: Graph, feeds: dict[str, np.ndarray]) -> None:
        self.calls[graph] += 1
        kept = self.feeds[graph]
        if len(kept) < self.max_feeds:
            kept.append({name: np.array(value) for name, value in feeds.items()})
            return
        slot = self._rng.randrange(self.calls[graph])
        if slot < self.max_feeds:
            kept[slot] = {name: np.array(value) for name, value in feeds.items()}


class RecordingSession:
    """An ONNX Runtime session that keeps what every call was fed (through `traces`), for one graph. The feeds
    are copied when kept: the decoding loop reorders the cache arrays in place afterwards."""

    def __init__(self, session: ort.InferenceSession, graph: Graph, traces: Traces) -> None:
        self.session, self.graph, self.traces = session, graph, traces

    def get_inputs(self):
        return self.session.get_inputs()

    def get_outputs(self):
        return self.session.get_outputs()

    def run(self, names, feeds: dict[str, np.ndarray]):
        self.traces.add(self.graph, feeds)
        return self.session.run(names, feeds)


def recording(traces: Traces):
    """A session loader (like runtime.backends.open_graph) whose sessions record every call's inputs into `traces`."""
    def load(path: Path, spec: GraphSpec, options: SessionOptions, so: ort.SessionOptions | None) -> RecordingSession:
        return RecordingSession(open_graph(path, spec, options, so), spec.graph, traces)
    return load


def calibration_sources(texts: Sequence[str], tokenizer: TextTokenizer, max_positions: int,
                        name: str) -> tuple[list[list[int]], float]:
    """<s> ids </s> per non-blank line (cut to the model's positions), and the share of unknown tokens."""
    rows = list(encode_lines(tokenizer, texts, max_positions, truncate=True).values())
    if not rows:
        raise CalibrationError(f"{name}: has no non-empty lines; give sentences in the model's source language, "
                               "one per line (see calibration/README.md)")
    return rows, _unknown_rate(rows)


def _unknown_rate(rows: Sequence[Sequence[int]]) -> float:
    words = [i for row in rows for i in row[1:-1]]
    return sum(i == UNK_ID for i in words) / max(1, len(words))


def language_warning(texts: Sequence[str], source: TextTokenizer, target: TextTokenizer | None,
                     unknown: float) -> str | None:
    """Why these texts look like the wrong language, if they do. Only vocabularies can tell: with a shared
    vocabulary (or subwords that never produce <unk>) target-language text goes unnoticed."""
    if unknown > MAX_UNKNOWN_RATE:
        return f"{100 * unknown:.0f}% of its tokens are unknown to the model's source vocabulary"
    if target is not None and target is not source:
        as_target = _unknown_rate([source_ids(target, t) for t in texts if t.strip()])
        if as_target < unknown / 2:
            return (f"{100 * unknown:.0f}% of its tokens are unknown to the source vocabulary but only "
                    f"{100 * as_target:.0f}% to the target one: it looks like target-language text")
    return None


def record_traces(directory: Path, texts: Sequence[str], tokenizer: TextTokenizer, name: str,
                  batch_size: int = 8, max_length: int | None = None, max_feeds: int = MAX_FEEDS,
                  target: TextTokenizer | None = None, consequence: str = "the int8 ranges will be wrong",
                  progress: bool = False) -> Traces:
    """Greedy-decode `texts` on a directory's fp32 graphs (the contract's encoder and decoder_step) and record every
    encoder and decoder_step input."""
    traces = Traces(max_feeds)
    opened = open_backend(directory, CONCAT, loader=recording(traces))
    cfg = opened.config
    rows, unknown = calibration_sources(texts, tokenizer, cfg.n_position, name)
    problem = language_warning(texts, tokenizer, target, unknown)
    if problem:
        log.warning("%s: %s; these texts are probably not in the model's source language, and %s. Use texts "
                    "like the training data (calibration/README.md).", name, problem, consequence)
    traces.sentences, traces.unknown_rate = len(rows), unknown
    with tqdm(total=len(rows), desc="calibration", unit="sentence", disable=not progress, leave=False) as bar:
        for bucket in length_buckets([len(r) for r in rows], batch_size):
            src = pad_batch([rows[i] for i in bucket], cfg.src_pad_idx)
            decoding.greedy(opened.backend, src, max_length or cfg.n_position)
            bar.update(len(bucket))
    return traces
