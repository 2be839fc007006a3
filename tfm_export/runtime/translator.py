"""Text in, text out: tokenize, bucket by length, search, detokenize, restore order.

`Translator.load` opens what it is given through the one door (runtime.backends.open_backend): an exported model
directory runs on ONNX Runtime, an engine directory on TensorRT, a checkpoint file on PyTorch. The search is the
opened model's Searcher (runtime.search), called once per batch.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.batching import length_buckets, pad_batch
from ..core.config import ModelConfig
from ..core.errors import InputTextError
from ..core.hypothesis import Hypothesis
from ..core.languages import CLI_NAMES, choose_languages
from ..core.sources import check_source_length, encode_lines
from ..core.token_rules import SEED_RULES, TokenRules
from ..core.tokenizer import Vocabulary
from .backends import Opened, open_backend
from .search import Searcher, SearchOptions
from .session import DEFAULT_OPTIONS, SessionOptions
from .step_graph import DEFAULT_STEP, StepOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Alternative:
    """One of an input's n best hypotheses."""

    text: str
    score: float  # what the hypotheses are ranked by: log_prob / length ** length_penalty (length: </s> included)
    log_prob: float  # summed log-probability


# Where the beams finished fewer distinct hypotheses than n_best, the list is filled up with this, keeping exactly
# n_best entries per input (a hypothesis scores a finite log-probability, so -inf marks these alone).
NO_HYPOTHESIS = Alternative("", -math.inf, -math.inf)


@dataclass(frozen=True)
class Translation:
    text: str
    ids: tuple[int, ...]  # generated target ids, without <s> and </s>
    tokens: tuple[str, ...]
    score: float  # summed log-probability
    time_ms: float  # its batch's decode time divided by the batch size (not this sentence's own latency)
    n_best: tuple[Alternative, ...] = ()  # exactly DecodeOptions.n_best entries, best first, NO_HYPOTHESIS last
    truncated: bool = False  # cut by the length limit (--max-length or the model's) before </s>

    @property
    def n_best_count(self) -> int:
        """How many of the n_best entries are hypotheses (the rest are NO_HYPOTHESIS)."""
        return sum(a.score > -math.inf for a in self.n_best)


MAX_BEAM = 64
LENGTH_PENALTY_RANGE = (-10.0, 10.0)  # score / length ** penalty: beyond this every ranking is degenerate


@dataclass(frozen=True)
class DecodeOptions:
    beam_size: int | None = None  # 1 = greedy; None = the model's default (its generation config's, else 1)
    length_penalty: float | None = None  # None = the model's default (its generation config's, else 1.0)
    max_length: int | None = None  # generated tokens; None = the model's positions
    batch_size: int = 32
    truncate: bool = False  # cut over-long sources (with a warning) instead of failing
    n_best: int = 1  # hypotheses kept per input (<= beam_size)


