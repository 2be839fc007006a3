"""Which ids a decoder starts from, stops at, may never produce or must produce at a step: the seed's layout by
default, a Hugging Face model's generation config otherwise (recorded in the manifest)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .tokenizer import BOS_ID, EOS_ID, PAD_ID


@dataclass(frozen=True)
class TokenRules:
    pad: int = PAD_ID  # source padding (masked) and the filler of finished rows
    start: int = BOS_ID  # the decoder's first input
    eos: int = EOS_ID
    banned: tuple[int, ...] = (PAD_ID,)  # never generated
    forced_bos: int | None = None  # the first generated token (a target-language code), None: free
    forced_eos: int | None = None  # forced at the last step a length limit allows

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "banned": list(self.banned)}

    @classmethod
    def from_dict(cls, data: Any) -> TokenRules:
        """A manifest's `token_rules`; absent (older directories, the seed's models): the seed's."""
        if data is None:
            return SEED_RULES
        ids = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0  # noqa: E731
        if not isinstance(data, dict) or set(data) - set(cls.__dataclass_fields__) \
                or not all(ids(data.get(k, 0)) for k in ("pad", "start", "eos")) \
                or not all(data.get(k) is None or ids(data[k]) for k in ("forced_bos", "forced_eos")) \
                or not isinstance(data.get("banned", []), list) or not all(map(ids, data.get("banned", []))):
            raise ValueError("token_rules must map pad/start/eos to ids, banned to a list of ids and "
                             "forced_bos/forced_eos to an id or null")
        return cls(**{**data, "banned": tuple(data.get("banned", ()))})

    def out_of(self, vocab: int) -> list[int]:
        """Ids these rules name that a vocabulary of this size lacks."""
        named = [self.pad, self.start, self.eos, *self.banned, self.forced_bos, self.forced_eos]
        return sorted({i for i in named if i is not None and i >= vocab})


SEED_RULES = TokenRules()
