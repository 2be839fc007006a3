"""Untrusted files: what a checkpoint or manifest names stays inside its directory, every listed file is
hashed and checked on every read, and damaged or hostile content is one line, never a traceback or a
silent wrong answer."""

from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path

import onnx
import pytest
import torch
from click.testing import CliRunner
from support.backends import concat_backend, step_backend
from support.common import DEMO_CKPT, listing, tiny_config
from support.seed_oracle import save_seed_checkpoint, seed_settings, seed_state_dict

from tfm_export.artifacts.manifest import ModelDirError, write_manifest
from tfm_export.artifacts.model_dir import SHARED, read_manifest
from tfm_export.cli.export_cli import main as export_main
from tfm_export.cli.run_cli import main as run_main
from tfm_export.core.errors import TfmExportError
from tfm_export.core.files import file_sha256
from tfm_export.graphs.onnx_io import save_graph
from tfm_export.graphs.pipeline import export_model_dir
from tfm_export.model.loading import load_checkpoint
from tfm_export.model.synthetic import random_checkpoint
from tfm_export.runtime.backends import INPLACE
from tfm_export.runtime.translator import Translator


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    ckpt = load_checkpoint(random_checkpoint(tiny_config(n_position=16), root / "ckpt"))
    export_model_dir(ckpt, root / "model", progress=False)
    return ckpt, root / "model"


def copy_of(directory: Path, tmp_path: Path, name: str = "copy") -> Path:
    shutil.copytree(directory, tmp_path / name)
    return tmp_path / name


def edit_manifest(directory: Path, edit) -> None:
    manifest = json.loads((directory / "manifest.json").read_text())
    edit(manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest))


def one_line_error(result, *fragments: str) -> None:
    assert result.exit_code != 0, result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output, result.output
    for fragment in fragments:
        assert fragment in result.output, result.output


QUANTIZE = ["quantize", "--precision", "int8", "--mode", "dynamic", "--output", "{out}"]
READERS = [["translate", "w5"], ["translate", "--no-fused", "w5"], QUANTIZE, ["check"], ["inspect"], ["verify"],
           ["trt", "--fp16", "--output", "{out}"], ["triton", "--output", "{out}"],
           ["triton", "--layout", "bls", "--output", "{out}"], ["generate", "--output", "{out}"]]


def reader_id(args: list[str]) -> str:
    return " ".join(a for a in args if a not in ("--output", "{out}"))


def run_reader(args: list[str], model: Path, out: Path):
    command, *rest = args
    rest = [a.format(out=out) for a in rest]
    if command == "translate":
        return CliRunner().invoke(run_main, ["translate", "--model", str(model), *rest])
    return CliRunner().invoke(export_main, [command, "--model", str(model), *rest])


# --- integrity: every listed file hashed, checked by every reader ------------------------------------------------

@pytest.mark.parametrize("reader", READERS, ids=reader_id)
def test_a_swapped_tokenizer_is_refused_by_every_reader(tiny, tmp_path, reader):
    """Same size, other words: without the hash it would translate with exit 0, into the wrong words."""
    model = copy_of(tiny[1], tmp_path)
    vocab = json.loads((model / "tokenizer.json").read_text())
    words = vocab["model"]["vocab"]
    a, b = "w1", "w2"
    words[a], words[b] = words[b], words[a]
    (model / "tokenizer.json").write_text(json.dumps(vocab))
    one_line_error(run_reader(reader, model, tmp_path / "out"), "tokenizer.json: sha256 differs from manifest.json")
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def external(tiny, tmp_path_factory) -> Path:
    """The tiny model directory with decoder_step's weights in decoder_step.onnx.data, as graphs above 2 GB keep
    them: `files` then lists a contract graph's external weights beside the tokenizer and the shared tables."""
    model = copy_of(tiny[1], tmp_path_factory.mktemp("external"))
    manifest = read_manifest(model)
    proto = onnx.load(str(model / "decoder_step.onnx"))
    written = save_graph(proto, model / "decoder_step.onnx", external_above=0)
    assert [p.name for p in written] == ["decoder_step.onnx", "decoder_step.onnx.data"]
    manifest["graphs"]["decoder_step"]["sha256"] = file_sha256(model / "decoder_step.onnx")
    manifest["files"]["decoder_step.onnx.data"] = file_sha256(model / "decoder_step.onnx.data")
    write_manifest(model, manifest)
    assert len(Translator.load(model).translate(["w5 w6"])) == 1  # consistent: it runs
    return model


