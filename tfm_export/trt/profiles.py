"""TensorRT optimisation profiles read from the graph specs: every dynamic axis gets (min, opt, max).

One profile per graph covers every shape the runtime can feed: batch x beam rows 1..max, source
length 1..max, one new decoder token (the step), past length 0..max-1 (the first step has an
empty cache). `opt` is where TensorRT tunes its kernels, so it is set to typical sizes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..core.errors import TfmExportError
from ..core.graph_spec import BATCH, CAPACITY, NEW_LEN, PAST_LEN, SOURCES, SRC_LEN, GraphSpec

Range = tuple[int, int, int]  # min, opt, max


@dataclass(frozen=True)
class ShapeLimits:
    """The sizes engines are built for; defaults come from the model's manifest (its positions)."""

    max_batch: int = 64  # rows: sentences x beams
    max_source_length: int | None = None  # with <s> and </s>; None = the model's positions
    max_target_length: int | None = None  # past + new decoder tokens, <s> included; None = the model's positions
    opt_batch: int | None = None  # None: typical sizes (8 rows, 32 source tokens, 32 past tokens) within range
    opt_source_length: int | None = None
    opt_past_length: int | None = None

    def resolved(self, positions: int) -> ShapeLimits:
        """These limits with the model's positions for the lengths not given, checked against them."""
        limits = dataclasses.replace(self, max_source_length=self.max_source_length or positions,
                                     max_target_length=self.max_target_length or positions)
        limits.check(positions)
        return limits

    def check(self, positions: int) -> None:
        """Every limit in range, and every opt within its range (an opt beyond the max is an error, not clamped)."""
        for name, value, low in (("--max-source-length", self.max_source_length, 1),
                                 ("--max-target-length", self.max_target_length, 2)):
            if not low <= value <= positions:
                raise TfmExportError(f"{name} {value} is outside {low}..{positions} (the model's positions)")
        for name, value, low, high in (("--max-batch", self.max_batch, 1, None),
                                       ("--opt-batch", self.opt_batch, 1, self.max_batch),
                                       ("--opt-source-length", self.opt_source_length, 1, self.max_source_length),
                                       ("--opt-past-length", self.opt_past_length, 0, self.max_target_length - 1)):
            if value is not None and (value < low or (high is not None and value > high)):
                raise TfmExportError(f"{name} {value} is outside {low}..{high or 'any'}; give a value in that range")

    def ranges(self) -> dict[str, Range]:
        """Axis symbol -> (min, opt, max); the default opts are clamped into small ranges."""
        def clamp(value: int, low: int, high: int) -> int:
            return max(low, min(value, high))
        past_max = self.max_target_length - 1
        batch = (1, clamp(self.opt_batch or 8, 1, self.max_batch), self.max_batch)
        return {BATCH: batch, SOURCES: batch,  # at most one source per row
                SRC_LEN: (1, clamp(self.opt_source_length or 32, 1, self.max_source_length), self.max_source_length),
                NEW_LEN: (1, 1, 1),
                PAST_LEN: (0, clamp(32 if self.opt_past_length is None else self.opt_past_length, 0, past_max),
                           past_max),
                CAPACITY: (1, clamp(32 if self.opt_past_length is None else self.opt_past_length + 1, 1, past_max + 1),
                           past_max + 1)}

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def profile_shapes(spec: GraphSpec, limits: ShapeLimits) -> dict[str, tuple[tuple[int, ...], ...]]:
    """Input name -> (min shape, opt shape, max shape), for builder.create_optimization_profile()."""
    ranges = limits.ranges()
    shapes = {}
    for tensor in spec.inputs:
        dims = [ranges[d] if isinstance(d, str) else (d, d, d) for d in tensor.shape]
        shapes[tensor.name] = tuple(tuple(d[i] for d in dims) for i in range(3))
    return shapes

