"""Triton requests as the Translator takes them, and back: no Triton import here, so this is plain, testable code.

Each request is checked on its own (its text, its parameters, its lengths), so a bad one fails alone with a
message that says what to change; the good ones of a batch are grouped by decoding options and languages and
translated together, one Translator call per group (which buckets them by length and bounds the rows per decode).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.errors import InputTextError, TfmExportError
from ..core.sources import encode_lines
from ..runtime.translator import LENGTH_PENALTY_RANGE, DecodeOptions, Translation, Translator
from .contract import TEXT

# Request parameters (the inference request's "parameters" object): the Python types each one takes, and how an
# error names them.
PARAMETERS = {"beam_size": (int,), "max_length": (int,), "length_penalty": (int, float), "n_best": (int,),
              "source_lang": (str,), "target_lang": (str,)}
KINDS = {(int,): "a whole number", (int, float): "a number", (str,): "a language code (a string)"}
LANGUAGE_NAMES = ("source_lang", "target_lang")
Languages = tuple[str | None, str | None]


class TranslationFailed(TfmExportError):
    """A checked request's group failed in the Translator: a fault of the server's, not of the request."""


@dataclass(frozen=True)
class TextRequest:
    """One request, checked: its sentences, how to decode them (the model's defaults filled in) and from and
    into which languages."""

    texts: tuple[str, ...]
    options: DecodeOptions
    languages: Languages = (None, None)


def parse_request(translator: Translator, raw: np.ndarray, parameters: str | dict) -> TextRequest:
    """A request's TEXT tensor and parameters, checked against what this translator takes."""
    texts = decode_texts(raw)
    given = request_parameters(parameters)
    languages = (given.get("source_lang"), given.get("target_lang"))
    chosen = translator.with_languages(*languages, names=LANGUAGE_NAMES)
    options = decode_options(given, chosen)
    check_lengths(chosen, texts)
    return TextRequest(texts, options, languages)


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


def request_parameters(parameters: str | dict) -> dict[str, Any]:
    """The request's parameters, each a known name of the right type; unknown names are refused, not ignored."""
    given = json.loads(parameters or "{}") if isinstance(parameters, str) else dict(parameters)
    unknown = sorted(set(given) - set(PARAMETERS))
    if unknown:
        raise InputTextError(f"unknown request parameter(s) {', '.join(unknown)}; this model takes "
                             f"{', '.join(PARAMETERS)}")
    for name, value in given.items():
        if isinstance(value, bool) or not isinstance(value, PARAMETERS[name]):
            raise InputTextError(f"request parameter {name} must be {KINDS[PARAMETERS[name]]}, got {value!r}")
    return given


def decode_options(given: dict[str, Any], translator: Translator) -> DecodeOptions:
    """Checked parameters -> DecodeOptions, the model's beam size and length penalty where the request gives
    none. beam_size is bounded by the rows one execution takes (the repository's --max-batch), max_length by the
    target positions."""
    options = translator.with_defaults(DecodeOptions(
        beam_size=given.get("beam_size"), length_penalty=given.get("length_penalty"),
        max_length=given.get("max_length"), batch_size=translator.max_rows, n_best=given.get("n_best", 1)))
    default = "" if "beam_size" in given else " (the model's default)"
    _within(f"beam_size {options.beam_size}{default}", options.beam_size, 1, translator.max_rows,
            f"each beam is a row, and one execution takes at most {translator.max_rows} rows (the repository's "
            "--max-batch)")
    if options.max_length is not None:
        _within(f"max_length {options.max_length}", options.max_length, 1, translator.max_target,
                f"the model has {translator.max_target} target positions")
    _within(f"n_best {options.n_best}", options.n_best, 1, options.beam_size, "it may not exceed beam_size")
    low, high = LENGTH_PENALTY_RANGE
    if not math.isfinite(options.length_penalty) or not low <= options.length_penalty <= high:
        raise InputTextError(f"request parameter length_penalty {options.length_penalty} is outside {low:g}..{high:g}")
    return options


def _within(what: str, value: int, low: int, high: int, why: str) -> None:
    if not low <= value <= high:
        raise InputTextError(f"request parameter {what} is outside {low}..{high}: {why}")


def check_lengths(translator: Translator, texts: Sequence[str]) -> None:
    """A sentence longer than the model's positions (or the engines' profile) fails its request, naming it."""
    encode_lines(translator.vocab.source, texts, translator.max_source, name=f"{TEXT} ")


def translate_requests(translator: Translator, requests: Sequence[TextRequest | TfmExportError]
                       ) -> list[list[Translation] | TfmExportError]:
    """Translations per request (or its error), in order. Requests with the same options and languages share
    one call; whatever goes wrong in a call fails its group's requests with one line, never the server."""
    results: list[list[Translation] | TfmExportError] = list(requests)
    groups: dict[tuple[DecodeOptions, Languages], list[int]] = {}
    for index, request in enumerate(requests):
        if isinstance(request, TextRequest):
            groups.setdefault((request.options, request.languages), []).append(index)
    for (options, languages), members in groups.items():
        texts = [t for i in members for t in requests[i].texts]
        try:
            chosen = translator.with_languages(*languages, names=LANGUAGE_NAMES)
            translations = iter(chosen.translate(texts, options))
        except Exception as exc:  # checked requests should not fail; if one does, its group says why, alone
            error = exc if isinstance(exc, TfmExportError) else _failed(exc)
            results = [error if i in members else r for i, r in enumerate(results)]
            continue
        for i in members:
            results[i] = [next(translations) for _ in requests[i].texts]
    return results


def _failed(exc: Exception) -> TranslationFailed:
    """A fault in the server's code or libraries as one line (its traceback kept as the cause, for the log)."""
    failed = TranslationFailed(f"{type(exc).__name__}: {exc}")
    failed.__cause__ = exc
    return failed