@pytest.mark.parametrize("reader", READERS, ids=reader_id)
def test_damaged_external_weights_are_refused_by_every_reader(external, tmp_path, reader):
    """Zeroed weights in a graph's `*.onnx.data` must not translate."""
    model = copy_of(external, tmp_path)
    data = model / "decoder_step.onnx.data"
    data.write_bytes(bytes(data.stat().st_size))
    one_line_error(run_reader(reader, model, tmp_path / "out"),
                   "decoder_step.onnx.data: sha256 differs from manifest.json")


def damage(path: Path) -> None:
    """A change every reader would take without the hash: two words of a tokenizer swapped, one weight bit flipped."""
    if path.suffix == ".json":
        vocab = json.loads(path.read_text())
        words = vocab["model"]["vocab"]
        words["w1"], words["w2"] = words["w2"], words["w1"]
        path.write_text(json.dumps(vocab))
    else:
        data = bytearray(path.read_bytes())
        data[-1] ^= 1  # the last weight's last byte: the graph still parses
        path.write_bytes(bytes(data))


# The runtime's backends read a directory's graphs (all of them) and external weights; Translator.load the tokenizers
BACKENDS = (concat_backend, functools.partial(step_backend, backend=INPLACE),
            functools.partial(step_backend, backend=INPLACE, fused=True))


def edit_hash(manifest: dict, keys: tuple[str, ...], edit: str) -> None:
    *parents, key = keys
    entry = functools.reduce(dict.__getitem__, parents, manifest)
    if edit == "removed":
        del entry[key]
    else:
        entry[key] = None if edit == "null" else 7


@pytest.mark.parametrize("edit", ["removed", "null", "number"])
def test_a_damaged_file_the_manifest_does_not_hash_is_refused_by_every_reader(external, tmp_path, edit):
    """Each file the manifest hashes (every graph, every external-weights file, the tokenizer), damaged, with its
    sha256 taken out of the manifest, null or a number: nothing reads a file it cannot check. Every reader refuses
    in one line; no output is written."""
    manifest = read_manifest(external)
    entries = {name: ("files", name) for name in manifest["files"]}
    entries |= {entry["file"]: ("graphs", graph, "sha256") for graph, entry in manifest["graphs"].items()}
    assert len(entries) == 8, entries  # 4 graphs, 3 external weights files, the tokenizer
    for name, keys in entries.items():
        model = copy_of(external, tmp_path, name)
        edit_manifest(model, functools.partial(edit_hash, keys=keys, edit=edit))
        damage(model / name)
        for reader in READERS:
            result = run_reader(reader, model, tmp_path / "out")
            assert result.exit_code != 0, (name, edit, reader, result.output)
            one_line_error(result, "manifest.json")
            assert not (tmp_path / "out").exists()
        for open_ in (Translator.load, *(BACKENDS if name.endswith((".onnx", ".data")) else ())):
            with pytest.raises(ModelDirError, match="manifest.json") as error:
                open_(model)
            assert "\n" not in str(error.value), (name, edit)


@pytest.mark.parametrize("name", ["../outside.json", "/etc/passwd", "sub/tokenizer.json", "", None, 7,
                                  "tokenizer.json\0.txt"])
def test_manifest_file_names_stay_inside_the_directory(tiny, tmp_path, name):
    model = copy_of(tiny[1], tmp_path)
    (tmp_path / "outside.json").write_text((model / "tokenizer.json").read_text())
    edit_manifest(model, lambda m: m["tokenizer"].update(source=name, target=name))
    one_line_error(CliRunner().invoke(run_main, ["translate", "--model", str(model), "w5"]))


def test_a_link_inside_the_directory_pointing_outside_is_refused(tiny, tmp_path):
    model = copy_of(tiny[1], tmp_path)
    outside = tmp_path / "elsewhere.json"
    shutil.move(model / "tokenizer.json", outside)
    os.symlink(outside, model / "tokenizer.json")
    one_line_error(CliRunner().invoke(run_main, ["translate", "--model", str(model), "w5"]), "points outside")


