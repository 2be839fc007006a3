"""The tokenizer.json Hugging Face's JavaScript tokenizers (tokenizers.js) read as the Rust `tokenizers` do.

tokenizers.js ignores Metaspace's `split`: a Metaspace pre-tokenizer that splits is rewritten as one that does not,
followed by a Split both libraries run alike (its matches kept, the text between them dropped). Any step
tokenizers.js does not implement is refused by name.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from ..core.errors import TfmExportError

# The step types tokenizers.js (@huggingface/tokenizers 0.2) builds; any other makes it throw when loading.
JS_STEPS = {
    "normalizer": {"BertNormalizer", "Precompiled", "Sequence", "Replace", "NFC", "NFD", "NFKC", "NFKD", "Strip",
                   "StripAccents", "Lowercase", "Prepend"},
    "pre_tokenizer": {"BertPreTokenizer", "Sequence", "Whitespace", "WhitespaceSplit", "Metaspace", "ByteLevel",
                      "Split", "Punctuation", "Digits", "Replace", "FixedLength"},
    "post_processor": {"TemplateProcessing", "ByteLevel", "BertProcessing", "RobertaProcessing", "Sequence"},
    "decoder": {"ByteLevel", "WordPiece", "Metaspace", "BPEDecoder", "CTC", "Sequence", "Replace", "Fuse", "Strip",
                "ByteFallback"},
    "model": {"WordPiece", "Unigram", "BPE", "WordLevel"},
}
SEQUENCE_KEYS = {"normalizer": "normalizers", "pre_tokenizer": "pretokenizers", "post_processor": "processors",
                 "decoder": "decoders"}


class TokenizerViewError(TfmExportError):
    """A tokenizer the JavaScript side would read differently."""


def js_tokenizer(data: dict[str, Any], origin: str) -> dict[str, Any]:
    """A copy of a tokenizers JSON that tokenizers.js and `tokenizers` split alike; refuses steps it lacks."""
    data = copy.deepcopy(data)
    for part, known in JS_STEPS.items():
        for step in _steps(data.get(part), SEQUENCE_KEYS.get(part)):
            kind = step.get("type")
            if kind not in known:
                raise TokenizerViewError(f"{origin}: its {part} step {kind} is not implemented by transformers.js's "
                                         "tokenizer; this model cannot be loaded there")
    if data.get("pre_tokenizer"):
        data["pre_tokenizer"] = _split_metaspace(data["pre_tokenizer"])
    return data


def _steps(step: dict[str, Any] | None, key: str | None) -> list[dict[str, Any]]:
    if not step:
        return []
    if step.get("type") == "Sequence" and key:
        return [s for inner in step.get(key, []) for s in _steps(inner, key)]
    return [step]


def _split_metaspace(step: dict[str, Any]) -> dict[str, Any]:
    """Metaspace(split) -> Sequence[Metaspace(no split), Split(each piece from a replacement on)], everywhere."""
    if step.get("type") == "Sequence":
        return {**step, "pretokenizers": [_split_metaspace(s) for s in step["pretokenizers"]]}
    if step.get("type") != "Metaspace" or not step.get("split", True):
        return step
    mark = step.get("replacement", "\u2581")
    return {"type": "Sequence", "pretokenizers": [
        {**step, "split": False},
        {"type": "Split", "pattern": {"Regex": f"{mark}[^{mark}]*|[^{mark}]+"}, "behavior": "Removed",
         "invert": True}]}


def same_ids(original: str, rewritten: str, texts: list[str]) -> str | None:
    """The first text the two tokenizers JSON encode differently (the Rust library), or None."""
    from tokenizers import Tokenizer
    a, b = Tokenizer.from_str(original), Tokenizer.from_str(rewritten)
    return next((t for t in texts if a.encode(t).ids != b.encode(t).ids), None)


def dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, indent=2)
