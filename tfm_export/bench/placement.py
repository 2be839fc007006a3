"""Where the decoder step's nodes run: ONNX Runtime's own profile of a short decode, by execution provider.

On a GPU, a node the CUDA provider cannot run falls back to the CPU and a Memcpy node moves its data across, every
step; neither shows anywhere but in the profile (the session logs nothing at the level it runs at). The count is
what `tfm-run bench --device cuda` and the GPU check print first.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..core.graph_spec import Graph
from ..core.token_rules import SEED_RULES
from ..core.tokenizer import BOS_ID, EOS_ID, FIRST_TOKEN_ID
from ..runtime.backends import ONNXRUNTIME, open_backend
from ..runtime.backends.loaders import open_graph
from ..runtime.search import SearchOptions
from ..runtime.session import SessionOptions
from ..runtime.step_graph import DEFAULT_STEP, StepOptions

MEMCPY = ("MemcpyFromHost", "MemcpyToHost")


@dataclass(frozen=True)
class Placement:
    graph: str
    nodes: dict[str, int]  # execution provider -> nodes that ran on it
    memcpy: int  # Memcpy nodes (data moved between the host and the device within a step)

    @property
    def line(self) -> str:
        where = ", ".join(f"{count} on {provider}" for provider, count in sorted(self.nodes.items()))
        return f"{self.graph}: {sum(self.nodes.values())} nodes ran: {where}; {self.memcpy} Memcpy"


def step_placement(directory: Path, options: SessionOptions, backend: str = ONNXRUNTIME,
                   step: StepOptions = DEFAULT_STEP) -> Placement:
    """The step graph the backend and options choose, profiled over a two-step greedy decode of one random source
    on options.device."""
    with tempfile.TemporaryDirectory(prefix="tfm-placement-") as tmp:
        steps = []  # the step session the door opens, profiled

        def profiled(path: Path, spec, chosen: SessionOptions, so: ort.SessionOptions | None):
            so = so or ort.SessionOptions()
            if spec.graph is Graph.ENCODER:
                return open_graph(path, spec, chosen, so)
            so.enable_profiling, so.profile_file_prefix = True, f"{tmp}/step"
            steps.append(open_graph(path, spec, chosen, so))
            return steps[-1]
        opened = open_backend(directory, backend, options, loader=profiled, step=step)
        vocab = opened.config.src_vocab_size
        src = np.array([[BOS_ID, *np.random.default_rng(0).integers(FIRST_TOKEN_ID, vocab, 6), EOS_ID]])
        opened.searcher.search(src, SearchOptions(2, min_length=2), SEED_RULES)
        decoder = steps[-1]
        graph = decoder.get_modelmeta().custom_metadata_map.get("tfm_export.graph", "decoder")
        events = json.loads(Path(decoder.end_profiling()).read_text())
    nodes = {e["name"].removesuffix("_kernel_time"): e["args"] for e in events
             if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")}
    return Placement(graph, dict(Counter(a.get("provider", "?") for a in nodes.values())),
                     sum(a.get("op_name") in MEMCPY for a in nodes.values()))
