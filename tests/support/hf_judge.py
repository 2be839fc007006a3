"""transformers' generate() as an oracle that knows how sure it is: for the Hugging Face tests that hold our decodes
to generate()'s on random tiny models.

Our graphs and PyTorch model differ from transformers by 1e-6..4e-5 in the logits (other kernels, other orders of
summation), and which kernels run depends on the machine (AVX2, AVX-512, VNNI) and the thread count. A test that
asks for token identity must therefore either show that generate()'s own decisions are far from ties
(`Reference.greedy_margin`, a precondition for exact equality), or judge each differing decode as
`tfm-export verify` does: accepted only where the reference itself cannot tell the two apart within the tolerance
the graphs are held to (`Reference.judge`).

The judgement is generate()'s own, under its own rules (beam cut, length penalty, early stopping, forced and banned
tokens): generate() is run again with the log-probabilities of the differing decode's tokens raised by half the
tolerance and those of its own tokens lowered by as much, at every step along the two paths (so a near tie at a
beam cut counts as well as one between finished outputs). A decode is a near-tie when that nudged generate()
produces it. A backend with a broken rule, a wrong weight or a misplaced token is not within the tolerance of the
reference and is not accepted; the tests also require most decodes to be identical.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from tfm_export.graphs.parity import DEFAULT_TOLERANCE, Agreement, Tolerance, token_agreement

MIN_IDENTICAL = 0.9  # judged decodes: the share that must be identical all the same (a broken backend fails)


class _Steer:
    """A logits processor: for the inputs named, the next token of path `favour` gains `amount` and that of path
    `disfavour` loses it, on every row (beam) whose tokens so far follow that path."""

    def __init__(self, paths: dict[int, tuple[tuple[int, ...], tuple[int, ...]]], beams: int, amount: float):
        self.paths, self.beams, self.amount = paths, beams, amount

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.clone()
        for row in range(len(input_ids)):
            paths = self.paths.get(row // self.beams)
            if paths is None:
                continue
            done = tuple(input_ids[row, 1:].tolist())  # after the decoder start
            for path, sign in zip(paths, (1, -1), strict=True):
                if len(path) > len(done) and path[:len(done)] == done:
                    scores[row, path[len(done)]] += sign * self.amount
        return scores


@dataclass
class Reference:
    """generate() on one batch: its decodes (each cut at its first </s>, exclusive, as tfm-export reports tokens),
    the tolerance bound on its logits, and the judgement of other decodes of the same inputs."""

    directory: Path
    inputs: dict[str, torch.Tensor]  # input_ids and attention_mask, as generate() takes them
    options: dict = field(default_factory=dict)
    tolerance: Tolerance = DEFAULT_TOLERANCE

    def __post_init__(self) -> None:
        import transformers
        self.model = transformers.AutoModelForSeq2SeqLM.from_pretrained(self.directory).eval()
        self.eos = self.options.get("eos_token_id", self.model.generation_config.eos_token_id)
        self.beams = self.options.get("num_beams", self.model.generation_config.num_beams) or 1
        out = self._generate(output_scores=True, output_logits=True, return_dict_in_generate=True)
        self.want = self._cut(out.sequences)
        self._scores = out.scores  # greedy: the logits after the rules (banned ids, forced tokens); beam: log-probs
        scale = max(float(s[torch.isfinite(s)].abs().max()) for s in out.logits)
        self.bound = self.tolerance.atol + self.tolerance.rtol * scale  # as verify holds the graphs' logits

    def _generate(self, **extra) -> object:
        with torch.no_grad():
            return self.model.generate(**self.inputs, **self.options, **extra)

    def _cut(self, sequences: torch.Tensor) -> list[tuple[int, ...]]:
        return [tuple(row[:row.index(self.eos)] if self.eos in row else row) for row in sequences[:, 1:].tolist()]

    def _path(self, tokens: tuple[int, ...]) -> tuple[int, ...]:
        return (*tokens, self.eos)  # a decode cut at max_length never reaches its </s>

    def greedy_margin(self) -> float:
        """The smallest gap between the best and second-best logit (after the rules) at any greedy decision of
        generate() on these inputs, the </s> that ends an output included; forced steps decide nothing."""
        assert self.beams == 1, "the margin is of greedy decisions"
        gaps = [float("inf")]
        for step, scores in enumerate(self._scores):
            rows = [i for i, tokens in enumerate(self.want) if step <= len(tokens)]  # live at this step
            top = scores[rows].topk(2, dim=-1).values
            gap = top[:, 0] - top[:, 1]
            gaps += gap[torch.isfinite(gap)].tolist()
        return min(gaps)

    def judge(self, name: str, got: list[tuple[int, ...]]) -> Agreement:
        """got against generate()'s decodes: each differing decode counted as a near-tie where generate(), with
        the log-probabilities along the two paths moved apart by the tolerance bound in its favour (half up for
        its tokens, half down for generate()'s own), produces it."""
        differing = [i for i, (g, w) in enumerate(zip(got, self.want, strict=True)) if g != w]
        ties: set[int] = set()
        if differing:
            paths = {i: (self._path(got[i]), self._path(self.want[i])) for i in differing}
            steered = self._cut(self._generate(logits_processor=[_Steer(paths, self.beams, self.bound / 2)]))
            ties = {i for i in differing if steered[i] == got[i]}
        return token_agreement(name, got, self.want, lambda row: row in ties)


def assert_agrees(agreement: Agreement, min_identical: float = MIN_IDENTICAL) -> None:
    """Verify's rule with no divergence allowed (every decode identical or a near-tie), and most identical."""
    assert agreement.identical + agreement.ties == agreement.total, \
        f"{agreement.name}: {agreement.summary}, the others beyond the tolerance (decodes {list(agreement.differing)})"
    assert agreement.identical >= min_identical * agreement.total, f"{agreement.name}: {agreement.summary}"


def text_inputs(directory: Path, texts: list[str], source_lang: str | None = None) -> dict[str, torch.Tensor]:
    """The Hugging Face tokenizer's batch of `texts` (from `source_lang` where given), as hf_oracle.generate
    tokenizes them."""
    import transformers
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    if source_lang is not None:
        tokenizer.src_lang = source_lang
    return dict(tokenizer(texts, return_tensors="pt", padding=True))