@pytest.mark.parametrize("name", ["../outside/tokenizer.json", "/etc/passwd", "/dev/zero", "tokenizer\0.json"])
def test_checkpoint_tokenizer_names_stay_beside_the_checkpoint(tiny, tmp_path, name):
    data = torch.load(tiny[0].path, weights_only=True)
    data["tokenizer"] = {"source": name, "target": name}
    (tmp_path / "outside").mkdir()
    shutil.copy(tiny[0].path.parent / "tokenizer.json", tmp_path / "outside" / "tokenizer.json")
    (tmp_path / "ckpt").mkdir()
    torch.save(data, tmp_path / "ckpt" / "ckpt.pt")
    result = CliRunner().invoke(run_main, ["translate", "--model", str(tmp_path / "ckpt" / "ckpt.pt"), "w5"])
    one_line_error(result, "is not a plain file name")


@pytest.mark.parametrize("graph, reader", [("decoder_step_search_fused", ["translate", "w5"]),  # what it runs
                                           ("decoder_step_search", ["translate", "--no-fused", "w5"]),
                                           ("decoder_step", ["translate", "--no-search-graph", "w5"]),
                                           ("decoder_step", ["verify"])])  # verify runs every decoder
def test_a_graph_of_another_model_rehashed_into_the_manifest_is_refused(tiny, demo_onnx, tmp_path, graph, reader):
    """The demo model's graph (exported once per run), with its weights file where it has one: well formed, but of
    three layers, not two."""
    assert read_manifest(demo_onnx)["model"]["n_layers"] != tiny[0].config.n_layers
    model = copy_of(tiny[1], tmp_path)
    copied = [name for name in (f"{graph}.onnx", f"{graph}.onnx.data") if (demo_onnx / name).exists()]
    for name in copied:
        shutil.copy(demo_onnx / name, model / name)

    def rehash(manifest: dict) -> None:
        manifest["graphs"][graph]["sha256"] = file_sha256(model / f"{graph}.onnx")
        manifest["files"].update({name: file_sha256(model / name) for name in copied[1:]})
    edit_manifest(model, rehash)
    one_line_error(run_reader(reader, model, tmp_path / "out"), "do not match the graph contract")


def test_the_same_graph_listed_twice_is_refused(tiny, tmp_path):
    model = copy_of(tiny[1], tmp_path)
    edit_manifest(model, lambda m: m["graphs"]["decoder_step"].update(m["graphs"]["encoder"]))
    one_line_error(CliRunner().invoke(run_main, ["translate", "--model", str(model), "w5"]), "for two graphs")


VARIANTS = ("decoder_step_search", "decoder_step_search_fused")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("reader", READERS, ids=reader_id)
def test_a_damaged_search_decoder_is_refused_by_every_reader(tiny, tmp_path, reader, variant):
    """The optional decoders are hashed like the contract's graphs, whichever decoder a reader runs."""
    model = copy_of(tiny[1], tmp_path)
    assert variant in read_manifest(model)["graphs"]
    graph = model / f"{variant}.onnx"
    data = bytearray(graph.read_bytes())
    data[-8:] = bytes(8)  # same size, last initializer bytes zeroed
    graph.write_bytes(bytes(data))
    one_line_error(run_reader(reader, model, tmp_path / "out"), f"{variant}.onnx: sha256 differs from manifest.json")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("reader", READERS, ids=reader_id)
def test_damaged_shared_weights_are_refused_by_every_reader(tiny, tmp_path, reader, variant):
    """The tied table both sessions read lives in the decoder's .onnx.data: hashed like the graphs."""
    model = copy_of(tiny[1], tmp_path)
    data = model / f"{variant}.onnx.data"
    assert read_manifest(model)["graphs"][variant][SHARED]
    data.write_bytes(bytes(data.stat().st_size))
    one_line_error(run_reader(reader, model, tmp_path / "out"),
                   f"{variant}.onnx.data: sha256 differs from manifest.json")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("entries, fragment", [
    ("model.trg_word_prj.weight", "invalid graphs.decoder_step_search.shared_initializers"),
    ([{"name": "model.trg_word_prj.weight"}], "invalid graphs.decoder_step_search.shared_initializers"),
    ([{"name": "model.trg_word_prj.weight", "dtype": "float16", "shape": [13, 16], "offset": 0}],
     "dtype float32, shape [13, 16]"),
    # the same bytes read as another shape: ONNX Runtime would take it and fail mid-decode
    ([{"name": "model.trg_word_prj.weight", "dtype": "float32", "shape": [16, 13], "offset": 0}],
     "dtype float32, shape [13, 16]"),
    ([{"name": "model.trg_word_prj.weight", "dtype": "float32", "shape": [13, 16], "offset": -4}],
     "invalid graphs.decoder_step_search.shared_initializers"),
    ([{"name": "model.trg_word_prj.weight", "dtype": "float32", "shape": [13, 16], "offset": 10 ** 9}],
     "ends before 'model.trg_word_prj.weight'")])
