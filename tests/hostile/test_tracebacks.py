"""Tracebacks: damaged or absurd checkpoints, manifests, graphs, tokenizers, vocabularies, options and outputs, each
of which must end in one clean line (or, where harmless, succeed), never a traceback."""

from __future__ import annotations

import io
import json
import math
import os
import re
import shutil
import subprocess
import zipfile
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from . import forge
from .commands import WRITERS, checkpoint_run, reader_run, writer_out_names, writer_run
from .scratch import Case
from .support import TINY_SENT, Result, SilentWrong, assert_expected, assert_ok_or_refused, assert_refused, same_output

FOUR_READERS = ("translate", "inspect", "check", "quantize")

# -- deeply nested JSON -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind,reader", [pytest.param(k, r, id=f"{k}/{r}")
                                         for k in ("whole-list", "whole-dict", "inner") for r in FOUR_READERS])
def test_deep_json_manifest(case: Case, kind: str, reader: str) -> None:
    m = case.copy_model(case.fx.tiny())
    mf = m / "manifest.json"
    if kind == "inner":  # a valid manifest with one deeply nested value inside
        mf.write_text(mf.read_text().replace('"tool":', f'"deep": {forge.nested_json(100_000)}, "tool":', 1))
        assert_ok_or_refused(reader_run(case, reader, m))
    else:
        mf.write_text(forge.nested_json(100_000, kind.removeprefix("whole-")))
        assert_refused(reader_run(case, reader, m))


@pytest.mark.parametrize("kind,reader", [pytest.param(k, r, id=f"{k}/{r}") for r in FOUR_READERS
                                         for k in ("whole", "inner")])
def test_deep_json_tokenizer(case: Case, kind: str, reader: str) -> None:
    m = case.copy_model(case.fx.tiny())
    tok = m / "tokenizer.json"
    if kind == "whole":
        tok.write_text(forge.nested_json(100_000))
    else:
        text = json.dumps(json.loads(tok.read_text()))
        tok.write_text(text.replace('"truncation": null', f'"truncation": {forge.nested_json(100_000)}', 1))
    forge.rehash(m)
    assert_refused(reader_run(case, reader, m))


# -- vocabularies for seed checkpoints --------------------------------------------------------------

def vocab_run(case: Case, command: str, name: str, content: bytes) -> Result:
    """A seed checkpoint exported or run with a vocabulary file."""
    ck = case.copy_ck(case.fx.seed())
    return checkpoint_run(case, command, ck, "--vocab", case.text(name, content))


@pytest.mark.parametrize("kind,command", [pytest.param(k, c, id=f"{k}/{c}") for c in ("onnx", "translate")
                                          for k in ("list", "dict")])
def test_deep_json_vocab(case: Case, kind: str, command: str) -> None:
    assert_refused(vocab_run(case, command, "vocab.json", forge.nested_json(100_000, kind).encode()))


def big_vocab(case: Case) -> bytes:
    """61 MB of distinct words."""
    chunks, size, n = [b"\n".join([b"<unk>", b"<blank>", b"<s>", b"</s>"])], 0, 0
    while size < 61 << 20:
        chunk = b"".join(b"\ntok%09d" % i for i in range(n, n + 100_000))
        chunks.append(chunk)
        size += len(chunk)
        n += 100_000
    return b"".join(chunks) + b"\n"


def seed_words(case: Case, transform: Callable[[list[str]], list[str]] = list) -> bytes:
    words = case.fx.seed_vocab().read_text().split("\n")[:-1]
    return ("\n".join(transform(words)) + "\n").encode()


def swap_eos(w: list[str]) -> list[str]:
    w = list(w)
    w[3], w[4] = w[4], w[3]
    return w


def json_vocab(case: Case, ids: Callable[[int], Any]) -> bytes:
    return json.dumps({w: ids(i) for i, w in enumerate(case.fx.seed_vocab().read_text().split())}).encode()


