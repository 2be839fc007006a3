"""Triton requests as the Translator takes them, and back: no Triton import here, so this is plain, testable code.

Each request is checked on its own (its text, its parameters, its lengths), so a bad one fails alone with a
message that says what to change; the good ones of a batch are grouped by decoding options and translated
together, one Translator call per group (which buckets them by length and bounds the rows per decode).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core.errors import InputTextError, TfmExportError
from ..core.sources import encode_lines
from ..runtime.translator import DecodeOptions, Translation, Translator
from .contract import TEXT

# Request parameters (the inference request's "parameters" object) and the Python types each one takes.
PARAMETERS = {"beam_size": (int,), "max_length": (int,), "length_penalty": (int, float), "n_best": (int,)}


@dataclass(frozen=True)
class TextRequest:
    """One request, checked: its sentences and how to decode them."""

    texts: tuple[str, ...]
    options: DecodeOptions


def decode_texts(raw: np.ndarray) -> tuple[str, ...]:
    """The TEXT tensor's elements as strings; an empty or non-UTF-8 element is an error that names it."""
    texts = []
    for index, value in enumerate(raw.reshape(-1), 1):
        try:
            text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
        except UnicodeDecodeError as exc:
            raise InputTextError(f"{TEXT} element {index} is not valid UTF-8 (byte {exc.start}); send UTF-8 "
                                 "text") from None
        if not text.strip():
            raise InputTextError(f"{TEXT} element {index} is empty; send the sentence to translate")
        texts.append(text)
    if not texts:
        raise InputTextError(f"{TEXT} has no elements; send at least one sentence")
    return tuple(texts)


def decode_options(parameters: str | dict, max_rows: int, max_length: int) -> DecodeOptions:
    """Request parameters -> DecodeOptions. beam_size is bounded by the rows one execution takes (the
    repository's --max-batch), max_length by the target positions; unknown names are refused, not ignored."""
    given = json.loads(parameters or "{}") if isinstance(parameters, str) else dict(parameters)
    unknown = sorted(set(given) - set(PARAMETERS))
    if unknown:
        raise InputTextError(f"unknown request parameter(s) {', '.join(unknown)}; this model takes "
                             f"{', '.join(PARAMETERS)}")
    for name, value in given.items():
        if isinstance(value, bool) or not isinstance(value, PARAMETERS[name]):
            raise InputTextError(f"request parameter {name} must be a number, got {value!r}")
    beam = given.get("beam_size", 1)
    _within("beam_size", beam, 1, max_rows, f"each beam is a row, and one execution takes at most {max_rows} rows "
            "(the repository's --max-batch)")
    length = given.get("max_length")
    if length is not None:
        _within("max_length", length, 1, max_length, f"the model has {max_length} target positions")
    n_best = given.get("n_best", 1)
    _within("n_best", n_best, 1, beam, "it may not exceed beam_size")
    penalty = float(given.get("length_penalty", 1.0))
    if not math.isfinite(penalty):
        raise InputTextError(f"request parameter length_penalty must be finite, got {penalty}")
    return DecodeOptions(beam_size=beam, length_penalty=penalty, max_length=length, batch_size=max_rows,
                         n_best=n_best)


def _within(name: str, value: int, low: int, high: int, why: str) -> None:
    if not low <= value <= high:
        raise InputTextError(f"request parameter {name} {value} is outside {low}..{high}: {why}")


def check_lengths(translator: Translator, texts: Sequence[str]) -> None:
    """A sentence longer than the model's positions (or the engines' profile) fails its request, naming it."""
    encode_lines(translator.vocab.source, texts, translator.max_source, name=f"{TEXT} ")


def translate_requests(translator: Translator, requests: Sequence[TextRequest | TfmExportError]
                       ) -> list[list[Translation] | TfmExportError]:
    """Translations per request (or its error), in order. Requests with the same options share one call."""
    results: list[list[Translation] | TfmExportError] = list(requests)
    groups: dict[DecodeOptions, list[int]] = {}
    for index, request in enumerate(requests):
        if isinstance(request, TextRequest):
            groups.setdefault(request.options, []).append(index)
    for options, members in groups.items():
        texts = [t for i in members for t in requests[i].texts]
        try:
            translations = iter(translator.translate(texts, options))
        except TfmExportError as exc:  # checked requests should not fail; if one does, its group says why
            results = [exc if i in members else r for i, r in enumerate(results)]
            continue
        for i in members:
            results[i] = [next(translations) for _ in requests[i].texts]
    return results