@pytest.mark.parametrize("variant, reader", [("decoder_step_search", ["translate", "--no-fused", "w5"]),
                                             ("decoder_step_search_fused", ["translate", "w5"])])
def test_malformed_shared_initializer_entries_are_one_line(tiny, tmp_path, entries, fragment, variant, reader):
    model = copy_of(tiny[1], tmp_path)
    edit_manifest(model, lambda m: m["graphs"][variant].update({SHARED: entries}))
    one_line_error(run_reader(reader, model, tmp_path / "out"), fragment.replace("decoder_step_search", variant))


def test_an_int8_table_declared_float_is_one_line(variants, tmp_path):
    """ONNX Runtime takes a supplied initializer of another type without complaint and computes with garbage,
    so an int8 directory's shared table must be declared as what int8 stores: int8."""
    model = copy_of(variants["int8-dynamic"], tmp_path)
    [entry] = read_manifest(model)["graphs"]["decoder_step_search"][SHARED]
    edit_manifest(model, lambda m: m["graphs"]["decoder_step_search"][SHARED][0].update(dtype="float32"))
    one_line_error(run_reader(["translate", "w5"], model, tmp_path / "out"), f"dtype int8, shape {entry['shape']}")


@pytest.mark.parametrize("entry", ["decoder_step_search.onnx", {"file": "decoder_step_search.onnx"},
                                   {"file": 7, "sha256": "0" * 64}])
def test_a_malformed_optional_graph_entry_is_one_line(tiny, tmp_path, entry):
    model = copy_of(tiny[1], tmp_path)
    edit_manifest(model, lambda m: m["graphs"].update(decoder_step_search=entry))
    for reader in (["translate", "w5"], ["check"], ["inspect"]):
        one_line_error(run_reader(reader, model, tmp_path / "out"), "invalid graphs.decoder_step_search")


def test_a_retired_optional_graph_is_hashed_but_never_run(tiny, tmp_path):
    """Directories exported before decoder_step_search list decoder_step_buffered: it still reads (translate falls
    back to the contract's decoder_step), and a damaged one is refused like any other graph."""
    model = copy_of(tiny[1], tmp_path)
    retired = model / "decoder_step_buffered.onnx"
    (model / "decoder_step_search.onnx").rename(retired)
    edit_manifest(model, lambda m: m["graphs"].update(decoder_step_buffered=m["graphs"].pop("decoder_step_search")
                                                      | {"file": retired.name}))
    result = run_reader(["translate", "w5"], model, tmp_path / "out")
    assert result.exit_code == 0, result.output
    retired.write_bytes(retired.read_bytes()[:-8] + bytes(8))
    one_line_error(run_reader(["translate", "w5"], model, tmp_path / "out2"),
                   "decoder_step_buffered.onnx: sha256 differs from manifest.json")


def test_a_damaged_contract_decoder_is_refused_even_where_the_buffered_one_runs(tiny, tmp_path):
    model = copy_of(tiny[1], tmp_path)
    graph = model / "decoder_step.onnx"
    data = bytearray(graph.read_bytes())
    data[-8:] = bytes(8)
    graph.write_bytes(bytes(data))
    one_line_error(CliRunner().invoke(run_main, ["translate", "--model", str(model), "w5"]),
                   "decoder_step.onnx: sha256 differs from manifest.json")