VOCABS: dict[str, tuple[Callable[[Case], bytes], str, str]] = {  # content, file name, expectation
    "61MB-plain": (big_vocab, "vocab.txt", "error"),
    "eos-wrong-id": (lambda c: seed_words(c, swap_eos), "vocab.txt", "error"),
    "too-small": (lambda c: seed_words(c, lambda w: w[:-1]), "vocab.txt", "error"),
    "too-large": (lambda c: seed_words(c, lambda w: w + ["extra"]), "vocab.txt", "error"),
    "duplicates": (lambda c: seed_words(c, lambda w: w[:-1] + [w[5]]), "vocab.txt", "error"),
    "json-dict-string-ids": (lambda c: json_vocab(c, str), "vocab.json", "error"),
    "json-dict-gaps": (lambda c: json_vocab(c, lambda i: i * 2), "vocab.json", "error"),
    "json-list-of-ints": (lambda c: json.dumps(list(range(40))).encode(), "vocab.json", "error"),
    "json-list-nested": (lambda c: json.dumps([["a"]] * 40).encode(), "vocab.json", "error"),
    "empty": (lambda c: b"", "vocab.txt", "error"),
    "binary": (lambda c: os.urandom(2000), "vocab.bin", "error"),
    "blank-lines": (lambda c: b"\n" * 40, "vocab.txt", "error"),
    "crlf": (lambda c: seed_words(c).replace(b"\n", b"\r\n"), "vocab.txt", "either"),
    "bom": (lambda c: b"\xef\xbb\xbf" + seed_words(c), "vocab.txt", "either"),
    "plain-control": (seed_words, "vocab.txt", "ok"),
}
VOCAB_CASES = [pytest.param(k, "onnx", id=f"{k}/onnx") for k in VOCABS]
VOCAB_CASES += [pytest.param(k, "translate", id=f"{k}/translate")
                for k in ("61MB-plain", "eos-wrong-id", "binary", "bom", "plain-control")]


@pytest.mark.parametrize("key,command", VOCAB_CASES)
def test_seed_vocab(case: Case, key: str, command: str) -> None:
    content, name, expect = VOCABS[key]
    assert_expected(expect, vocab_run(case, command, name, content(case)))


@pytest.mark.parametrize("kind", ["dev-null", "directory", "three-times", "missing", "none-given"])
def test_seed_vocab_path(case: Case, kind: str) -> None:
    ck = case.copy_ck(case.fx.seed())
    v = case.text("vocab.txt", case.fx.seed_vocab().read_bytes())
    vocabs = {"dev-null": ["/dev/null"], "directory": [case.dir], "three-times": [v, v, v],
              "missing": [case.p("nope.txt")], "none-given": []}[kind]
    flat = [x for vv in vocabs for x in ("--vocab", vv)]
    assert_refused(case.run("tfm-run", "translate", "--model", ck, *flat, TINY_SENT))


# -- bench options ----------------------------------------------------------------------------------

BENCH_ARGS = [  # changed options, expectation, address-space cap (GB)
    pytest.param(("--beam-sizes", "100000"), "error", None, id="beam-sizes-100000"),
    pytest.param(("--beam-sizes", ""), "error", None, id="beam-sizes-empty"),
    pytest.param(("--beam-sizes", "0"), "error", None, id="beam-sizes-0"),
    pytest.param(("--batch-sizes", "abc"), "error", None, id="batch-sizes-abc"),
    pytest.param(("--batch-sizes", "-4"), "error", None, id="batch-sizes-negative"),
    pytest.param(("--batch-sizes", "1000000000"), "either", 10, id="batch-sizes-1e9"),
    pytest.param(("--backends", "ort-fp32,warp-drive"), "error", None, id="backends-bogus"),
    pytest.param(("--backends", ","), "error", None, id="backends-empty"),
    pytest.param(("--sentences", "1000000000"), "either", 10, id="sentences-1e9"),
    pytest.param(("--output-length", "1000000000"), "either", None, id="output-length-1e9"),
    pytest.param(("--min-time", "nan"), "error", None, id="min-time-nan"),
    pytest.param(("--min-time", "inf"), "either", None, id="min-time-inf"),
    pytest.param((), "ok", None, id="json-valid-control"),
]


def valid_json(path: Path) -> str | None:
    try:
        json.loads(path.read_text())
    except Exception as exc:
        return f"--json not valid JSON: {exc!r}"
    return None


@pytest.mark.parametrize("args,expect,mem_gb", BENCH_ARGS)
def test_bench_args(case: Case, args: tuple, expect: str, mem_gb: float | None) -> None:
    out = case.out("b.json")
    options = {"--backends": "ort-fp32", "--batch-sizes": "1", "--beam-sizes": "1", "--sentences": "2",
               "--repeats": "2", "--min-time": "0", "--output-length": "4"}
    options.update(zip(args[::2], args[1::2], strict=True))
    r = case.run("tfm-run", "bench", "--model", case.fx.tiny(), *[x for kv in options.items() for x in kv],
                 "--json", out, timeout=2 * case.fx.timeout, mem_gb=mem_gb)
    assert_expected(expect, r, lambda r: valid_json(out))


