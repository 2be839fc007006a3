"""generate.onnx as a searcher: ONNX Runtime's BeamSearch op runs the whole greedy or beam search in one
`session.run`, so there is no step loop and no StepBackend here.

What differs from runtime.decoding is the op's own stopping rule (docs/graph-contract.md, "generate.onnx"):
greedy decodes are identical; beam hypotheses may differ where the op keeps searching after our rule stops.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from ...artifacts.model_dir import ModelDir, verified_file
from ...core.config import ModelConfig
from ...core.errors import InputTextError, TfmExportError
from ...core.generate_spec import GENERATE, GENERATE_FILE, MIN_ONNXRUNTIME, OP_MAX_LENGTH, op_lengths
from ...core.graph_spec import INPUT_IDS
from ...core.hypothesis import Hypothesis
from ...core.sources import check_source_length
from ...core.token_rules import TokenRules
from ...core.tokenizer import PAD_ID
from ..counts import WorkCounts
from ..search import SearchOptions
from ..session import SessionOptions, open_session, run
from .loaders import directory_options


class GenerateSearcher:
    """Searcher (runtime.search) running generate.onnx. Inputs go one per call unless the graph was made with
    --early-stopping: with early_stopping=0, ONNX Runtime (measured with 1.32) tests each input's stopping rule on
    another input's scores when a call holds several, so batched inputs run to max_length and may stop at the wrong
    step."""

    def __init__(self, session: ort.InferenceSession, config: ModelConfig, batched: bool,
                 model_dir: ModelDir | None = None) -> None:
        """batched: a call takes the whole batch (safe only for a graph made with early_stopping 1)."""
        self.session, self.config, self.batched, self.model_dir = session, config, batched, model_dir
        self.counts: WorkCounts | None = None  # given by those who count work

    def search(self, src: np.ndarray, options: SearchOptions, rules: TokenRules) -> list[list[Hypothesis]]:
        """Greedy (beam_size 1) asks the op for no length penalty, so its scores are summed log-probabilities as the
        loop's are. The rules are the seed's: `tfm-export generate` refuses pretrained models' directories."""
        beam_size, max_length, length_penalty = options.beam_size, options.max_length, options.length_penalty
        n_best, min_length = options.n_best, options.min_length
        check_source_length(src.shape[1], self.config.n_position)
        top, bottom = op_lengths(max_length, min_length)
        if top > OP_MAX_LENGTH:
            raise InputTextError(f"--max-length {max_length} is beyond what ONNX Runtime's BeamSearch takes "
                                 f"({OP_MAX_LENGTH - 1} tokens after <s>); lower it")
        penalty = length_penalty if beam_size > 1 else 0.0
        scalars = {"max_length": top, "min_length": bottom, "num_beams": beam_size, "num_return_sequences": n_best}
        feeds = {**{k: np.array([v], np.int32) for k, v in scalars.items()},
                 "length_penalty": np.array([penalty], np.float32)}
        out = []
        for rows in self._calls(src):
            result = run(self.session, {INPUT_IDS: rows.astype(np.int32), **feeds})
            if self.counts is not None:
                self.counts.run(len(rows))
            for seqs, scores in zip(result["sequences"], result["sequences_scores"], strict=True):
                out.append([_hypothesis(seq, float(score), penalty, max_length, length_penalty)
                            for seq, score in zip(seqs, scores, strict=True)])
        return out

    def _calls(self, src: np.ndarray) -> list[np.ndarray]:
        if self.batched:
            return [src]
        return [row[None, :int((row != PAD_ID).sum())] for row in src]  # each without its padding


def load_generate(model_dir: ModelDir, options: SessionOptions) -> GenerateSearcher:
    """generate.onnx of a model directory (runtime.backends opens it), the directory verified whole."""
    directory, entry = model_dir.path, model_dir.manifest.generate
    if entry is None:
        raise TfmExportError(f"{directory}: has no {GENERATE_FILE}; make one with `tfm-export generate --model "
                             f"{directory} --output DIR` and run that directory")
    path = verified_file(directory, entry.file, entry.sha256, f"graph file of {GENERATE}")
    model_dir.verified_graphs()  # not run here, but a damaged directory is refused whole
    if tuple(int(p) for p in ort.__version__.split(".")[:2]) < MIN_ONNXRUNTIME:
        raise TfmExportError(f"{path}: needs ONNX Runtime {'.'.join(map(str, MIN_ONNXRUNTIME))} or later (this is "
                             f"{ort.__version__}, whose BeamSearch takes an older subgraph format); upgrade "
                             "onnxruntime, or run the directory with --backend onnxruntime")
    return GenerateSearcher(open_session(path, directory_options(model_dir, options)), model_dir.config,
                            bool(entry.extra.get("early_stopping")), model_dir)


def _hypothesis(sequence: np.ndarray, score: float, op_penalty: float, max_length: int,
                length_penalty: float) -> Hypothesis:
    """sequence: <s>, the generated ids, then <blank> padding (</s> is not written); score: the op's
    sum of log-probabilities / (its length with <s>) ** op_penalty."""
    tokens = tuple(int(t) for t in sequence[1:] if t != PAD_ID)  # <blank> is never generated
    total = score * (len(tokens) + 1) ** op_penalty
    return Hypothesis(tokens, total, length_penalty, finished=len(tokens) < max_length)
