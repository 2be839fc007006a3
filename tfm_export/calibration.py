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

import numpy as np
import onnxruntime as ort

from . import decoding
from .batching import length_buckets, pad_batch
from .errors import TfmExportError
from .graph_spec import Graph
from .ort_backend import OrtBackend
from .tokenizer import BOS_ID, EOS_ID, UNK_ID, TextTokenizer

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
    feeds: dict[Graph, list[dict[str, np.ndarray]]] = field(default_factory=lambda: {g: [] for g in Graph})
    calls: dict[Graph, int] = field(default_factory=lambda: {g: 0 for g in Graph})
    sentences: int = 0
    unknown_rate: float = 0.0
    _rng: random.Random = field(default_factory=lambda: random.Random(0), repr=False)

    def add(self, graph: Graph, feeds: dict[str, np.ndarray]) -> None:
        self.calls[graph] += 1
        kept = self.feeds[graph]
        if len(kept) < self.max_feeds:
            kept.append(dict(feeds))
            return
        slot = self._rng.randrange(self.calls[graph])
        if slot < self.max_feeds:
            kept[slot] = dict(feeds)


class RecordingBackend(OrtBackend):
    """An OrtBackend that keeps a copy of what every session call was fed."""

    def __init__(self, base: OrtBackend, traces: Traces) -> None:
        super().__init__(base.encoder, base.decoder, base.config, base.manifest)
        self.traces = traces
        self._graphs = {id(base.encoder): Graph.ENCODER, id(base.decoder): Graph.DECODER_STEP}

    def _run(self, session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.traces.add(self._graphs[id(session)], feeds)
        return super()._run(session, feeds)


def calibration_sources(texts: Sequence[str], tokenizer: TextTokenizer, max_positions: int,
                        name: str) -> tuple[list[list[int]], float]:
    """<s> ids </s> per non-blank line (cut to the model's positions), and the share of unknown tokens."""
    rows = [[BOS_ID, *tokenizer.encode(t)[:max_positions - 2], EOS_ID] for t in texts if t.strip()]
    if not rows:
        raise CalibrationError(f"{name}: has no non-empty lines; give sentences in the model's source language, "
                               "one per line (see calibration/README.md)")
    words = [i for row in rows for i in row[1:-1]]
    unknown = sum(i == UNK_ID for i in words) / max(1, len(words))
    return rows, unknown


def record_traces(backend: OrtBackend, texts: Sequence[str], tokenizer: TextTokenizer, name: str,
                  batch_size: int = 8, max_length: int | None = None, max_feeds: int = MAX_FEEDS) -> Traces:
    """Greedy-decode `texts` on the fp32 graphs and record every encoder and decoder_step input."""
    cfg = backend.config
    rows, unknown = calibration_sources(texts, tokenizer, cfg.n_position, name)
    if unknown > MAX_UNKNOWN_RATE:
        log.warning("%s: %.0f%% of its tokens are unknown to the model's source vocabulary; these texts are "
                    "probably not in the model's source language, and the int8 ranges will be wrong. Use texts "
                    "like the training data (calibration/README.md).", name, 100 * unknown)
    traces = Traces(max_feeds, sentences=len(rows), unknown_rate=unknown)
    recorder = RecordingBackend(backend, traces)
    for bucket in length_buckets([len(r) for r in rows], batch_size):
        decoding.greedy(recorder, pad_batch([rows[i] for i in bucket]), max_length or cfg.n_position)
    return traces