class Translator:
    """Translate sentences with any Searcher."""

    def __init__(self, searcher: Searcher, vocab: Vocabulary, config: ModelConfig,
                 limits: dict[str, int] | None = None, rules: TokenRules = SEED_RULES) -> None:
        """limits: what engines were built for (max_batch rows, max_source_length, max_target_length);
        without them the model's positions bound both lengths and rows are unbounded. rules: the model's ids and
        default length (a pretrained model's generation config)."""
        self.searcher, self.vocab, self.config, self.rules = searcher, vocab, config, rules
        limits = limits or {}
        self.max_rows = limits.get("max_batch")
        self.max_source = min(config.n_position, limits.get("max_source_length", config.n_position))
        self.max_target = min(config.n_position, limits.get("max_target_length", config.n_position))

    @classmethod
    def load(cls, model: str | Path, vocab: Sequence[Path] = (), backend: str | None = None,
             session_options: SessionOptions = DEFAULT_OPTIONS, step: StepOptions = DEFAULT_STEP) -> Translator:
        """A model directory (ONNX Runtime), an engine directory (TensorRT) or a checkpoint (PyTorch), opened by
        runtime.backends on session_options.device (default: the GPU for TensorRT, the CPU otherwise)."""
        return cls.of(open_backend(model, backend, session_options, vocab, step=step))

    @classmethod
    def of(cls, opened: Opened) -> Translator:
        """The Translator of what open_backend opened: its tokenizers, token rules, languages and generation
        defaults, as tfm-run reads them (the Triton models too)."""
        return cls(opened.searcher, opened.vocab, opened.config, opened.limits, opened.rules)

    def bounded(self, max_rows: int) -> Translator:
        """This translator decoding at most `max_rows` rows (sentences x beams) at a time (a server's batch)."""
        chosen = copy.copy(self)
        chosen.max_rows = max_rows if self.max_rows is None else min(self.max_rows, max_rows)
        return chosen

    def with_languages(self, source: str | None = None, target: str | None = None,
                       names: tuple[str, str] = CLI_NAMES) -> Translator:
        """This translator from language code `source` into `target` (None: as the model directory says); a
        multilingual model that names no target language needs one (core.languages; `names` name the two in
        errors)."""
        chosen = copy.copy(self)
        chosen.vocab, chosen.rules = choose_languages(self.vocab, self.rules, source, target, names)
        return chosen

    def translate(self, texts: Sequence[str], options: DecodeOptions = DecodeOptions(),
                  progress: Callable[[int], None] | None = None) -> list[Translation]:
        """Translations in input order; empty lines give empty translations without touching the model."""
        options = self.with_defaults(options)
        results: dict[int, Translation] = {}
        for batch in self._batches(texts, options, self._check(options)):
            results.update(batch)
            if progress:
                progress(len(batch))
        return [results[i] for i in range(len(texts))]

    def translate_stream(self, chunks: Iterable[Sequence[str]], options: DecodeOptions = DecodeOptions(),
                         progress: Callable[[int], None] | None = None) -> Iterator[list[tuple[str, Translation]]]:
        """(source, translation) pairs in input order, given out as soon as every line before them is done:
        each chunk (the lines that have arrived) is bucketed by length and decoded batch by batch, so the
        first translations come out after the batch that holds them, not after the whole input."""
        options = self.with_defaults(options)
        batch_size = self._check(options)
        first = 0  # index of the chunk's first line in the whole input
        for texts in chunks:
            done: dict[int, Translation] = {}
            given = 0
            for batch in self._batches(texts, options, batch_size, first):
                done.update(batch)
                if progress:
                    progress(len(batch))
                ready = given
                while ready in done:
                    ready += 1
                if ready > given:
                    yield [(texts[i], done.pop(i)) for i in range(given, ready)]
                    given = ready
            first += len(texts)

    def translate_ids(self, sources: Sequence[Sequence[int]], options: DecodeOptions = DecodeOptions()
                      ) -> list[list[Hypothesis]]:
        """Source ids as the encoder takes them (with their framing, as `encode(text, framed=True)` gives them) ->
        each one's n_best hypotheses, best first, ranked under the options' length penalty: the search `translate`
        runs, for callers with their own tokenizer (an app's, or the C++ example's --ids mode held to this)."""
        options = self.with_defaults(options)
        batch_size = self._check(options)
        for index, ids in enumerate(sources):
            if not ids:
                raise InputTextError(f"source {index + 1}: no ids (a source has at least its framing)")
            check_source_length(len(ids), self.max_source)
        found: dict[int, list[Hypothesis]] = {}
        for bucket in length_buckets([len(ids) for ids in sources], batch_size):
            nbests = self._decode(pad_batch([sources[i] for i in bucket], self.config.src_pad_idx), options)
            for index, nbest in zip(bucket, nbests, strict=True):
                found[index] = [dataclasses.replace(h, length_penalty=options.length_penalty)
                                for h in nbest[:options.n_best]]
        return [found[i] for i in range(len(sources))]

    def _batches(self, texts: Sequence[str], options: DecodeOptions, batch_size: int,
                 first: int = 0) -> Iterator[dict[int, Translation]]:
        """Translations by index, a batch at a time: the empty lines first (without touching the model), then
        the others bucketed by length. `first`: the index of texts[0] in the whole input (for messages)."""
        sources = encode_lines(self.vocab.source, texts, self.max_source, truncate=options.truncate,
                               first=first + 1)
        empty = Translation("", (), (), 0.0, 0.0, _filled([Alternative("", 0.0, 0.0)], options.n_best))
        if len(sources) < len(texts):
            yield {i: empty for i in range(len(texts)) if i not in sources}
        keys = list(sources)
        for bucket in length_buckets([len(sources[k]) for k in keys], batch_size):
            batch = [keys[i] for i in bucket]
            start = time.perf_counter()
            nbests = self._decode(pad_batch([sources[k] for k in batch], self.config.src_pad_idx), options)
            per_sentence = 1000 * (time.perf_counter() - start) / len(batch)
            yield {key: self._result(nbest, per_sentence, options) for key, nbest in zip(batch, nbests, strict=True)}

    def with_defaults(self, options: DecodeOptions) -> DecodeOptions:
        """`options` with the model's beam size and length penalty where they say None."""
        beam = self.rules.num_beams if options.beam_size is None else options.beam_size
        penalty = self.rules.length_penalty if options.length_penalty is None else options.length_penalty
        return dataclasses.replace(options, beam_size=beam, length_penalty=penalty)

    def _check(self, options: DecodeOptions) -> int:
        """Options that cannot work, before any line is decoded; returns the sentences per batch (engines
        take at most max_rows rows, sentences x beams)."""
        limit = self.max_target
        low, high = LENGTH_PENALTY_RANGE
        if not low <= options.length_penalty <= high:  # NaN fails this too
            raise InputTextError(f"--length-penalty {options.length_penalty} is outside {low:g}..{high:g}")
        if not 1 <= options.beam_size <= MAX_BEAM or options.batch_size < 1:
            raise InputTextError(f"--beam-size must be 1..{MAX_BEAM} and --batch-size at least 1")
        if options.max_length is not None and not 1 <= options.max_length <= limit:
            what = "the engines' --max-target-length" if limit < self.config.n_position else "the model's positions"
            raise InputTextError(f"--max-length {options.max_length} is outside 1..{limit} ({what})")
        if not 1 <= options.n_best <= options.beam_size:
            raise InputTextError(f"--n-best {options.n_best} needs --beam-size >= {options.n_best}")
        if self.max_rows is None:
            return options.batch_size
        if options.beam_size > self.max_rows:
            raise InputTextError(f"--beam-size {options.beam_size} exceeds the engines' --max-batch {self.max_rows} "
                                 "rows; lower it or rebuild the engines with a larger --max-batch")
        return min(options.batch_size, self.max_rows // options.beam_size)

    def _decode(self, src: np.ndarray, options: DecodeOptions) -> list[list[Hypothesis]]:
        max_length = options.max_length or min(self.rules.max_new_tokens or self.max_target, self.max_target)
        return self.searcher.search(src, SearchOptions(max_length, options.beam_size, options.length_penalty,
                                                       options.n_best), self.rules)

    def _result(self, nbest: list[Hypothesis], time_ms: float, options: DecodeOptions) -> Translation:
        target, best = self.vocab.target, nbest[0]
        tokens = tuple(target.tokenizer.id_to_token(i) for i in best.tokens)
        ranked = [dataclasses.replace(h, length_penalty=options.length_penalty) for h in nbest[:options.n_best]]
        alternatives = [Alternative(target.decode(h.tokens), h.normalized_score, h.score) for h in ranked]
        return Translation(target.decode(best.tokens), best.tokens, tokens, best.score, time_ms,
                           _filled(alternatives, options.n_best), truncated=not best.finished)


def _filled(alternatives: list[Alternative], n_best: int) -> tuple[Alternative, ...]:
    return (*alternatives, *[NO_HYPOTHESIS] * (n_best - len(alternatives)))
