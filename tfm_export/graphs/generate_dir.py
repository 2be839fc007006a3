"""model directory -> the same directory plus generate.onnx, written atomically and proven by decoding.

The new directory keeps everything the old one had (graphs copied unchanged, so their sha256 still hold),
so every command that ran the old one runs it too; its manifest gains a `generate` entry. The tokenizer
files are written again, so they carry the <s> ... </s> post-processor.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import onnx
from tqdm import tqdm

from ..artifacts.manifest import write_manifest
from ..artifacts.model_dir import ModelDir, file_hashes
from ..artifacts.records import GraphEntry, ModelManifest
from ..artifacts.staging import staged_directory
from ..core.config import ModelConfig
from ..core.errors import TfmExportError
from ..core.files import file_sha256
from ..core.generate_spec import GENERATE_FILE, MIN_ONNXRUNTIME, OP, OP_MAX_LENGTH
from ..core.graph_spec import CONTRACT_GRAPHS, Graph
from ..core.token_rules import SEED_RULES
from ..core.tokenizer import BOS_ID, EOS_ID, PAD_ID
from ..runtime.backends import CONCAT, GENERATE, open_backend
from ..runtime.prepacked import prepack_new
from ..runtime.search import SearchOptions
from .generate import generate_graph, op_refusal
from .inputs import random_sources
from .onnx_io import load_graph, save_graph, tensors_of

CHECK_ROWS, CHECK_SOURCE, CHECK_STEPS, CHECK_BEAM = 4, 16, 12, 4  # the closing check's decodes


def write_generate_dir(model_dir: Path, output: Path, early_stopping: bool = False, force: bool = False,
                       progress: bool = True) -> ModelManifest:
    """Write `output`: `model_dir` plus generate.onnx; returns the new manifest. Refuses, before any work,
    a directory whose graphs the BeamSearch op cannot take, saying why."""
    source = ModelDir.read(model_dir)
    manifest, cfg = source.manifest, source.config  # the new manifest copies the old one
    if manifest.token_rules is not None:
        raise TfmExportError(f"{model_dir}: generate.onnx is built for the seed's token layout; a Hugging Face model "
                             "decodes with `tfm-run translate` on the model directory itself")
    refusal = op_refusal(source)
    if refusal:
        raise TfmExportError(refusal)
    vocab = source.vocabulary()
    shared = {entry.data for entry in manifest.graphs.values()} - {None}  # the external layout's file
    # in the external layout the subgraphs keep their references into the shared file, which is copied beside
    graphs = {g: load_graph(source, g.value, external_data=not shared) for g in CONTRACT_GRAPHS}
    with staged_directory(output, force, keep=(model_dir,)) as staging, \
            tqdm(total=3, desc="generate", disable=not progress) as bar:
        proto = generate_graph(graphs[Graph.ENCODER], graphs[Graph.DECODER_STEP], cfg, early_stopping)
        if shared:
            onnx.save_model(proto, staging / GENERATE_FILE)
        else:
            save_graph(proto, staging / GENERATE_FILE)
        bar.update()
        source.verified_graphs()
        for entry in source.manifest.graphs.values():  # the contract's graphs and any other listed, each file once
            for path in (source.path / entry.file, source.path / entry.data_file):
                if path.is_file() and not (staging / path.name).exists():
                    shutil.copyfile(path, staging / path.name)
        for side, name in manifest.tokenizer.items():
            getattr(vocab, side).save(staging / name)
        files = {**manifest.files, **file_hashes(staging, source.tokenizer_files)}
        op = {"op": OP, "model_type": 1, "early_stopping": early_stopping,
              "special_tokens": {"decoder_start": BOS_ID, "eos": EOS_ID, "pad": PAD_ID, "never_generated": PAD_ID},
              "max_length": min(cfg.n_position + 1, OP_MAX_LENGTH),
              "min_onnxruntime": ".".join(map(str, MIN_ONNXRUNTIME)),
              "note": "max_length and min_length count the decoder start token <s>; sequences start with it and "
                      "are padded with <blank>; </s> is not written; sequences_scores are summed log-probabilities "
                      "/ (length with <s>) ** length_penalty"}
        entry = GraphEntry(GENERATE_FILE, file_sha256(staging / GENERATE_FILE), tensors_of(proto.graph.input),
                           tensors_of(proto.graph.output), shared.pop() if shared else None, extra=op)
        new = dataclasses.replace(manifest, files=files, generate=entry)
        write_manifest(staging, new)
        bar.update()
        check_generate(staging, cfg, output)
        prepack_new(staging, output)  # its onnxruntime backend opens the same two graphs as the model directory's
        bar.update()
    return new


def check_generate(directory: Path, cfg: ModelConfig, shown: Path | None = None) -> None:
    """generate.onnx decodes as the decoding loop over the same directory's graphs: greedy, and beam search with
    </s> barred until the length limit (so neither side's stopping rule decides). The loop takes one source at a
    time without padding, as the backend sends it: int8 dynamic graphs quantize activations with each call's own
    range, padding included."""
    loop, generate = (open_backend(directory, backend).searcher for backend in (CONCAT, GENERATE))
    src = random_sources(cfg.src_vocab_size, CHECK_ROWS, min(cfg.n_position, CHECK_SOURCE), seed=0)
    steps = min(cfg.n_position, CHECK_STEPS)
    alone = [row[None, :int((row != PAD_ID).sum())] for row in src]
    greedy, beam = SearchOptions(steps), SearchOptions(steps, CHECK_BEAM, min_length=steps)

    def tokens(searcher, rows: np.ndarray, options: SearchOptions) -> list[tuple[int, ...]]:
        return [h[0].tokens for h in searcher.search(rows, options, SEED_RULES)]
    cases = {"greedy": ([tokens(loop, row, greedy)[0] for row in alone], tokens(generate, src, greedy)),
             f"beam {CHECK_BEAM}": (tokens(loop, src[:1], beam), tokens(generate, src[:1], beam))}
    for name, (want, got) in cases.items():
        if want != got:
            rows = int(np.sum([w != g for w, g in zip(want, got, strict=True)]))
            raise TfmExportError(f"{(shown or directory) / GENERATE_FILE}: {name} decodes differ from the decoding "
                                 f"loop's on {rows} of {len(want)} sources; the graph is not trustworthy, please "
                                 "report this model")
