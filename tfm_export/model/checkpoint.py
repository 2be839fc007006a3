"""Load and save checkpoints: the project's own format and the seed code's train.py format.

Every load goes through `torch.load(weights_only=True)` with exactly one extra class allowed
(`argparse.Namespace`, the seed's saved settings); anything else in a pickle is refused with its
name, never executed. A fixed pipeline like CTranslate2's converters: read -> classify -> config ->
validate every weight by name and shape -> build the model -> attach the vocabulary.
"""

from __future__ import annotations

import argparse
import pickletools
import re
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..artifacts.manifest import CHECKPOINT_SUFFIXES, HF_CONFIG_FILE, checkpoint_inside, is_hf_directory
from ..core.config import ModelConfig
from ..core.errors import CheckpointError, VocabularyError, first_line
from ..core.files import contained_file, file_sha256, write_atomically
from ..core.token_rules import SEED_RULES, TokenRules
from ..core.tokenizer import Vocabulary, load_tokenizer, tokenizer_files
from .transformer import Transformer

FORMAT_NAME = "tfm-export-checkpoint"
CHECKPOINT_FILE = "ckpt.pt"  # what random-checkpoint and train-demo write into their --output directory
FORMAT_VERSION = 1
ALLOWED_GLOBALS = (argparse.Namespace,)
SEED_KEYS = {"settings", "model"}
# Names under which the seed stores one tensor several times when weights are shared.
SHARED_WEIGHTS = {
    "proj_share_weight": ("trg_word_prj.weight", "decoder.trg_word_emb.weight"),
    "embs_share_weight": ("encoder.src_word_emb.weight", "decoder.trg_word_emb.weight"),
}


HUGGINGFACE = "huggingface"  # the kind of a checkpoint read from a Hugging Face model directory


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    kind: str  # "tfm-export", "seed" or HUGGINGFACE
    config: ModelConfig
    model: Transformer  # in eval mode
    vocab: Vocabulary
    sha256: str
    rules: TokenRules = SEED_RULES
    model_type: str | None = None  # a Hugging Face checkpoint's family (config.json's model_type)


def checkpoint_files(ckpt: Checkpoint) -> list[Path]:
    """The files a checkpoint's weights were read (mapped) from: the file, or a Hugging Face directory's weights."""
    if ckpt.path.is_file():
        return [ckpt.path]
    return [p for p in ckpt.path.iterdir() if p.is_file() and p.suffix in CHECKPOINT_SUFFIXES + (".safetensors",)]


def _pickle_globals(path: Path) -> list[str]:
    """Globals a plain (non-zip) pickle would import, found without executing it."""
    found, strings = [], []
    try:
        with open(path, "rb") as f:
            for opcode, arg, _ in pickletools.genops(f):
                if opcode.name == "GLOBAL":
                    found.append(str(arg).replace(" ", "."))
                elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                    found.append(f"{strings[-2]}.{strings[-1]}")
                elif isinstance(arg, str):
                    strings.append(arg)
    except Exception:  # not a pickle stream at all; torch.load will say what it is
        pass
    return found


def _unsafe_globals(path: Path) -> list[str]:
    allowed = {f"{cls.__module__}.{cls.__qualname__}" for cls in ALLOWED_GLOBALS}
    if zipfile.is_zipfile(path):
        try:
            names = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
        except Exception:
            return []
    else:
        names = [n for n in _pickle_globals(path)
                 if not n.startswith("torch.") and n != "collections.OrderedDict"]
    return sorted(set(names) - allowed)


def _refusal(path: Path, names: list[str]) -> CheckpointError:
    return CheckpointError(
        f"{path}: refused: the pickle wants to import {', '.join(names)}, which a checkpoint never needs "
        "(only tensors, numbers, strings and argparse.Namespace are allowed); if you trust the file, "
        "re-save just its state_dict and settings")


