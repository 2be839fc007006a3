"""Hostile artifacts made in-process: checkpoints changed after loading, tampered graphs, external data, and model
directory surgery (manifest edits, hashes brought back in line so that only containment or contract checks can
refuse a change)."""

from __future__ import annotations

import hashlib
import io
import json
import os
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# Changes a loaded checkpoint in place (returning None), or returns what is saved instead: an object (torch.save)
# or bytes (written as they are).
Change = Callable[[dict], Any]


def forge_checkpoint(src: Path, dst: Path, change: Change) -> None:
    import torch
    ck = torch.load(src, map_location="cpu", weights_only=False)
    out = change(ck)
    out = ck if out is None else out
    if isinstance(out, bytes):
        dst.write_bytes(out)
    else:
        torch.save(out, dst)


def config(**values: Any) -> Change:
    """Settings in the checkpoint's config."""
    return lambda ck: ck["config"].update(values)


def top(**values: Any) -> Change:
    """Top-level fields of the checkpoint."""
    return lambda ck: ck.update(values)


def without(*keys: str, inner: str = "") -> Change:
    """Fields removed, from the checkpoint or from one of its dicts."""
    def change(ck: dict) -> None:
        for key in keys:
            del (ck[inner] if inner else ck)[key]
    return change


def weight(key: str, make: Callable[[dict], Any]) -> Change:
    """A weight set to make(state dict)."""
    def change(ck: dict) -> None:
        ck["model"][key] = make(ck["model"])
    return change


def weight_entry(key: str, index: Any, value: float) -> Change:
    """One entry of a weight set to value."""
    def change(ck: dict) -> None:
        ck["model"][key][index] = value
    return change


def all_weights(make: Callable[[Any], Any]) -> Change:
    """Every weight replaced by make(weight)."""
    return lambda ck: ck.update(model={k: make(v) for k, v in ck["model"].items()})


def seed_layout(ck: dict) -> dict:
    """The seed repository's layout: training settings as a Namespace, the weights, no vocabulary."""
    st = ck["config"]
    settings = Namespace(src_vocab_size=st["src_vocab_size"], trg_vocab_size=st["trg_vocab_size"], src_pad_idx=1,
                         trg_pad_idx=1, d_model=16, d_word_vec=16, d_inner_hid=32, d_k=8, d_v=8, n_head=2, n_layers=1,
                         dropout=0.1, proj_share_weight=True, embs_share_weight=True, scale_emb_or_prj="prj",
                         max_token_seq_len=100)
    return {"epoch": 3, "settings": settings, "model": ck["model"]}


def saved_bytes(ck: Any, **kwargs: Any) -> bytes:
    import torch
    buf = io.BytesIO()
    torch.save(ck, buf, **kwargs)
    return buf.getvalue()


class Payload:
    """Runs a shell command when unpickled: weights-only loading must never let it."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple:
        return (os.system, (self.command,))


# --------------------------------------------------------------------------------------------------
# graphs
# --------------------------------------------------------------------------------------------------

def tamper_graph(src: Path, dst: Path) -> None:
    """The first float initializer scaled and shifted: a valid graph that computes something else."""
    import numpy as np
    import onnx
    from onnx import numpy_helper
    m = onnx.load(str(src))
    for init in m.graph.initializer:
        a = numpy_helper.to_array(init)
        if a.dtype == np.float32 and a.size > 1:
            init.CopyFrom(numpy_helper.from_array((a * 0.5 + 0.25).astype(np.float32), init.name))
            break
    onnx.save(m, str(dst))


def external_data(mdir: Path, graph: str) -> None:
    """One graph of a model directory saved with its weights in GRAPH.data."""
    import onnx
    p = mdir / graph
    onnx.save_model(onnx.load(str(p)), str(p), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=graph + ".data", size_threshold=1024)


# --------------------------------------------------------------------------------------------------
# model directory surgery
# --------------------------------------------------------------------------------------------------

def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def save_manifest(d: Path, m: Any) -> None:
    (d / "manifest.json").write_text(json.dumps(m, indent=2))


def edit_manifest(d: Path, change: Callable[[dict], None]) -> None:
    m = load_manifest(d)
    change(m)
    save_manifest(d, m)


def rehash(d: Path, extra: list[str] = ()) -> None:
    """Make the manifest agree with whatever files it now names."""
    m = load_manifest(d)
    for entry in m["graphs"].values():
        p = d / entry["file"]
        if p.is_file():
            entry["sha256"] = sha(p)
    tok = m.get("tokenizer", {})
    names = set(m.get("files", {})) | set(extra) | ({tok.get("source"), tok.get("target")} - {None})
    files = {}
    for name in names:
        p = d / name
        if isinstance(name, str) and p.is_file():
            files[name] = sha(p)
        elif name in m.get("files", {}):
            files[name] = m["files"][name]
    m["files"] = files
    save_manifest(d, m)


def _parent(m: dict, dotted: str) -> tuple[dict, str]:
    *parts, last = dotted.split(".")
    for p in parts:
        m = m[p]
    return m, last


def set_dotted(m: dict, dotted: str, value: Any) -> None:
    node, key = _parent(m, dotted)
    node[key] = value


def del_dotted(m: dict, dotted: str) -> None:
    node, key = _parent(m, dotted)
    del node[key]


def nested_json(depth: int, kind: str = "list") -> str:
    if kind == "list":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


def swap_tokens(path: Path) -> None:
    """A tokenizer that still parses, with two words' ids exchanged."""
    data = json.loads(path.read_text())
    vocab = data["model"]["vocab"]
    a, b = [w for w in vocab if not w.startswith("<")][1:3]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    path.write_text(json.dumps(data, indent=2))


def fill(path: Path) -> None:
    """Fill the file system holding `path` (a small tmpfs) to the last byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for size in (65536, 4096, 1):
            while True:
                try:
                    if os.write(fd, b"\0" * size) < size:
                        break
                except OSError:
                    break
    finally:
        os.close(fd)
