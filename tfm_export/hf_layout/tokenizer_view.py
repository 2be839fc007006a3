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
from ..model.hf_tokenizer import CODE_START, METASPACE, RUN_END, RUN_START

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


def decoding_targets(source: dict[str, Any]) -> dict[str, Any]:
    """The source tokenizer, decoding the target's pieces too. Its own pieces keep their names; a piece only the
    target has is renamed on the source side so that no text reaches it (a second "▁" after its first character,
    or run markers around it: the export's Marian conversion, which also marks a language code), and these steps
    undo the renaming before the source's own decoder."""
    marks = (RUN_START, RUN_END, CODE_START)
    undo = [{"type": "Replace", "pattern": {"Regex": f"(?<=^.){METASPACE}"}, "content": ""},
            *({"type": "Replace", "pattern": {"String": mark}, "content": ""} for mark in marks)]
    return {**source, "decoder": {"type": "Sequence", "decoders": [*undo, source["decoder"]]}}


def same_decodes(view: str, target: str, size: int, seed: int = 0) -> int | None:
    """The first id whose text the view's tokenizer and the target's decode differently (every id alone, then
    random sequences; the Rust library), or None."""
    import random

    from tokenizers import Tokenizer
    a, b = Tokenizer.from_str(view), Tokenizer.from_str(target)
    rng = random.Random(seed)
    cases = [[i] for i in range(size)] + [rng.choices(range(size), k=12) for _ in range(200)]
    return next((case[0] for case in cases if a.decode(case) != b.decode(case)), None)


def same_ids(original: str, rewritten: str, texts: list[str]) -> str | None:
    """The first text the two tokenizers JSON encode differently (the Rust library), or None."""
    from tokenizers import Tokenizer
    a, b = Tokenizer.from_str(original), Tokenizer.from_str(rewritten)
    return next((t for t in texts if a.encode(t).ids != b.encode(t).ids), None)


def dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, indent=2)