@pytest.mark.parametrize("edit, fragment", [
    (lambda m: m["limits"].update(max_target_length="200"), "invalid limits.max_target_length"),
    (lambda m: m["model"].update(d_model=[512]), "d_model must be a whole number"),
    (lambda m: m["model"].update(n_position=10 ** 9), "n_position must be a whole number in 1..65,536"),
    (lambda m: m.update(model="big"), "invalid model"),
    (lambda m: m.update(special_tokens={"unk": 0, "pad": 1, "bos": 2, "eos": 5}), "special_tokens differ from"),
    (lambda m: m["limits"].update(max_source_length=10 ** 6), "outside 1..16"),
    (lambda m: m.pop("files"), "lacks files"),
    (lambda m: m.update(format_version=1), "format version 1 is not supported"),
    # optional fields and list items read without a type check (AttributeError, TypeError tracebacks before)
    (lambda m: m.update(int8="static"), "invalid int8"), (lambda m: m.update(int8=None), "invalid int8"),
    (lambda m: m.update(optimizations=[7]), "invalid optimizations"),
    (lambda m: m.update(optimizations_not_applied=[]), "invalid optimizations_not_applied"),
    (lambda m: m["source_checkpoint"].update(file=7), "invalid source_checkpoint.file"),
    (lambda m: m["source_checkpoint"].update(sha256=None), "invalid source_checkpoint.sha256"),
])
def test_damaged_manifest_fields_are_one_line_for_every_reader(tiny, tmp_path, edit, fragment):
    model = copy_of(tiny[1], tmp_path)
    edit_manifest(model, edit)
    for reader in READERS:
        one_line_error(run_reader(reader, model, tmp_path / "out"), fragment)
        assert not (tmp_path / "out").exists()


def test_a_manifest_config_the_graphs_do_not_have_is_one_line(tiny, tmp_path):
    """n_head 3 where the graphs have 2 heads: ONNX Runtime failed mid-decode with a traceback from
    run_with_iobinding (found by the hostile battery, tests/hostile); the sessions' fixed sizes are now held to the
    config."""
    model = copy_of(tiny[1], tmp_path)
    edit_manifest(model, lambda m: m["model"].update(n_head=3))
    one_line_error(run_reader(["translate", "w5"], model, tmp_path / "out"),
                   "has size 2 where this manifest's model config implies 3")


@pytest.mark.parametrize("content", [b"[" * 100_000 + b"]" * 100_000, b"\xff\xfe not utf-8", b"[1, 2]", b"null"])
def test_hostile_manifest_json_is_one_line(tiny, tmp_path, content):
    model = copy_of(tiny[1], tmp_path)
    (model / "manifest.json").write_bytes(content)
    for reader in (["translate", "w5"], ["check"], ["inspect"], QUANTIZE):
        one_line_error(run_reader(reader, model, tmp_path / "out"), "manifest.json")


def seed_checkpoint(directory: Path) -> Path:
    """A checkpoint as the seed's train.py saves it: no vocabulary inside, so --vocab must supply one."""
    opt = seed_settings()
    save_seed_checkpoint(directory / "seed.chkpt", opt, seed_state_dict(opt))
    return directory / "seed.chkpt"


