"""Which ids a decoder starts from, stops at, may never produce or must produce at a step, and how long it may run
by default: the seed's layout by default, a Hugging Face model's generation config otherwise."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .errors import TfmExportError
from .tokenizer import BOS_ID, EOS_ID, PAD_ID

# tfm-export: an input is done when </s> is its best candidate (the reference decoders' rule);
# transformers: generate()'s rule (k finished hypotheses and no live beam that could beat them)
BEAM_RULES = ("tfm-export", "transformers")


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

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "banned": list(self.banned)}

    @classmethod
    def from_dict(cls, data: Any, vocab_size: int) -> TokenRules:
        """Rules as a manifest records them; anything else (a missing field, an id outside the target vocabulary)
        raises TfmExportError naming the field."""
        fields = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, dict) or set(data) != fields:
            raise TfmExportError(f"token_rules must have exactly the fields {', '.join(sorted(fields))}")
        if data["beam_rule"] not in BEAM_RULES:
            raise TfmExportError(f"token_rules.beam_rule must be one of {', '.join(BEAM_RULES)}")
        banned = data["banned"]
        if not isinstance(banned, list) or not all(map(_is_id, banned)):
            raise TfmExportError("token_rules.banned must be a list of token ids")
        for name in fields - {"banned", "beam_rule"}:
            value = data[name]
            optional = name in ("forced_bos", "forced_eos", "max_new_tokens")
            if not (_is_id(value) or (optional and value is None)):
                raise TfmExportError(f"token_rules.{name} must be a token id{' or null' if optional else ''}")
        ids = [data[n] for n in ("pad", "start", "eos", "forced_bos", "forced_eos") if data[n] is not None]
        if any(i >= vocab_size for i in [*ids, *banned]):
            raise TfmExportError(f"token_rules names an id outside the target vocabulary of {vocab_size}")
        if data["max_new_tokens"] == 0:
            raise TfmExportError("token_rules.max_new_tokens must be at least 1")
        return cls(**{**data, "banned": tuple(banned)})


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


SEED_RULES = TokenRules()