def read_checkpoint_file(path: Path) -> dict[str, Any]:
    """torch.load with weights_only=True, every failure turned into one clear line."""
    if not path.exists():
        raise CheckpointError(f"{path}: checkpoint not found")
    if path.is_dir():
        inside = checkpoint_inside(path)
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file; " + (
            f"pass the checkpoint inside it, {inside}" if inside else
            f"pass a checkpoint file, or a Hugging Face model directory (with {HF_CONFIG_FILE})"))
    if not path.is_file():
        raise CheckpointError(f"{path}: is a pipe or device, not a checkpoint file")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: checkpoint file is empty")
    with open(path, "rb") as f:
        if f.read(4) == b"PK\x03\x04" and not zipfile.is_zipfile(path):
            raise CheckpointError(f"{path}: truncated or corrupt checkpoint (its zip archive is incomplete); "
                                  "copy or save it again")
    unsafe = _unsafe_globals(path)
    if unsafe:
        raise _refusal(path, unsafe)
    try:
        with torch.serialization.safe_globals(list(ALLOWED_GLOBALS)), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # mapped, not read: the weights stay the file's pages (a model of any size is held once, by the page
            # cache), which a legacy (pre-zip) checkpoint cannot be
            data = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except RuntimeError as exc:
        if "zip archive" in str(exc) or "central directory" in str(exc):
            raise CheckpointError(f"{path}: truncated or corrupt checkpoint (its zip archive is incomplete); "
                                  "copy or save it again") from None
        raise CheckpointError(f"{path}: not a readable PyTorch checkpoint ({first_line(exc)})") from None
    except EOFError:
        raise CheckpointError(f"{path}: truncated checkpoint (file ends early); copy or save it again") from None
    except Exception as exc:  # UnpicklingError, KeyError, ... from a file that is not a checkpoint
        refused = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        if refused:  # legacy (pre-zip) files are only checked while loading
            raise _refusal(path, [refused.group(1)]) from None
        raise CheckpointError(f"{path}: not a PyTorch checkpoint (torch.load cannot read it); "
                              "pass the .pt/.chkpt file that training saved") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: holds a {type(data).__name__}, expected a checkpoint dict")
    return data


def classify(data: dict[str, Any], path: Path) -> tuple[str, ModelConfig, dict[str, torch.Tensor]]:
    """Which format this is, the config it implies and its state_dict."""
    kind, make_config = _format_of(data, path)
    try:
        return kind, make_config(), data["model"]
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: {exc}") from None


def _format_of(data: dict[str, Any], path: Path) -> tuple[str, Callable[[], ModelConfig]]:
    if data.get("format") == FORMAT_NAME:
        if data.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(f"{path}: checkpoint format version {data.get('format_version')} is not "
                                  f"supported (this tool reads {FORMAT_VERSION}); upgrade tfm-export")
        if not isinstance(data.get("config"), dict) or not isinstance(data.get("model"), dict):
            raise CheckpointError(f"{path}: damaged {FORMAT_NAME}: 'config' and 'model' must both be dicts; "
                                  "save it again")
        return "tfm-export", lambda: ModelConfig.from_dict(data["config"])
    if SEED_KEYS <= data.keys():
        if not isinstance(data["model"], dict):
            raise CheckpointError(f"{path}: 'model' is a {type(data['model']).__name__}, expected a state_dict")
        if not isinstance(data["settings"], argparse.Namespace):
            raise CheckpointError(f"{path}: 'settings' is a {type(data['settings']).__name__}, "
                                  "expected the argparse.Namespace the seed's train.py saves")
        return "seed", lambda: ModelConfig.from_seed_settings(data["settings"])
    keys = ", ".join(sorted(map(str, data))[:6]) or "nothing"
    raise CheckpointError(f"{path}: not a Transformer checkpoint this tool knows (found keys {keys}; "
                          f"expected 'settings' and 'model' from the seed's train.py, or a {FORMAT_NAME})")


def validate_state_dict(state: dict[str, Any], config: ModelConfig, path: Path,
                        names: dict[str, str] | None = None) -> None:
    """Every expected weight present with its shape, nothing surplus, float and finite, shared weights equal.
    The expected shapes come from a model built on the meta device, so a config that claims sizes the
    weights do not have is refused before anything of that size is allocated. `names`: our name -> the name
    the user's file gives the tensor, for the messages (converted checkpoints)."""
    with torch.device("meta"):
        expected = Transformer(config).state_dict()
    name = (names or {}).get
    problems = [f"missing {name(k, k)}" for k in expected if k not in state]
    problems += [f"unexpected {name(k, k)}" for k in state if k not in expected]
    problems += [f"{name(k, k)} is a {type(state[k]).__name__}, not a tensor"
                 for k in expected if k in state and not isinstance(state[k], torch.Tensor)]
    problems += [
        f"{name(k, k)} has shape {tuple(state[k].shape)}, the config needs {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and isinstance(state[k], torch.Tensor) and state[k].shape != v.shape
    ]
    if not problems:
        problems = _value_problems({k: state[k] for k in expected}, config, name)
    if problems:
        shown = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
        raise CheckpointError(f"{path}: weights do not fit the model config: {shown}")


def _value_problems(state: dict[str, torch.Tensor], config: ModelConfig,
                    name: Callable[[str, str], str]) -> list[str]:
    """Integer or non-finite weights would decode to garbage with exit 0: name the tensor instead."""
    problems = [f"{name(k, k)} holds {t.dtype} values, not floating point" for k, t in state.items()
                if not t.is_floating_point()]
    problems += [f"{name(k, k)} holds NaN or infinite values" for k, t in state.items()
                 if t.is_floating_point() and not _all_finite(t)]
    return problems or [f"{name(a, a)} and {name(b, b)} should be one shared tensor but differ"
                        for flag, (a, b) in SHARED_WEIGHTS.items()
                        if getattr(config, flag) and not torch.equal(state[a], state[b])]


