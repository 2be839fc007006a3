"""Which ids a decoder starts from, stops at, may never produce or must produce at a step: the seed's layout by
default, a Hugging Face model's generation config otherwise."""

from __future__ import annotations

from dataclasses import dataclass

from .tokenizer import BOS_ID, EOS_ID, PAD_ID


@dataclass(frozen=True)
class TokenRules:
    pad: int = PAD_ID  # source padding (masked) and the filler of finished rows
    start: int = BOS_ID  # the decoder's first input
    eos: int = EOS_ID
    banned: tuple[int, ...] = (PAD_ID,)  # never generated
    forced_bos: int | None = None  # the first generated token (a target-language code), None: free
    forced_eos: int | None = None  # forced at the last step a length limit allows


SEED_RULES = TokenRules()
