"""Which ids a decoder starts from, stops at, may never produce or must produce at a step, and how long it may run
by default: the seed's layout by default, a Hugging Face model's generation config otherwise."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from .errors import TfmExportError
from .tokenizer import BOS_ID, EOS_ID, PAD_ID

# tfm-export: an input is done when </s> is its best candidate (the reference decoders' rule);
# transformers: generate()'s rule (k finished hypotheses and no live beam that could beat them)
BEAM_RULES = ("tfm-export", "transformers")
# Where a chosen target language goes. forced_bos: it is the first generated token (NLLB, M2M100, mBART-50);
# decoder_start: it is the decoder's first input (mBART-cc25); source_prefix: its code comes before the source
# text (multilingual opus-mt, >>fra<<).
LANGUAGE_RULES = ("forced_bos", "decoder_start", "source_prefix")
# absent from manifests written before languages and generation defaults were recorded
EARLY_STOPPING_VALUES = 'true, false or "never"'
OPTIONAL_FIELDS = {"languages": [], "language_rule": None, "early_stopping": False, "num_beams": 1,
                   "length_penalty": 1.0}


@dataclass(frozen=True)
class TokenRules:
    pad: int = PAD_ID  # source padding (masked) and the filler of finished rows
    start: int = BOS_ID  # the decoder's first input
    eos: int = EOS_ID
    banned: tuple[int, ...] = (PAD_ID,)  # never generated
    forced_bos: int | None = None  # the first generated token (a target-language code), None: free
    forced_eos: int | None = None  # forced at the last step a length limit allows
    max_new_tokens: int | None = None  # the default length limit (generated tokens); None: the model's positions
    beam_rule: str = "tfm-export"  # when beam search stops and how it ranks: one of BEAM_RULES
    early_stopping: bool | str = False  # generate()'s (beam_rule transformers): False, True or "never"
    num_beams: int = 1  # the default beam size
    length_penalty: float = 1.0  # the default length penalty
    languages: tuple[str, ...] = ()  # the language codes (token names) a multilingual model takes
    language_rule: str | None = None  # one of LANGUAGE_RULES when there are languages

    def with_target(self, token_id: int) -> TokenRules:
        """The rules with a target language's token where language_rule puts it (source_prefix: in the source)."""
        if self.language_rule == "forced_bos":
            return dataclasses.replace(self, forced_bos=token_id)
        if self.language_rule == "decoder_start":
            return dataclasses.replace(self, start=token_id)
        return self

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "banned": list(self.banned), "languages": list(self.languages)}

    @classmethod
    def from_dict(cls, data: Any, vocab_size: int) -> TokenRules:
        """Rules as a manifest records them; anything else (a missing field, an id outside the target vocabulary)
        raises TfmExportError naming the field."""
        fields = {f.name for f in dataclasses.fields(cls)}
        if isinstance(data, dict):
            data = {**OPTIONAL_FIELDS, **data}
        if not isinstance(data, dict) or set(data) != fields:
            raise TfmExportError(f"token_rules must have exactly the fields {', '.join(sorted(fields))}")
        for name, ok, what in _checks(data):
            if not ok:
                raise TfmExportError(f"token_rules.{name} must be {what}")
        ids = [(n, data[n]) for n in ("pad", "start", "eos", "forced_bos", "forced_eos") if data[n] is not None]
        for name, token in [*ids, *(("banned", i) for i in data["banned"])]:
            if token >= vocab_size:
                raise TfmExportError(f"token_rules.{name} names id {token}, outside the target vocabulary of "
                                     f"{vocab_size}")
        return cls(**{**data, "banned": tuple(data["banned"]), "languages": tuple(data["languages"])})


def _checks(data: dict[str, Any]) -> list[tuple[str, bool, str]]:
    """(field, valid, what it must be) for every field of a manifest's token_rules."""
    languages, penalty = data["languages"], data["length_penalty"]
    rules = [(name, is_token_id(data[name]), "a token id") for name in ("pad", "start", "eos")]
    rules += [(name, data[name] is None or is_token_id(data[name]), "a token id or null")
              for name in ("forced_bos", "forced_eos")]
    return rules + [
        ("banned", isinstance(data["banned"], list) and all(map(is_token_id, data["banned"])), "a list of token ids"),
        ("max_new_tokens", data["max_new_tokens"] is None or (is_token_id(data["max_new_tokens"])
                                                              and data["max_new_tokens"] > 0), "at least 1 or null"),
        ("beam_rule", data["beam_rule"] in BEAM_RULES, f"one of {', '.join(BEAM_RULES)}"),
        ("early_stopping", is_early_stopping(data["early_stopping"]), EARLY_STOPPING_VALUES),
        ("num_beams", is_token_id(data["num_beams"]) and data["num_beams"] > 0, "at least 1"),
        ("length_penalty", is_finite_number(penalty), "a number"),
        ("languages", isinstance(languages, list) and all(isinstance(c, str) and c for c in languages),
         "a list of language codes"),
        ("language_rule", data["language_rule"] in (LANGUAGE_RULES if languages else (None,)),
         f"one of {', '.join(LANGUAGE_RULES)} when there are languages, and null otherwise"),
    ]


def is_token_id(value: Any) -> bool:
    """A whole number >= 0 (JSON's true/false are not ids)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_early_stopping(value: Any) -> bool:
    """One of generate()'s early_stopping values (1 and 0 are not true and false here)."""
    return value is True or value is False or value == "never"


def is_finite_number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


SEED_RULES = TokenRules()
