"""checkpoint -> model directory: export both graphs, check them, prove parity, write atomically."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import onnx
import torch
from tqdm import tqdm

from .. import __version__
from ..artifacts.manifest import MODEL_FORMAT, MODEL_FORMAT_VERSION, write_manifest
from ..artifacts.model_dir import file_hashes
from ..artifacts.records import GraphEntry, ModelManifest, SourceCheckpoint
from ..artifacts.staging import staged_directory
from ..core.errors import TfmExportError
from ..core.graph_spec import DEFAULT_OPSET, LOGITS, Graph, all_specs
from ..core.memory import release_file_pages
from ..core.token_rules import SEED_RULES
from ..core.tokenizer import SENTENCEPIECE_FILE, SPECIAL_IDS, tokenizer_files
from ..model.checkpoint import Checkpoint, checkpoint_files
from ..runtime.backends import each_graph_decoder
from ..runtime.prepacked import prepack_new
from ..runtime.prepacked_graphs import stamp_new
from ..runtime.session import SessionOptions
from .export import export_graph, export_specs
from .inputs import random_sources, random_targets
from .parity import DEFAULT_TOLERANCE, FLOAT32_NOISE_FACTOR, Reference, compare_stepwise, float32_noise
from .saving import EXTERNAL_DATA_BYTES, GraphSaver, check_room, weight_bytes

NOT_SAVED_REASON = (
    "its only fusion for this architecture is SkipLayerNormalization, a com.microsoft contrib op that TensorRT "
    "and other runtimes cannot load; ONNX Runtime applies the same fusion itself when a session opens the graph "
    "(measured: no speed difference), so the saved graphs keep standard ONNX ops")
# the graphs' maths, as lean as it loads: the weights read where they lie in the file, none copied (so no pre-packed
# graph is opened); the stamps the export just wrote trusted, no file hashed again
PARITY_OPTIONS = SessionOptions(prepacking=False, prepacked_graphs=True, constant_folding=False, memory_arena=False)
PARITY_ROWS = 2  # sources of different lengths: the padding masks at work
PARITY_PADDED = 32  # positions of the padded batch's longest source (the longest source has a batch of its own)
PARITY_LOGITS_BYTES = 32 << 20  # PyTorch's and ONNX Runtime's logits over the whole target, each
UNOPTIMIZED_REASON = (
    "left to ONNX Runtime in the external layout: it folds the same shape arithmetic when a session opens, and on a "
    "large model's graphs the optimizer's passes take minutes for node counts that do not matter beside the GEMMs")
log = logging.getLogger(__name__)


def _metadata(ckpt: Checkpoint, opset: int, graph: Graph) -> dict[str, str]:
    """What each graph carries about itself in metadata_props (the manifest says the same and more)."""
    return {"tfm_export.format": MODEL_FORMAT, "tfm_export.version": __version__, "tfm_export.graph": graph.value,
            "tfm_export.config": ckpt.config.to_json(), "tfm_export.precision": "fp32",
            "tfm_export.opset": str(opset), "tfm_export.max_positions": str(ckpt.config.n_position),
            "tfm_export.special_tokens": ",".join(f"{k}={v}" for k, v in special_tokens(ckpt).items()),
            "tfm_export.source_checkpoint_sha256": ckpt.sha256}


def special_tokens(ckpt: Checkpoint) -> dict[str, int]:
    """The seed's layout, or a pretrained model's own ids (its token_rules say the rest)."""
    if ckpt.rules == SEED_RULES:
        return SPECIAL_IDS
    return {"pad": ckpt.rules.pad, "bos": ckpt.rules.start, "eos": ckpt.rules.eos}


def build_manifest(ckpt: Checkpoint, opset: int, hashes: dict[Graph, str], files: dict[str, str],
                   applied: list[str]) -> ModelManifest:
    cfg = ckpt.config
    specs = all_specs(cfg)
    spm = ckpt.vocab.source.sentencepiece
    return ModelManifest(
        format=MODEL_FORMAT, format_version=MODEL_FORMAT_VERSION, tool_version=__version__,
        model=cfg.to_dict(), precision="fp32", opset=opset, optimizations=applied,
        optimizations_not_applied={"onnxruntime.transformers fusions": NOT_SAVED_REASON},
        special_tokens=special_tokens(ckpt),
        token_rules=None if ckpt.rules == SEED_RULES else ckpt.rules.to_dict(),
        limits={"max_source_length": cfg.n_position, "max_target_length": cfg.n_position,
                "note": "source length counts <s> and </s>; past + new decoder tokens (with <s>) "
                        "must stay <= max_target_length"},
        tokenizer=tokenizer_files(ckpt.vocab.shared),
        sentencepiece=spm.manifest_entry() if spm else None,
        graphs={g.value: GraphEntry.from_dict({**specs[g].to_dict(), "sha256": sha256})
                for g, sha256 in hashes.items()},
        files=files,
        # its name, not its path: the directory is shipped and served on machines where that path means nothing
        source_checkpoint=SourceCheckpoint(ckpt.sha256, ckpt.path.name, ckpt.kind, ckpt.model_type or None))


def check_parity(ckpt: Checkpoint, directory: Path, steps: int = 3, seed: int = 0) -> float:
    """Export ends by comparing ONNX Runtime with PyTorch on two batches: the longest source the model takes, alone,
    and PARITY_ROWS shorter sources of different lengths, padded (the masks at work), each with a target as long
    as the model takes (shorter where its logits would pass PARITY_LOGITS_BYTES: a 256k vocabulary's at its first
    16 positions); a few steps with the cache fed back, every decoder graph of the directory opened through the
    runtime's door, one at a time (PyTorch's outputs computed once for all, the encoder run once per batch),
    without pre-packed weights or constant folding (the same maths, with no copy of the weights: a large model's
    memory and load time). Raises beyond the default Tolerance."""
    cfg = ckpt.config
    length = min(cfg.n_position, max(steps, PARITY_LOGITS_BYTES // (PARITY_ROWS * cfg.trg_vocab_size * 4)))
    batches = {"longest source": (1, cfg.n_position), "padded": (PARITY_ROWS, min(cfg.n_position, PARITY_PADDED))}
    references = {label: Reference.of(ckpt.model, random_sources(cfg.src_vocab_size, rows, size, seed, cfg.src_pad_idx),
                                      random_targets(cfg.trg_vocab_size, rows, length, seed, cfg.trg_pad_idx))
                  for label, (rows, size) in batches.items()}
    release_file_pages(checkpoint_files(ckpt))  # PyTorch's part is done: its mapped weights need not stay
    small = weight_bytes(ckpt.model) < EXTERNAL_DATA_BYTES
    diffs, encoded = [], {}
    for name, backend in each_graph_decoder(directory, PARITY_OPTIONS):
        # the encoder is every backend's: run once per batch, its outputs given to each; the step variants take one
        # token per call, so the whole target is as many calls: made where the model is small (a large one's
        # graphs are the same code at every position)
        contract = name == Graph.DECODER_STEP.value
        for label, ref in references.items():
            if label not in encoded:
                encoded[label] = backend.run_encoder(ref.src)
            diffs += [dataclasses.replace(d, name=f"{d.name} ({label})")
                      for d in compare_stepwise(ref, backend, ref.src, ref.trg, steps, encoder=contract,
                                                whole=contract or small, encoded=encoded[label])]
        del backend
    failed = [d for d in diffs if not d.within(DEFAULT_TOLERANCE)]
    noise = max(float32_noise(ckpt.model, r.src, r.trg) for r in references.values()) \
        if failed and all(LOGITS in d.name for d in failed) else 0.0
    failed = [d for d in failed if d.max_abs > FLOAT32_NOISE_FACTOR * noise]
    if failed:
        worst = failed[0]
        raise TfmExportError(f"exported graphs differ from PyTorch: {worst.name} by {worst.max_abs:.2e} "
                             f"({DEFAULT_TOLERANCE}; PyTorch's own float32 error {noise:.1e}); the export is not "
                             "trustworthy, please report this config")
    return max(d.max_abs for d in diffs)


def export_model_dir(ckpt: Checkpoint, output: Path, opset: int = DEFAULT_OPSET, optimize: bool = True,
                     force: bool = False, progress: bool = True, prepacked: bool | None = None,
                     external_data: bool | None = None) -> ModelManifest:
    """Write the model directory (docs/graph-contract.md); returns its manifest. One graph at a time: traced, its
    weights written as it is saved, checked on disk, and let go before the next. external_data: every graph's
    weights in one shared file (WEIGHTS_FILE), each tensor once (None: for a model of EXTERNAL_DATA_BYTES or
    more). prepacked: with the graphs ONNX Runtime opens on this machine's CPU pre-packed (runtime.prepacked_graphs),
    made last, from the checked directory (None: for the inline layout's models only)."""
    torch.manual_seed(0)
    inputs = (ckpt.path, *(Path(t.origin) for t in (ckpt.vocab.source, ckpt.vocab.target)))
    specs = export_specs(ckpt.model, opset)
    external = weight_bytes(ckpt.model) >= EXTERNAL_DATA_BYTES if external_data is None else external_data
    check_room(ckpt.model, output, external)
    with (staged_directory(output, force, keep=inputs) as staging,
          tqdm(total=len(specs) + 2, desc="export", disable=not progress) as bar,
          GraphSaver(staging, ckpt.config.tied_table, external) as saver):
        for graph, spec in specs.items():
            bar.set_postfix_str(graph.value)
            exported = export_graph(ckpt.model, spec, opset, optimize, one_file=external)
            onnx.helper.set_model_props(exported.proto, _metadata(ckpt, opset, graph))
            saver.save(exported, spec)
            del exported
            bar.update()
        weights = saver.close()
        tokenizers = tokenizer_files(ckpt.vocab.shared)
        for side, name in tokenizers.items():
            getattr(ckpt.vocab, side).save(staging / name)
        spm = ckpt.vocab.source.sentencepiece
        if spm:
            (staging / SENTENCEPIECE_FILE).write_bytes(spm.proto)
        applied = ["tied weights stored once"]
        if optimize and not external:
            applied.insert(0, "onnxscript optimizer: constant folding, dead code elimination")
        files = file_hashes(staging, [*tokenizers.values(), *([SENTENCEPIECE_FILE] if spm else [])]) | weights
        manifest = build_manifest(ckpt, opset, saver.hashes, dict(sorted(files.items())), applied)
        saver.describe(manifest)
        if optimize and external:
            manifest.optimizations_not_applied["onnxscript optimizer"] = UNOPTIMIZED_REASON
        write_manifest(staging, manifest)
        if external:  # the parity check's loads, and later ones, need not read gigabytes to check the files
            stamp_new(staging, {**files, **{g.filename: sha256 for g, sha256 in saver.hashes.items()}})
        bar.set_postfix_str("parity")
        worst = check_parity(ckpt, staging)
        log.info("parity with PyTorch: max abs difference %.2e", worst)
        bar.update()
        if prepacked or (prepacked is None and not external):
            bar.set_postfix_str("prepack")
            prepack_new(staging, output)
        elif prepacked is None and external:  # the stamps alone (above)
            log.warning("%s: pre-packed graphs left out (the external layout's default: for a large model they "
                        "add about as much again on disk, and to this export's memory); `tfm-export prepack "
                        "--model %s` makes them", output, output)
        bar.update()
    return manifest