def _all_finite(tensor: torch.Tensor, block: int = 1 << 22) -> bool:
    """A block of elements at a time: isfinite's temporaries for a 256k-row embedding table are a gigabyte."""
    flat = tensor.reshape(-1)
    return all(bool(torch.isfinite(part).all()) for part in flat.split(block))


def build_model(config: ModelConfig, state: dict[str, torch.Tensor], path: Path, checked: bool = False
                ) -> Transformer:
    """The model over the checkpoint's own tensors (mapped from the file where torch.load could map it); checked:
    validate_state_dict has passed them already (a converted checkpoint's: reading gigabytes twice costs seconds)."""
    if not checked:
        validate_state_dict(state, config, path)
    return Transformer.over(config, state)


def _vocab_from_files(files: list[Path], config: ModelConfig) -> Vocabulary:
    if len(files) not in (1, 2):
        raise VocabularyError("give --vocab once (shared vocabulary) or twice (source, then target)")
    if len(files) == 1 and config.src_vocab_size != config.trg_vocab_size:
        raise VocabularyError(f"{files[0]}: one vocabulary for a model whose source and target vocabularies differ "
                              f"({config.src_vocab_size} and {config.trg_vocab_size}); give --vocab twice")
    source = load_tokenizer(files[0], config.src_vocab_size, "source")
    return Vocabulary(source, load_tokenizer(files[1], config.trg_vocab_size, "target") if len(files) == 2 else source)


def _stored_vocab_files(data: dict[str, Any], path: Path) -> list[Path]:
    """The tokenizer files the checkpoint names: plain names of files beside it, never a path elsewhere."""
    names = data.get("tokenizer")
    if not isinstance(names, dict) or not {"source", "target"} <= names.keys():
        raise VocabularyError(f"{path}: checkpoint names no source and target tokenizer; pass --vocab FILE")
    files = [contained_file(path.parent, names[side], VocabularyError, f"{side} tokenizer named by {path.name}",
                            "pass --vocab FILE") for side in ("source", "target")]
    return files[:1] if files[0] == files[1] else files


def _refuse_part_of_hf_directory(path: Path) -> None:
    """A file of a Hugging Face model directory (model.safetensors, config.json) given for the directory."""
    if path.suffix not in CHECKPOINT_SUFFIXES and is_hf_directory(path.parent):
        raise CheckpointError(f"{path}: is one file of the Hugging Face model directory {path.parent}; pass the "
                              f"directory itself, {path.parent}")
    if path.suffix == ".safetensors":
        raise CheckpointError(f"{path}: holds weights without the model's config; pass the Hugging Face model "
                              f"directory they belong to ({HF_CONFIG_FILE}, weights and tokenizer files)")


def load_own_checkpoint(path: Path, vocab: list[Path] | None = None) -> Checkpoint:
    """Load the project's format or a seed checkpoint; `vocab` overrides (own format) or supplies (seed) the
    vocabulary."""
    _refuse_part_of_hf_directory(path)
    data = read_checkpoint_file(path)
    kind, config, state = classify(data, path)
    model = build_model(config, state, path)
    if vocab:
        files = list(vocab)
    elif kind == "seed":
        raise VocabularyError(f"{path}: seed-format checkpoints carry no vocabulary; pass --vocab FILE "
                              "(tokenizers JSON, JSON list/dict, or one token per line)")
    else:
        files = _stored_vocab_files(data, path)
    return Checkpoint(path, kind, config, model, _vocab_from_files(files, config), file_sha256(path))


def check_checkpoint_output(path: Path, shared: bool, force: bool) -> None:
    """Before slow work (training): a checkpoint or tokenizer already there is replaced only with --force."""
    if path.parent.exists() and not path.parent.is_dir():
        raise CheckpointError(f"{path.parent}: exists and is not a directory; choose another --output")
    present = [p for p in (path, *(path.parent / n for n in set(tokenizer_files(shared).values()))) if p.exists()]
    if present and not force:
        raise CheckpointError(f"{present[0]}: already exists; pass --force to replace it or choose another --output")


def save_checkpoint(model: Transformer, vocab: Vocabulary, path: str | Path,
                    extra: dict[str, Any] | None = None, force: bool = True) -> Path:
    """Save the project's format: config + state_dict + tokenizer file names, tokenizers beside it.
    force=False refuses to replace an existing checkpoint or tokenizer (what the commands pass by default)."""
    path = Path(path)
    if not path.parent.is_dir():
        raise CheckpointError(f"{path.parent}: output directory does not exist")
    check_checkpoint_output(path, vocab.shared, force)
    names = tokenizer_files(vocab.shared)
    payload = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "config": model.config.to_dict(),
               "model": model.state_dict(), "tokenizer": names, **(extra or {})}
    files = {path.parent / names[side]: getattr(vocab, side).save for side in ("source", "target")}
    files[path] = lambda tmp: torch.save(payload, tmp)
    write_atomically(files, "checkpoint", CheckpointError)
    return path