# -- checkpoint settings of the wrong type or range -------------------------------------------------

config, top = forge.config, forge.top


def truncated(ck: dict) -> bytes:
    data = forge.saved_bytes(ck)
    return data[: len(data) // 2]


def zip_not_torch(ck: dict) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("a.txt", "x")
    return buf.getvalue()


CONFIG_BAD: dict[str, forge.Change] = {
    "dropout-lots": config(dropout="lots"), "dropout-2.0": config(dropout=2.0), "dropout-neg": config(dropout=-1),
    "dropout-nan": config(dropout=math.nan), "dropout-none": config(dropout=None),
    "pad-out-of-range": config(src_pad_idx=40), "pad-negative": config(src_pad_idx=-1),
    "pad-string": config(src_pad_idx="1"), "pad-float": config(trg_pad_idx=1.5),
    "d_model-bool": config(d_model=True), "d_model-0": config(d_model=0), "d_model-neg": config(d_model=-5),
    "d_model-1e12-float": config(d_model=1e12), "d_model-1e12-int": config(d_model=10**12),
    "d_model-17": config(d_model=17),
    "n_layers-float": config(n_layers=1.5), "n_layers-0": config(n_layers=0), "n_layers-1e6": config(n_layers=10**6),
    "n_head-0": config(n_head=0), "d_k-1e9": config(d_k=10**9), "d_inner-1e12": config(d_inner=10**12),
    "n_position-1e9": config(n_position=10**9), "n_position-0": config(n_position=0),
    "n_position-neg": config(n_position=-1), "n_position-3": config(n_position=3),
    "vocab-1e9": config(src_vocab_size=10**9, trg_vocab_size=10**9), "vocab-0": config(src_vocab_size=0),
    "vocab-mismatch": config(trg_vocab_size=41),
    "scale-bogus": config(scale_emb_or_prj="bogus"), "share-string": config(embs_share_weight="yes"),
    "missing-d_model": forge.without("d_model", inner="config"), "unknown-key": config(warp_factor=9),
    "config-list": top(config=[1, 2]), "config-none": top(config=None),
    "format-version-99": top(format_version=99), "format-other": top(format="someone-else"),
    "model-list": top(model=[1, 2]), "tokenizer-field-missing": forge.without("tokenizer"),
    "whole-list": lambda ck: [1, 2, 3],
    "text-file": lambda ck: b"this is not a checkpoint\n", "empty-file": lambda ck: b"",
    "random-bytes": lambda ck: os.urandom(4096), "zip-not-torch": zip_not_torch, "truncated": truncated,
    "legacy-pickle-format": lambda ck: forge.saved_bytes(ck, _use_new_zipfile_serialization=False),
    "seed-settings-dict": lambda ck: {"settings": dict(ck["config"]), "model": ck["model"]},
    "seed-settings-bad-d_model": lambda ck: {"settings": Namespace(**{**ck["config"], "d_model": "x",
                                                                      "d_word_vec": 16, "d_inner_hid": 32}),
                                             "model": ck["model"]},
    "seed-settings-missing": lambda ck: {"settings": Namespace(d_model=16), "model": ck["model"]},
}
CONFIG_FINE = ("unknown-key", "legacy-pickle-format")  # may be accepted
CONFIG_CASES = [pytest.param(k, "onnx", id=f"{k}/onnx") for k in CONFIG_BAD]
CONFIG_CASES += [pytest.param(k, "translate", id=f"{k}/translate")
                 for k in ("dropout-lots", "d_model-bool", "n_position-1e9", "truncated")]
CONFIG_CASES += [pytest.param(k, "verify", id=f"{k}/verify") for k in ("n_position-1e9", "text-file")]


@pytest.mark.parametrize("key,command", CONFIG_CASES)
def test_ckpt_config(case: Case, key: str, command: str) -> None:
    ck = case.copy_ck(case.fx.forged(f"cfg-{key}", "tiny", CONFIG_BAD[key]))
    extra = ["--vocab", case.fx.seed_vocab()] if key.startswith("seed-") else []
    r = checkpoint_run(case, command, ck, *extra, mem_gb=12)
    assert_expected("either" if key in CONFIG_FINE else "error", r)


# -- manifests: missing keys, values of the wrong type or range, the file itself hostile --------------

MISSING_KEYS = ("format", "format_version", "model", "tokenizer", "tokenizer.source", "tokenizer.target", "limits",
                "limits.max_source_length", "limits.max_target_length", "special_tokens", "precision", "opset",
                "graphs", "graphs.encoder", "graphs.encoder.file", "graphs.encoder.sha256", "graphs.decoder_step",
                "graphs.decoder_step.file", "graphs.decoder_step.sha256", "files", "source_checkpoint",
                "optimizations", "model.d_model", "model.n_position", "model.src_vocab_size", "model.n_layers",
                "graphs.encoder.inputs", "graphs.decoder_step.outputs")
OPTIONAL_KEYS = ("graphs.encoder.inputs", "graphs.decoder_step.outputs", "source_checkpoint")
MISSING_CASES = [pytest.param(k, "translate", id=f"{k}/translate") for k in MISSING_KEYS]
MISSING_CASES += [pytest.param(k, r, id=f"{k}/{r}") for k in ("model", "limits", "files", "graphs.decoder_step")
                  for r in ("inspect", "check", "quantize")]
MISSING_CASES += [pytest.param(f"model.{k}", "inspect", id=f"model.{k}/inspect")
                  for k in ("d_model", "n_layers", "n_head", "d_k", "src_vocab_size", "trg_vocab_size", "n_position",
                            "d_inner")]


def manifest_changed(case: Case, reader: str, change: Callable[[dict], None], harmless: bool) -> None:
    """A reader of a copy of the tiny model whose manifest is changed: translate may go on if its answer is right
    (a false claim the runtime never relies on is harmless); other readers must refuse unless it is harmless."""
    m = case.copy_model(case.fx.tiny())
    forge.edit_manifest(m, change)
    r = reader_run(case, reader, m)
    if reader == "translate":
        assert_ok_or_refused(r, same_output(case.fx.tiny_ref()))
    else:
        assert_expected("either" if harmless else "error", r)


@pytest.mark.parametrize("key,reader", MISSING_CASES)
def test_manifest_missing(case: Case, key: str, reader: str) -> None:
    manifest_changed(case, reader, lambda man: forge.del_dotted(man, key), key in OPTIONAL_KEYS)


MANIFEST_VALUES: dict[str, tuple[str, Any]] = {
    "max_target_length-string": ("limits.max_target_length", "200"),
    "max_target_length-0": ("limits.max_target_length", 0),
    "max_target_length-1e9": ("limits.max_target_length", 10**9),
    "max_target_length-201": ("limits.max_target_length", 201),
    "max_target_length-null": ("limits.max_target_length", None),
    "max_target_length-bool": ("limits.max_target_length", True),
    "max_target_length-float": ("limits.max_target_length", 2.5),
    "max_source_length-list": ("limits.max_source_length", [1]),
    "limits-string": ("limits", "big"),
    "d_model-list": ("model.d_model", [16]), "d_model-string": ("model.d_model", "16"),
    "d_model-bool": ("model.d_model", True), "d_model-0": ("model.d_model", 0), "d_model-32": ("model.d_model", 32),
    "n_head-0": ("model.n_head", 0), "n_head-3": ("model.n_head", 3),
    "n_position-1e9": ("model.n_position", 10**9), "n_position-neg": ("model.n_position", -1),
    "vocab-1e9": ("model.src_vocab_size", 10**9), "vocab-39": ("model.trg_vocab_size", 39),
    "dropout-lots": ("model.dropout", "lots"), "pad-99": ("model.src_pad_idx", 99),
    "model-string": ("model", "x"), "model-null": ("model", None), "model-list": ("model", []),
    "model-empty": ("model", {}),
    "precision-fp64": ("precision", "fp64"), "precision-null": ("precision", None),
    "precision-int8-no-mode": ("precision", "int8"), "precision-fp16-claimed": ("precision", "fp16"),
    "opset-string": ("opset", "17"), "opset-0": ("opset", 0), "opset-bool": ("opset", True),
    "opset-1e9": ("opset", 10**9),
    "special-eos-5": ("special_tokens", {"bos": 2, "eos": 5, "pad": 1, "unk": 0}),
    "special-null": ("special_tokens", None),
    "files-list": ("files", []), "files-bad-sha": ("files", {"tokenizer.json": "abc"}),
    "files-null": ("files", None), "files-empty": ("files", {}),
    "graphs-list": ("graphs", []), "graphs-null": ("graphs", None),
    "graphs-encoder-string": ("graphs.encoder", "encoder.onnx"),
    "encoder-sha-zeros": ("graphs.encoder.sha256", "0" * 64), "encoder-sha-null": ("graphs.encoder.sha256", None),
    "encoder-sha-int": ("graphs.encoder.sha256", 5), "encoder-file-int": ("graphs.encoder.file", 5),
    "encoder-file-null": ("graphs.encoder.file", None), "encoder-file-empty": ("graphs.encoder.file", ""),
    "encoder-file-dot": ("graphs.encoder.file", "."),
    "tokenizer-string": ("tokenizer", "tokenizer.json"), "tokenizer-null": ("tokenizer", None),
    "tokenizer-source-list": ("tokenizer.source", ["tokenizer.json"]),
    "format_version-1": ("format_version", 1), "format_version-3": ("format_version", 3),
    "format_version-string": ("format_version", "2"), "format_version-null": ("format_version", None),
    "format-engines": ("format", "tfm-export-engines"), "format-null": ("format", None),
    "format-upper": ("format", "TFM-EXPORT-MODEL"),
    "optimizations-string": ("optimizations", "none"), "source_checkpoint-string": ("source_checkpoint", "x"),
    "optimizations-numbers": ("optimizations", [1, 2]),
    "encoder-inputs-bogus": ("graphs.encoder.inputs", [{"name": "evil", "dtype": "int64", "shape": [1]}]),
}
MANIFEST_VALUES_FINE = ("encoder-inputs-bogus", "source_checkpoint-string", "optimizations-string")
VALUE_CASES = [pytest.param(k, "translate", id=f"{k}/translate") for k in MANIFEST_VALUES]
VALUE_CASES += [pytest.param(k, r, id=f"{k}/{r}")
                for k in ("max_target_length-string", "d_model-list", "model-string", "n_position-1e9", "vocab-1e9",
                          "precision-fp16-claimed", "graphs-encoder-string", "special-eos-5", "optimizations-numbers",
                          "model-empty")
                for r in ("inspect", "check", "quantize")]


@pytest.mark.parametrize("key,reader", VALUE_CASES)
def test_manifest_value(case: Case, key: str, reader: str) -> None:
    dotted, value = MANIFEST_VALUES[key]
    manifest_changed(case, reader, lambda man: forge.set_dotted(man, dotted, value), key in MANIFEST_VALUES_FINE)


def write_hostile_manifest(case: Case, mf: Path, kind: str) -> None:
    """The manifest file itself replaced by something hostile."""
    text = mf.read_text()
    contents: dict[str, str | bytes] = {
        "list": "[]", "null": "null", "string": '"manifest"', "number": "42", "empty-object": "{}", "empty-file": "",
        "truncated": text[: len(text) // 2],
        "non-utf8": text.replace('"tool": "tfm-export"', '"tool": "tfm-\xe9xport"').encode("latin-1"),
        "utf16": text.encode("utf-16"), "bom": b"\xef\xbb\xbf" + text.encode(),
        "nan-literal": re.sub(r'"max_target_length": \d+', '"max_target_length": NaN', text),
        "infinity-literal": re.sub(r'"n_position": \d+', '"n_position": Infinity', text),
        "huge-int-literal": re.sub(r'"max_target_length": \d+', '"max_target_length": ' + "9" * 5000, text),
        "duplicate-keys": text.replace('"precision": "fp32"', '"precision": "fp32", "precision": "int8"'),
    }
    if kind in contents:
        content = contents[kind]
        mf.write_bytes(content if isinstance(content, bytes) else content.encode())
    elif kind == "sparse-600MB":
        with open(mf, "r+b") as f:
            f.truncate(600 << 20)
    elif kind == "unreadable":
        mf.chmod(0)  # root reads it anyway; a non-root run gets EACCES
    else:
        mf.unlink()
        if kind == "directory":
            mf.mkdir()
        elif kind == "fifo":
            os.mkfifo(mf)
        elif kind == "symlink-dev-null":
            os.symlink("/dev/null", mf)
        else:  # symlink-outside-copy
            case.text("outside/manifest.json", text)
            os.symlink("../outside/manifest.json", mf)


MANIFEST_FILE_KINDS = ("list", "null", "string", "number", "empty-object", "empty-file", "truncated", "non-utf8",
                       "utf16", "bom", "nan-literal", "infinity-literal", "huge-int-literal", "duplicate-keys",
                       "sparse-600MB", "directory", "fifo", "symlink-dev-null", "symlink-outside-copy", "unreadable")
MANIFEST_FILE_CASES = [pytest.param(k, "translate", id=f"{k}/translate") for k in MANIFEST_FILE_KINDS]
MANIFEST_FILE_CASES += [pytest.param(k, r, id=f"{k}/{r}") for k in ("list", "non-utf8", "fifo", "sparse-600MB",
                                                                      "nan-literal")
                        for r in ("inspect", "check", "quantize")]


@pytest.mark.parametrize("kind,reader", MANIFEST_FILE_CASES)
def test_manifest_file(case: Case, kind: str, reader: str) -> None:
    m = case.copy_model(case.fx.tiny())
    write_hostile_manifest(case, m / "manifest.json", kind)
    r = reader_run(case, reader, m)
    assert_expected("either" if kind in ("bom", "symlink-outside-copy", "unreadable") else "error", r)


# -- graphs: swapped, of another model, damaged -------------------------------------------------------

GRAPH_KINDS = ("same-graph-twice", "graphs-swapped", "encoder-of-other-model", "decoder-of-other-model",
               "both-graphs-of-other-model", "graph-not-onnx", "graph-empty", "graph-truncated", "graph-is-directory",
               "int8-graph-in-fp32-dir")
# translate runs decoder_step_search_fused and never opens decoder_step.onnx, so a damaged decoder_step.onnx whose
# hash is rehashed into the manifest goes unnoticed (docs/security.md, "What hashing does not protect against").
UNOPENED_DECODER_STEP = pytest.mark.xfail(
    strict=True, raises=SilentWrong,
    reason="known finding: translate never opens decoder_step.onnx (it runs decoder_step_search_fused), so a "
           "rehashed damaged or foreign decoder_step.onnx is accepted")
GRAPH_CASES = [pytest.param(k, r, id=f"{k}/{r}", marks=UNOPENED_DECODER_STEP if r == "translate" and k in
                            ("decoder-of-other-model", "graph-truncated") else ())
               for k in GRAPH_KINDS for r in FOUR_READERS
               if r == "translate" or k not in ("graph-empty", "graph-is-directory", "graph-truncated")]


def change_graphs(case: Case, m: Path, kind: str) -> None:
    man = forge.load_manifest(m)
    graphs = man["graphs"]
    if kind == "same-graph-twice":
        graphs["decoder_step"]["file"] = "encoder.onnx"
    elif kind == "graphs-swapped":
        graphs["encoder"]["file"], graphs["decoder_step"]["file"] = "decoder_step.onnx", "encoder.onnx"
    elif kind.endswith("-of-other-model"):
        for g in {"encoder": ["encoder.onnx"], "decoder": ["decoder_step.onnx"],
                  "both-graphs": ["encoder.onnx", "decoder_step.onnx"]}[kind.removesuffix("-of-other-model")]:
            shutil.copyfile(case.fx.demo() / g, m / g)
    elif kind == "graph-not-onnx":
        (m / "encoder.onnx").write_text("this is not a protobuf\n")
    elif kind == "graph-empty":
        (m / "encoder.onnx").write_bytes(b"")
    elif kind == "graph-truncated":
        data = (m / "decoder_step.onnx").read_bytes()
        (m / "decoder_step.onnx").write_bytes(data[: len(data) // 2])
    elif kind == "graph-is-directory":
        (m / "encoder.onnx").unlink()
        (m / "encoder.onnx").mkdir()
    else:  # int8-graph-in-fp32-dir
        i8 = case.fx.int8()
        shutil.copyfile(i8 / forge.load_manifest(i8)["graphs"]["decoder_step"]["file"], m / "decoder_step.onnx")
    forge.save_manifest(m, man)
    forge.rehash(m)


@pytest.mark.parametrize("kind,reader", GRAPH_CASES)
def test_graph(case: Case, kind: str, reader: str) -> None:
    """Graphs that do not belong, with hashes that agree: only the graph contract can refuse them."""
    m = case.copy_model(case.fx.tiny())
    change_graphs(case, m, kind)
    r = reader_run(case, reader, m)
    # inspect describes whatever is there; an int8 step honours the contract (its output may differ)
    harmless = reader == "inspect" or (kind == "int8-graph-in-fp32-dir" and reader == "translate")
    assert_expected("either" if harmless else "error", r)


# -- tokenizers that do not fit ---------------------------------------------------------------------

RAW_TOKENIZERS = {"garbage": "this is not JSON {", "not-a-tokenizer": json.dumps({"model": 5}),
                  "json-list": json.dumps([1, 2, 3]), "empty": ""}


def change_tokenizer(case: Case, tok: Path, kind: str) -> None:
    if kind in RAW_TOKENIZERS:
        tok.write_text(RAW_TOKENIZERS[kind])
    elif kind == "other-models-tokenizer":
        shutil.copyfile(case.fx.demo_ck() / "tokenizer.json", tok)
    elif kind == "non-utf8":
        tok.write_bytes(tok.read_bytes().replace(b'"w1"', b'"w\xff"'))
    else:
        data = json.loads(tok.read_text())
        v = data["model"]["vocab"]
        if kind == "vocab-too-small":
            del v["w35"]
        elif kind == "eos-wrong-id":
            v["</s>"], v["w0"] = v["w0"], v["</s>"]
            for a in data["added_tokens"]:
                if a["content"] == "</s>":
                    a["id"] = v["</s>"]
        else:  # unknown-model-type
            data["model"]["type"] = "QuantumLevel"
        tok.write_text(json.dumps(data))


TOKENIZER_KINDS = ("garbage", "not-a-tokenizer", "json-list", "empty", "vocab-too-small", "eos-wrong-id",
                   "other-models-tokenizer", "non-utf8", "unknown-model-type")
TOKENIZER_CASES = [pytest.param(k, "check", id=f"{k}/check") for k in TOKENIZER_KINDS]
TOKENIZER_CASES += [pytest.param(k, r, id=f"{k}/{r}")
                    for k in ("garbage", "not-a-tokenizer", "vocab-too-small", "eos-wrong-id")
                    for r in ("quantize", "inspect", "translate", "verify")]


@pytest.mark.parametrize("kind,reader", TOKENIZER_CASES)
def test_bad_tokenizer(case: Case, kind: str, reader: str) -> None:
    m = case.copy_model(case.fx.tiny())
    change_tokenizer(case, m / "tokenizer.json", kind)
    forge.rehash(m)
    assert_refused(reader_run(case, reader, m), "a tokenizer that does not fit was accepted")


# -- outputs that cannot be written -----------------------------------------------------------------

READ_ONLY_CASES = [pytest.param(w, "dir", id=f"dir/{w}") for w in WRITERS]
READ_ONLY_CASES += [pytest.param(w, "file", id=f"existing-file/{w}") for w in ("translate", "bench-json")]


@pytest.mark.parametrize("writer,what", READ_ONLY_CASES)
def test_read_only(case: Case, writer: str, what: str) -> None:
    """An immutable output directory, or an immutable existing output file."""
    folder = case.p("immutable")
    folder.mkdir()
    name, inner = writer_out_names(writer)
    out = folder / name
    if what == "file":
        out.write_bytes(b"old\n")
        case.input(out)
    locked = str(folder if what == "dir" else out)
    if subprocess.run(["chattr", "+i", locked], capture_output=True).returncode:
        pytest.skip("chattr +i not permitted here")
    try:
        r = writer_run(case, writer, out, ("--force",) if inner and writer in ("onnx", "quantize") else ())
    finally:
        subprocess.run(["chattr", "-i", locked], capture_output=True)
    assert_refused(r)


OUTPUT_NAME_CASES = [pytest.param(w, "", id=f"empty-string/{w}") for w in WRITERS + ("trt", "bench-plot")]
OUTPUT_NAME_CASES += [pytest.param(w, " ", id=f"blank/{w}") for w in ("onnx", "translate", "random-checkpoint")]


@pytest.mark.parametrize("writer,value", OUTPUT_NAME_CASES)
def test_output_name(case: Case, writer: str, value: str) -> None:
    if value:  # a blank name is a (strange) name: what lands there is the named output
        case.output(case.p(value))
    assert_refused(writer_run(case, writer, value))


ODD_OUTPUTS: dict[str, Callable[[Case], tuple[str, Any, tuple]]] = {  # writer, output, extra options
    "dot-force/onnx": lambda c: ("onnx", ".", ("--force",)),
    "dotdot-force/quantize": lambda c: ("quantize", "..", ("--force",)),
    "parent-is-file/translate": lambda c: ("translate", c.text("afile", "x") / "out.txt", ()),
    "parent-is-file/onnx": lambda c: ("onnx", c.text("afile", "x") / "model", ()),
    "is-directory/translate": lambda c: ("translate", c.dir, ()),
    "name-too-long/translate": lambda c: ("translate", c.p("x" * 300), ()),
    "name-too-long/onnx": lambda c: ("onnx", c.p("x" * 300), ()),
}


@pytest.mark.parametrize("kind", ODD_OUTPUTS)
def test_odd_output(case: Case, kind: str) -> None:
    writer, out, extra = ODD_OUTPUTS[kind](case)
    assert_refused(writer_run(case, writer, out, extra))


def test_output_control_chars(case: Case) -> None:
    assert_ok_or_refused(writer_run(case, "translate", case.out("out\x01\x7f\n.txt")))


# -- absurd sizes -----------------------------------------------------------------------------------

def claim_positions(case: Case, n: int) -> Path:
    """A copy of the tiny model whose manifest claims n positions (hashes untouched: the manifest is not hashed)."""
    m = case.copy_model(case.fx.tiny())

    def change(man: dict) -> None:
        man["model"]["n_position"] = n
        man["limits"]["max_source_length"] = man["limits"]["max_target_length"] = n
    forge.edit_manifest(m, change)
    return m


def tiny_verify(*args: Any) -> list[Any]:
    return ["tfm-export", "verify", "--model", lambda c: c.fx.tiny(), "--checkpoint",
            lambda c: c.fx.tiny_ck() / "ckpt.pt", *args]


def tiny_translate(*args: Any) -> list[Any]:
    return ["tfm-run", "translate", "--model", lambda c: c.fx.tiny(), *args, TINY_SENT]


HUGE_OPTIONS = [  # arguments (callables take the case), expectation
    pytest.param(tiny_verify("--beam-size", 100000), "error", id="verify-beam-size-100000"),
    pytest.param(tiny_verify("--samples", 10**9), "either", id="verify-samples-1e9"),
    pytest.param(tiny_verify("--samples", 1, "--steps", 10**9, "--beam-size", 1), "either", id="verify-steps-1e9"),
    pytest.param(tiny_verify("--samples", 1, "--steps", 2, "--atol", "nan"), "error", id="verify-atol-nan"),
    pytest.param(tiny_verify("--samples", 1, "--steps", 2, "--rtol", "-1"), "error", id="verify-rtol-negative"),
    pytest.param(tiny_translate("--max-length", 10**9), "either", id="translate-max-length-1e9"),
    pytest.param(tiny_translate("--batch-size", 10**9), "either", id="translate-batch-size-1e9"),
    pytest.param(tiny_translate("--beam-size", 64, "--max-length", 5), "either", id="translate-beam-64-batch-1e4"),
    pytest.param(["tfm-export", "eval-demo", "--model", lambda c: c.fx.tiny(), "--beam-size", 100000], "error",
                 id="eval-demo-beam-size-100000"),
    pytest.param(["tfm-export", "quantize", "--model", lambda c: c.fx.tiny(), "--precision", "int8", "--calibration",
                  lambda c: c.fx.calib(), "--calibration-max-length", 10**9, "--output", lambda c: c.out("q")],
                 "either", id="quantize-calibration-max-length-1e9"),
    pytest.param(["tfm-export", "trt", "--model", lambda c: c.fx.tiny(), "--max-batch", 10**9, "--output",
                  lambda c: c.out("e")], "error", id="trt-max-batch-1e9"),
    pytest.param(["tfm-export", "check", "--model", lambda c: claim_positions(c, 10**9)], "error",
                 id="check-n_position-1e9-rehashed"),
]


@pytest.mark.parametrize("args,expect", HUGE_OPTIONS)
def test_huge_option(case: Case, args: list[Any], expect: str) -> None:
    """Sizes that could make a careless tool allocate tens of GB (the address space is capped at 12 GB)."""
    full = [a(case) if callable(a) else a for a in args]
    assert_expected(expect, case.run(*full, mem_gb=12, timeout=2 * case.fx.timeout))
