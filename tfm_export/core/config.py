"""Model configuration: the one place that says how to rebuild the reference Transformer."""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar

from .errors import CheckpointError
from .variants import CLASSIC, variant_problems

SCALE_MODES = ("emb", "prj", "none")
# Largest value each size may take: generous for real models, small enough that a damaged or hostile config
# is refused instead of allocating terabytes (NLLB's vocabulary is 256k, long-context models 32k positions).
SIZE_LIMITS = {"src_vocab_size": 1 << 22, "trg_vocab_size": 1 << 22, "d_model": 1 << 16, "d_inner": 1 << 18,
               "n_layers": 256, "n_head": 1024, "d_k": 1 << 12, "d_v": 1 << 12, "n_position": 1 << 16}
FLAGS = ("proj_share_weight", "embs_share_weight")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of the seed code's `Transformer(...)`, with its defaults."""

    src_vocab_size: int
    trg_vocab_size: int
    src_pad_idx: int = 1  # `<blank>` in the seed vocabularies
    trg_pad_idx: int = 1
    d_model: int = 512  # also d_word_vec: the seed asserts they are equal
    d_inner: int = 2048  # FFN hidden size (`d_inner_hid` on the seed command line)
    n_layers: int = 6  # encoder and decoder each
    n_head: int = 8
    d_k: int = 64  # query/key size per head; n_head * d_k need not equal d_model
    d_v: int = 64  # value size per head
    dropout: float = 0.1
    n_position: int = 200  # rows of the sinusoid table = longest sequence the model takes
    proj_share_weight: bool = True  # target embedding <-> output projection
    embs_share_weight: bool = True  # source <-> target embedding
    scale_emb_or_prj: str = "prj"  # x sqrt(d_model) on embeddings, or x d_model^-0.5 on logits
    # The variants (core.variants); the defaults are the seed's classic model.
    norm: str = "layernorm"  # or "rmsnorm": x / sqrt(mean(x^2) + eps) * g
    norm_eps: float = 1e-6
    placement: str = "post"  # "pre" (+ final norms), "sandwich" (+ final norms), "deepnorm"
    deepnorm_alpha: float = 1.0  # DeepNorm: norm(alpha * x + f(x))
    embedding_norm: bool = True  # the seed's norm after embedding + positions
    activation: str = "relu"  # "gelu" (erf), "swish", or gated with three matrices: "glu", "geglu", "swiglu"
    ffn_bias: bool = True
    attention_bias: bool = False
    positions: str = "sinusoid"  # "learned" table, "rope" on self-attention q/k, T5 "relative" bias
    rope_base: float = 10000.0
    relative_buckets: int = 32
    relative_max_distance: int = 128
    output_bias: bool = False  # a bias on the logits (Marian's and BART's final_logits_bias)

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise CheckpointError("invalid model config: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Every field of the wrong type or out of range (checked before any tensor is allocated)."""
        found = [f"{name} must be a whole number in 1..{limit:,}, got {getattr(self, name)!r}"
                 for name, limit in SIZE_LIMITS.items()
                 if not _is_int(getattr(self, name)) or not 1 <= getattr(self, name) <= limit]
        found += [f"{name} must be true or false, got {getattr(self, name)!r}" for name in FLAGS
                  if not isinstance(getattr(self, name), bool)]
        if not isinstance(self.dropout, (int, float)) or isinstance(self.dropout, bool) \
                or not 0 <= self.dropout < 1:
            found.append(f"dropout must be a number in [0, 1), got {self.dropout!r}")
        if self.scale_emb_or_prj not in SCALE_MODES:
            found.append(f"scale_emb_or_prj must be one of {SCALE_MODES}, got {self.scale_emb_or_prj!r}")
        if found:
            return found
        for side, pad, vocab in (("src", self.src_pad_idx, self.src_vocab_size),
                                 ("trg", self.trg_pad_idx, self.trg_vocab_size)):
            if not _is_int(pad) or not 0 <= pad < vocab:
                found.append(f"{side}_pad_idx must be a token id in 0..{vocab - 1}, got {pad!r}")
        if self.embs_share_weight and self.src_vocab_size != self.trg_vocab_size:
            found.append("embs_share_weight needs src_vocab_size == trg_vocab_size "
                         f"({self.src_vocab_size} != {self.trg_vocab_size})")
        found += variant_problems(self.variant(), self.d_k)
        return found

    def variant(self) -> dict[str, Any]:
        """The variant options (core.variants.CLASSIC's keys) and their values in this config."""
        return {name: getattr(self, name) for name in CLASSIC}

    @property
    def is_classic(self) -> bool:
        return self.variant() == CLASSIC

    @property
    def scale_emb(self) -> bool:
        # The seed applies either scaling only when the output projection is shared.
        return self.proj_share_weight and self.scale_emb_or_prj == "emb"

    @property
    def tied_table(self) -> tuple[int, int]:
        """The shape of the embedding table the output projection and (shared vocabularies) the source share."""
        return self.trg_vocab_size, self.d_model

    @property
    def scale_prj(self) -> bool:
        return self.proj_share_weight and self.scale_emb_or_prj == "prj"

    def to_dict(self) -> dict[str, Any]:
        """Every field; a classic model's without the variant options, so its checkpoints, manifests and
        graph metadata are byte-identical to those written before the options existed."""
        data = dataclasses.asdict(self)
        return {k: v for k, v in data.items() if k not in CLASSIC} if self.is_classic else data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        if not isinstance(data, dict):
            raise CheckpointError(f"model config must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise CheckpointError(f"unknown model config fields: {', '.join(unknown)}")
        try:
            return cls(**data)
        except TypeError as exc:  # a required field is missing
            raise CheckpointError(f"incomplete model config: {exc}") from None

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_seed_settings(cls, opt: argparse.Namespace) -> ModelConfig:
        """Rebuild the config the seed's train.py used from the `settings` it saved."""
        fields = vars(opt)
        required = ("src_vocab_size", "trg_vocab_size", "src_pad_idx", "trg_pad_idx", "d_model",
                    "d_inner_hid", "d_k", "d_v", "n_head", "n_layers")
        missing = [name for name in required if name not in fields]
        if missing:
            raise CheckpointError(f"seed checkpoint settings lack {', '.join(missing)}")
        return cls(
            src_vocab_size=fields["src_vocab_size"], trg_vocab_size=fields["trg_vocab_size"],
            src_pad_idx=fields["src_pad_idx"], trg_pad_idx=fields["trg_pad_idx"],
            d_model=fields["d_model"], d_inner=fields["d_inner_hid"], n_layers=fields["n_layers"],
            n_head=fields["n_head"], d_k=fields["d_k"], d_v=fields["d_v"],
            dropout=fields.get("dropout", 0.1),
            proj_share_weight=fields.get("proj_share_weight", False),
            embs_share_weight=fields.get("embs_share_weight", False),
            # Seed versions before the option existed behaved like its later default, 'prj'.
            scale_emb_or_prj=fields.get("scale_emb_or_prj", "prj"),
        )


@dataclass(frozen=True)
class TrainSettings:
    MAX_STEPS: ClassVar[int] = 1_000_000  # what --steps / --batch-size may ask (a typo of 1e9 is not a plan)
    MAX_BATCH_SIZE: ClassVar[int] = 8192
    steps: int = 2000
    batch_size: int = 128
    warmup_steps: int = 400
    lr_mul: float = 1.0  # peak lr = lr_mul * d_model^-0.5 * warmup^-0.5
    label_smoothing: float = 0.1
    seed: int = 1
