"""Text in, text out over the reference PyTorch decoders: source wrapping, length checks, batching.

Empty lines translate to empty lines without touching the model; a line longer than the model's
positions is an error naming the line (or is cut, with a warning, when asked).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .batching import length_buckets, pad_batch
from .checkpoint import Checkpoint
from .errors import InputTextError
from .reference_decoding import Hypothesis, beam_search, greedy_decode
from .tokenizer import BOS_ID, EOS_ID, TextTokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Translation:
    text: str
    tokens: tuple[int, ...]
    score: float


@dataclass(frozen=True)
class DecodeOptions:
    beam_size: int = 1  # 1 = greedy
    length_penalty: float = 1.0
    max_length: int | None = None  # generated tokens; None = the model's positions
    batch_size: int = 32
    truncate: bool = False  # cut over-long sources instead of failing


def source_ids(tok: TextTokenizer, text: str, n_position: int, line: int, truncate: bool) -> list[int]:
    """[<s>] + tokens + [</s>], checked against the model's positions."""
    ids = [BOS_ID, *tok.encode(text), EOS_ID]
    if len(ids) <= n_position:
        return ids
    if not truncate:
        raise InputTextError(f"line {line}: {len(ids)} tokens with <s> and </s>, but the model takes at most "
                             f"{n_position}; shorten or split it, or pass --truncate")
    log.warning("line %d: cut from %d to %d tokens to fit the model's positions", line, len(ids), n_position)
    return [*ids[:n_position - 1], EOS_ID]


def translate_texts(ckpt: Checkpoint, texts: Sequence[str],
                    options: DecodeOptions = DecodeOptions()) -> list[Translation]:
    """Translations in input order."""
    n_position = ckpt.config.n_position
    sources = {i: source_ids(ckpt.vocab.source, t, n_position, i + 1, options.truncate)
               for i, t in enumerate(texts) if t.strip()}
    results = {i: Translation("", (), 0.0) for i in range(len(texts)) if i not in sources}
    keys = list(sources)
    for bucket in length_buckets([len(sources[k]) for k in keys], options.batch_size):
        batch = [keys[i] for i in bucket]
        hyps = _decode(ckpt, pad_batch([sources[k] for k in batch]), options)
        for key, hyp in zip(batch, hyps, strict=True):
            results[key] = Translation(ckpt.vocab.target.decode(hyp.tokens), hyp.tokens, hyp.score)
    return [results[i] for i in range(len(texts))]


def _decode(ckpt: Checkpoint, src: torch.Tensor, options: DecodeOptions) -> list[Hypothesis]:
    if options.beam_size == 1:
        return greedy_decode(ckpt.model, src, options.max_length)
    return [nbest[0] for nbest in beam_search(ckpt.model, src, options.beam_size, options.max_length,
                                              options.length_penalty)]