@pytest.mark.parametrize("which", ["manifest.json", "vocabulary", "checkpoint"])
def test_a_named_pipe_where_a_file_is_read_is_refused_not_waited_on(demo_onnx, tmp_path, which):
    """Reading a FIFO blocks until a writer comes (the battery's runs hung for their whole timeout)."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    if which == "manifest.json":
        model = copy_of(demo_onnx, tmp_path)
        (model / "manifest.json").unlink()
        os.mkfifo(model / "manifest.json")
        args = ["--model", str(model), "forty-two"]
    elif which == "vocabulary":
        args = ["--model", str(seed_checkpoint(tmp_path)), "--vocab", str(pipe), "x"]
    else:
        args = ["--model", str(pipe), "x"]
    one_line_error(CliRunner().invoke(run_main, ["translate", *args]), "pipe")


@pytest.mark.parametrize("source, claimed, command", [("fp32", "fp16", "inspect"), ("fp32", "int8", "check"),
                                                     ("fp16", "fp32", "quantize")])
def test_a_precision_the_graphs_do_not_have_is_refused(variants, tmp_path, source, claimed, command):
    """The manifest is not hashed: an edited precision must not make a command describe or quantize graphs
    that are not there."""
    model = copy_of(variants[source], tmp_path)
    edit_manifest(model, lambda m: m.update(precision=claimed, int8={"mode": "dynamic"}))
    extra = ["--output", str(tmp_path / "q"), "--precision", "fp16"] if command == "quantize" else []
    result = CliRunner().invoke(export_main, [command, "--model", str(model), *extra])
    one_line_error(result, f"do not match the manifest's precision '{claimed}'")
    assert not (tmp_path / "q").exists()


def test_a_calibration_pipe_is_read_once(demo_onnx, tmp_path):
    """`--calibration <(...)`: the texts are read once and their sha256 taken from those bytes (hashing the pipe
    again waited forever for a second writer)."""
    import hashlib
    import threading
    pipe, data = tmp_path / "calibration", b"forty-two\nseven hundred\n"
    os.mkfifo(pipe)
    writer = threading.Thread(target=lambda: pipe.write_bytes(data), daemon=True)
    writer.start()
    result = CliRunner().invoke(export_main, ["quantize", "--model", str(demo_onnx), "--output", str(tmp_path / "q"),
                                              "--precision", "int8", "--mode", "static", "--calibration", str(pipe)])
    assert result.exit_code == 0, result.output
    assert read_manifest(tmp_path / "q")["int8"]["calibration"]["sha256"] == hashlib.sha256(data).hexdigest()


def test_deeply_nested_vocabularies_are_one_line(tmp_path):
    ckpt = seed_checkpoint(tmp_path)
    (tmp_path / "vocab.json").write_text("[" * 100_000 + "]" * 100_000)
    result = CliRunner().invoke(run_main, ["translate", "--model", str(ckpt), "--vocab", str(tmp_path / "vocab.json"),
                                           "x"])
    one_line_error(result, "nested too deeply")


def test_a_huge_vocabulary_is_refused_by_its_size_before_a_tokenizer_is_built(tmp_path):
    ckpt = seed_checkpoint(tmp_path)
    (tmp_path / "vocab.txt").write_text("\n".join(f"word{i}" for i in range(400_000)))
    result = CliRunner().invoke(run_main, ["translate", "--model", str(ckpt), "--vocab", str(tmp_path / "vocab.txt"),
                                           "x"])
    one_line_error(result, "has 400000 tokens but the model's source vocabulary has")


def test_a_tokenizer_that_does_not_parse_stops_check_quantize_and_inspect(tiny, tmp_path):
    model = copy_of(tiny[1], tmp_path)
    (model / "tokenizer.json").write_text('{"model": {"type": "Nope"}}')
    edit_manifest(model, lambda m: m["files"].update({"tokenizer.json": file_sha256(model / "tokenizer.json")}))
    for reader in (["check"], ["inspect"], ["quantize", "--precision", "fp16", "--output", "{out}"]):
        one_line_error(run_reader(reader, model, tmp_path / "out"), "not a valid tokenizers JSON file")
    assert not (tmp_path / "out").exists()


def test_a_pathological_tokenizer_regex_is_one_line_not_a_rust_backtrace(tiny, tmp_path, capfd):
    model = copy_of(tiny[1], tmp_path)
    tokenizer = json.loads((model / "tokenizer.json").read_text())
    tokenizer["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(a|a?)+$"}, "behavior": "Isolated",
                                  "invert": False}
    (model / "tokenizer.json").write_text(json.dumps(tokenizer))
    edit_manifest(model, lambda m: m["files"].update({"tokenizer.json": file_sha256(model / "tokenizer.json")}))
    result = CliRunner().invoke(run_main, ["translate", "--model", str(model), "a" * 60 + "b"])
    one_line_error(result, "the tokenizer failed on a 61-character text")
    assert "panicked" not in capfd.readouterr().err


# --- weights and configs ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("damage, fragment", [
    (lambda t: t.__setitem__((0, 0), float("nan")), "holds NaN or infinite values"),
    (lambda t: t.__setitem__((0, 0), float("inf")), "holds NaN or infinite values"),
])
def test_non_finite_weights_are_refused_by_name(tmp_path, damage, fragment):
    data = torch.load(DEMO_CKPT, weights_only=True)
    damage(data["model"]["encoder.layer_stack.1.pos_ffn.w_2.weight"])
    torch.save(data, tmp_path / "ckpt.pt")
    shutil.copy(DEMO_CKPT.parent / "tokenizer.json", tmp_path)
    with pytest.raises(TfmExportError, match=f"encoder.layer_stack.1.pos_ffn.w_2.weight {fragment}"):
        load_checkpoint(tmp_path / "ckpt.pt")


def test_integer_weights_are_refused_by_name(tmp_path):
    data = torch.load(DEMO_CKPT, weights_only=True)
    data["model"]["decoder.layer_norm.weight"] = data["model"]["decoder.layer_norm.weight"].to(torch.int32)
    torch.save(data, tmp_path / "ckpt.pt")
    shutil.copy(DEMO_CKPT.parent / "tokenizer.json", tmp_path)
    with pytest.raises(TfmExportError, match="decoder.layer_norm.weight holds torch.int32 values"):
        load_checkpoint(tmp_path / "ckpt.pt")


@pytest.mark.parametrize("field, value, fragment", [
    ("dropout", "lots", "dropout must be a number in [0, 1)"), ("dropout", 2.0, "dropout must be a number"),
    ("dropout", float("nan"), "dropout must be a number"), ("src_pad_idx", 99, "src_pad_idx must be a token id"),
    ("trg_pad_idx", "1", "trg_pad_idx must be a token id"), ("d_model", True, "d_model must be a whole number"),
    ("d_model", 10 ** 12, "d_model must be a whole number in 1..65,536"), ("n_layers", 2.0, "n_layers must be"),
    ("n_position", 10 ** 9, "n_position must be a whole number"), ("proj_share_weight", "yes", "true or false"),
])
def test_checkpoint_settings_of_the_wrong_type_or_range_are_one_line(tiny, tmp_path, field, value, fragment):
    data = torch.load(tiny[0].path, weights_only=True)
    data["config"][field] = value
    torch.save(data, tmp_path / "ckpt.pt")
    shutil.copy(tiny[0].path.parent / "tokenizer.json", tmp_path)
    result = CliRunner().invoke(export_main, ["onnx", "--checkpoint", str(tmp_path / "ckpt.pt"), "--output",
                                              str(tmp_path / "out")])
    one_line_error(result, fragment)
    assert not (tmp_path / "out").exists()


def test_a_config_claiming_sizes_its_weights_lack_allocates_nothing_of_that_size(tiny, tmp_path):
    """d_model 65,536 with the tiny model's weights: refused by shape (built on the meta device), not by
    trying to allocate a model of that size."""
    data = torch.load(tiny[0].path, weights_only=True)
    data["config"].update(d_model=65536, d_inner=1 << 18, n_position=65536)
    torch.save(data, tmp_path / "ckpt.pt")
    shutil.copy(tiny[0].path.parent / "tokenizer.json", tmp_path)
    with pytest.raises(TfmExportError, match="has shape .* the config needs"):
        load_checkpoint(tmp_path / "ckpt.pt")


def test_check_on_a_manifest_claiming_a_billion_positions_is_refused_at_once(tiny, tmp_path):
    model = copy_of(tiny[1], tmp_path)
    edit_manifest(model, lambda m: m["model"].update(n_position=10 ** 9))
    one_line_error(run_reader(["check"], model, tmp_path / "out"), "n_position must be a whole number")


def test_a_bom_is_not_part_of_the_first_sentence(demo_onnx, tmp_path):
    (tmp_path / "in.txt").write_bytes("\ufeffforty-two\nforty-two\n".encode())
    result = CliRunner().invoke(run_main, ["translate", "--model", str(demo_onnx), "--input", str(tmp_path / "in.txt")])
    assert result.exit_code == 0 and result.output == "quarante-deux\nquarante-deux\n"


def test_int8_directories_are_not_benchmarked_as_fp32(variants, tmp_path):
    result = CliRunner().invoke(run_main, ["bench", "--model", str(variants["int8-dynamic"]), "--backends",
                                           "ort-fp32"])
    one_line_error(result, "is a int8 directory; bench --model takes a checkpoint or an fp32 model directory")


@pytest.mark.parametrize("args, fragment", [
    (["--length-penalty", "nan"], "--length-penalty nan is outside -10..10"),
    (["--length-penalty", "inf"], "'--length-penalty'"), (["--length-penalty", "1e308"], "'--length-penalty'"),
    (["--length-penalty", "-1e308"], "'--length-penalty'"), (["--threads", "4096"], "'--threads'"),
    (["--backend", "torch", "--threads", "100000"], "'--threads'"),
    (["--ort-trt", "--backend", "torch", "--model-is-ckpt"], "--ort-trt is ONNX Runtime's TensorRT provider"),
    (["--input", "{input}"], "give TEXT arguments or --input FILE, not both"),
    (["--output", ""], "--output is empty"), (["--output", "{model}/manifest.json"], "is the input"),
    (["--output", "{input}", "--input", "{input}", "--no-text"], "is the input"),
])
def test_contradictory_or_unbounded_options_are_one_line(demo_onnx, tmp_path, args, fragment):
    (tmp_path / "in.txt").write_text("forty-two\n")
    model = str(DEMO_CKPT) if "--model-is-ckpt" in args else str(demo_onnx)
    text = [] if "--no-text" in args else ["forty-two"]
    args = [a.format(input=tmp_path / "in.txt", model=demo_onnx) for a in args if a not in ("--model-is-ckpt",
                                                                                             "--no-text")]
    result = CliRunner().invoke(run_main, ["translate", "--model", model, *args, *text])
    one_line_error(result, fragment)
    assert (tmp_path / "in.txt").read_text() == "forty-two\n"


@pytest.mark.parametrize("main, args, fragment", [
    (run_main, ["bench", "--batch-sizes", "1000000000"], "--batch-sizes: values must be 1..1024"),
    (run_main, ["bench", "--beam-sizes", "1,65"], "--beam-sizes: values must be 1..64"),
    (run_main, ["bench", "--threads", "100000"], "'--threads'"),
    (run_main, ["bench", "--sentences", "1000000000"], "'--sentences'"),
    (export_main, ["train-demo", "--threads", "100000"], "'--threads'"),
    (export_main, ["verify", "--beam-size", "100000"], "'--beam-size'"),
    (run_main, ["bench", "--min-time", "nan"], "'nan' is not a number"),
    (export_main, ["verify", "--atol", "nan"], "'nan' is not a number"),
    (export_main, ["verify", "--rtol", "-1"], "'--rtol'"),
    (export_main, ["verify", "--min-agreement", "nan"], "'nan' is not a number"),
    (export_main, ["verify", "--samples", "1000000000"], "'--samples'"),
    (export_main, ["train-demo", "--batch-size", "1000000000"], "'--batch-size'"),
])
def test_absurd_sizes_and_tolerances_are_refused_before_any_work(tmp_path, main, args, fragment):
    """Before: a MemoryError traceback after minutes (bench), a crash by SIGSEGV in torch's thread pool, or a
    nan accepted (a tolerance of nan passes every comparison)."""
    where = ["--output", str(tmp_path / "out")] if args[0] == "train-demo" else ["--model", str(DEMO_CKPT)]
    one_line_error(CliRunner().invoke(main, [*args, *where]), fragment)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["random-checkpoint", "train-demo"])
@pytest.mark.parametrize("output, fragment", [("", "--output is empty"), (" ", "--output is empty"),
                                              ("x" * 300, "File name too long")])
def test_model_writers_refuse_an_empty_or_impossible_output(tmp_path, monkeypatch, command, output, fragment):
    """An empty --output wrote ckpt.pt into the current directory; a blank one into /."""
    monkeypatch.chdir(tmp_path)
    one_line_error(CliRunner().invoke(export_main, [command, "--output", output]), fragment)
    assert listing(tmp_path) == []


def test_the_sources_of_a_torch_and_an_onnx_run_agree_after_all_checks(demo_onnx):
    """The hardening changes no answer: the graphs still translate as PyTorch does."""
    texts = ["forty-two", "seven hundred and seventy-one thousand and eighty", ""]
    onnx_out = [t.text for t in Translator.load(demo_onnx).translate(texts)]
    torch_out = [t.text for t in Translator.load(DEMO_CKPT).translate(texts)]
    assert onnx_out == torch_out and onnx_out[0] == "quarante-deux"
