"""The pre-packed graphs (runtime.prepacked_graphs): made by export, quantize and `tfm-export prepack`, opened read-only
by translation, the same translations with them as without (the oracle: the same directory loaded without them), and
every entry that is damaged, stale or foreign left unused, with a warning, and nothing written. With them, the stamps
(core.stamps) that spare a load the hashing of files unchanged since the command that wrote them hashed them; a file
written, copied or replaced since is hashed (and refused where it differs) as if there were none."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import onnxruntime as ort
import pytest
from click.testing import CliRunner
from support.common import listing, unwritable_dir, within

from tfm_export import DecodeOptions, Translator
from tfm_export.artifacts.manifest import ModelDirError
from tfm_export.cli.export_cli import main as export_main
from tfm_export.cli.run_cli import main as run_main
from tfm_export.core import stamps as stamps_module
from tfm_export.core.errors import TfmExportError
from tfm_export.core.files import file_sha256
from tfm_export.demo import numbers as demo_numbers
from tfm_export.runtime import prepacked_graphs
from tfm_export.runtime import session as session_module
from tfm_export.runtime.prepacked_graphs import DATA, ENTRY, GRAPH, PREPACKED_DIR, STAMPS, PrepackedGraphs
from tfm_export.runtime.session import SessionOptions

TEXTS = [en for en, _ in demo_numbers.held_out_pairs()[:24]]
OPTIONS = DecodeOptions(beam_size=4)
FP32_GRAPHS = ["decoder_step_search_fused", "encoder"]


@pytest.fixture
def model(demo_onnx, tmp_path) -> Path:
    """A copy of the demo directory (with the pre-packed graphs its export made) of this test's own."""
    return Path(shutil.copytree(demo_onnx, tmp_path / "model"))


@pytest.fixture(scope="module")
def expected(demo_onnx) -> list[str]:
    return translate(demo_onnx, on=False)


@pytest.fixture
def opened(monkeypatch) -> list[Path]:
    """The graph files ONNX Runtime sessions are made from, as they are made."""
    paths: list[Path] = []
    real = ort.InferenceSession

    def recording(path, *args, **kwargs):
        paths.append(Path(path))
        return real(path, *args, **kwargs)
    monkeypatch.setattr(session_module.ort, "InferenceSession", recording)
    return paths


def translate(model: Path, on: bool = True) -> list[str]:
    translator = Translator.load(model, session_options=SessionOptions(prepacked_graphs=on))
    return [r.text for r in translator.translate(TEXTS, OPTIONS)]


def from_cache(opened: list[Path], model: Path) -> list[str]:
    """The graphs a load opened from the pre-packed entries, and nothing from the directory's own files."""
    assert all(p.parent.parent == model / PREPACKED_DIR for p in opened), opened
    return sorted(p.parent.name for p in opened)


def not_from_cache(opened: list[Path], model: Path) -> None:
    assert opened and all(p.parent == model for p in opened), opened


def test_export_makes_the_entries_and_a_translation_opens_them_and_writes_nothing(model, expected, opened,
                                                                                   caplog):
    assert sorted(p.name for p in (model / PREPACKED_DIR).iterdir()) == [*FP32_GRAPHS, STAMPS]
    manifest = json.loads((model / "manifest.json").read_text())
    for graph in FP32_GRAPHS:
        entry = model / PREPACKED_DIR / graph
        assert sorted(p.name for p in entry.iterdir()) == [ENTRY, GRAPH, DATA]
        record = json.loads((entry / ENTRY).read_text())
        assert record["key"]["sha256"] == manifest["graphs"][graph]["sha256"]
        assert record["key"]["prepacked"] == (graph != "encoder")
        assert all(record["files"][name]["sha256"] == file_sha256(entry / name) for name in (GRAPH, DATA))
    before = listing(model)
    with caplog.at_level(logging.INFO):
        assert translate(model) == expected
    assert from_cache(opened, model) == FP32_GRAPHS
    assert "encoder, decoder_step_search_fused opened from its pre-packed graphs" in caplog.text  # with -v
    assert listing(model) == before
    opened.clear()
    assert translate(model, on=False) == expected
    not_from_cache(opened, model)


def test_quantize_makes_entries_for_int8_dynamic_and_none_where_no_search_step(variants, tmp_path, opened):
    model = Path(shutil.copytree(variants["int8-dynamic"], tmp_path / "int8"))
    assert sorted(p.name for p in (model / PREPACKED_DIR).iterdir()) == ["decoder_step_search", "encoder", STAMPS]
    without = translate(model, on=False)
    opened.clear()
    assert translate(model) == without
    assert from_cache(opened, model) == ["decoder_step_search", "encoder"]
    assert not (variants["int8-static"] / PREPACKED_DIR).exists()  # decodes with decoder_step: nothing to pre-pack
    assert not (variants["fp16"] / PREPACKED_DIR).exists()  # for GPUs


def flip_a_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("where", ["start", "middle"])
def test_a_damaged_weights_file_is_not_used(model, expected, opened, caplog, where):
    """At the start, a bias (a value ONNX Runtime loads unchecked): only the sha256 sees it. In the middle, packed
    weights, which ONNX Runtime may refuse itself. Either way one warning, and the decoder from its own graph."""
    data = model / PREPACKED_DIR / "decoder_step_search_fused" / DATA
    flip_a_byte(data, 0 if where == "start" else data.stat().st_size // 2)
    before = listing(model)
    with caplog.at_level(logging.WARNING):
        assert translate(model) == expected
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "tfm-export prepack" in warnings[0], warnings
    if where == "start":
        assert "differ from the sha256" in warnings[0]
    assert model / "decoder_step_search_fused.onnx" in opened  # loaded again from the directory's own graph
    assert listing(model) == before  # nothing removed or rebuilt: prepack does that


def test_the_load_made_again_after_a_damaged_entry_reports_its_own_hashing(model, caplog):
    """Stamped in place, then an entry damaged: the first attempt knew the directory's files by their stamps, the
    load made again without the entries hashed every file, and -v reports that load."""
    result = CliRunner().invoke(export_main, ["prepack", "--model", str(model)])
    assert result.exit_code == 0, result.output
    flip_a_byte(model / PREPACKED_DIR / "decoder_step_search_fused" / DATA, 0)
    with caplog.at_level(logging.INFO):
        translate(model)
    assert "differ from the sha256" in caplog.text and "0 file(s) known by their stamps" in caplog.text


def test_a_graph_file_onnx_runtime_cannot_read_is_not_used(model, expected, opened, caplog):
    (model / PREPACKED_DIR / "encoder" / GRAPH).write_bytes(b"not a graph")
    with caplog.at_level(logging.WARNING):
        assert translate(model) == expected
    assert [r.getMessage().count("cannot be loaded") for r in caplog.records] == [1]  # one line, not two
    assert "tfm-export prepack" in caplog.text
    assert model / "encoder.onnx" in opened


def test_entries_copied_from_another_model_are_not_used(model, variants, expected, opened, caplog):
    """Another model's entry in this model's slot: its key names other graph bytes. Its data file alone under
    this model's entry: not the file whose sha256 the entry records."""
    other = variants["int8-dynamic"] / PREPACKED_DIR
    shutil.rmtree(model / PREPACKED_DIR / "encoder")
    shutil.copytree(other / "encoder", model / PREPACKED_DIR / "encoder")
    with caplog.at_level(logging.WARNING):
        assert translate(model) == expected
    assert "made for another graph;" in caplog.text
    assert model / "encoder.onnx" in opened
    shutil.copyfile(other / "decoder_step_search" / DATA, model / PREPACKED_DIR / "decoder_step_search_fused" / DATA)
    opened.clear()
    assert translate(model) == expected
    assert model / "decoder_step_search_fused.onnx" in opened


@pytest.mark.parametrize("changed", ["onnxruntime_build", "cpu_kernel_key"])
def test_another_onnx_runtime_or_cpu_is_not_used_until_prepack_remakes_them(model, expected, opened, monkeypatch,
                                                                            caplog, changed):
    monkeypatch.setattr(prepacked_graphs, changed, lambda: "something else")
    before = listing(model)
    with caplog.at_level(logging.WARNING):
        assert translate(model) == expected
    field, what = {"onnxruntime_build": ("onnxruntime", "ONNX Runtime build"),
                   "cpu_kernel_key": ("machine", "CPU")}[changed]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and all(f"made for another {what};" in w and "tfm-export prepack" in w
                                      for w in warnings)
    not_from_cache(opened, model)
    assert listing(model) == before
    result = CliRunner().invoke(export_main, ["prepack", "--model", str(model)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"wrote {model / PREPACKED_DIR}: {', '.join(FP32_GRAPHS)}"
    assert listing(model) == before  # the same names, remade in place
    for graph in FP32_GRAPHS:
        assert json.loads((model / PREPACKED_DIR / graph / ENTRY).read_text())["key"][field] == "something else"
    opened.clear()
    assert translate(model) == expected and from_cache(opened, model) == FP32_GRAPHS


def test_other_session_options_load_without_them_quietly(model, opened, caplog):
    with caplog.at_level(logging.WARNING):
        Translator.load(model, session_options=SessionOptions(optimization="basic")).translate(TEXTS[:2])
    assert not caplog.records
    not_from_cache(opened, model)


@pytest.mark.parametrize("flag, variable", [("--prepacked-graphs", "TFM_PREPACKED_GRAPHS"),
                                            ("--graph-cache", "TFM_GRAPH_CACHE")])  # their earlier names
def test_off_and_the_environment_turn_them_off(model, opened, monkeypatch, flag, variable):
    before = listing(model)
    result = CliRunner().invoke(run_main, ["translate", "--model", str(model), flag, "off", TEXTS[0]])
    assert result.exit_code == 0, result.output
    not_from_cache(opened, model)
    opened.clear()
    monkeypatch.setenv(variable, "off")
    result = CliRunner().invoke(run_main, ["translate", "--model", str(model), TEXTS[0]])
    assert result.exit_code == 0, result.output
    not_from_cache(opened, model)
    opened.clear()
    monkeypatch.delenv(variable)
    result = CliRunner().invoke(run_main, ["translate", "--model", str(model), TEXTS[0]])
    assert result.exit_code == 0, result.output
    assert from_cache(opened, model) == FP32_GRAPHS
    assert listing(model) == before


def test_a_read_only_model_directory_uses_its_entries(model, expected, opened):
    with unwritable_dir(model):
        assert translate(model) == expected
        assert from_cache(opened, model) == FP32_GRAPHS


def test_prepack_makes_the_entries_of_a_directory_without_them(model, expected, opened):
    shutil.rmtree(model / PREPACKED_DIR)
    assert translate(model) == expected
    not_from_cache(opened, model)
    result = CliRunner().invoke(export_main, ["prepack", "--model", str(model)])
    assert result.exit_code == 0, result.output
    opened.clear()
    assert translate(model) == expected and from_cache(opened, model) == FP32_GRAPHS


def test_a_failed_prepack_leaves_the_directory_as_it_was(model, monkeypatch):
    """Failing on the second graph: no staging left, the old entries untouched."""
    shutil.rmtree(model / PREPACKED_DIR / "decoder_step_search_fused")
    before = {p: p.read_bytes() for p in (model / PREPACKED_DIR).rglob("*") if p.is_file()}
    names = listing(model)
    real = PrepackedGraphs._build

    def second_fails(self, slot, *args):
        if slot.name != "encoder":
            raise TfmExportError("disk full, say")
        return real(self, slot, *args)
    monkeypatch.setattr(PrepackedGraphs, "_build", second_fails)
    result = CliRunner().invoke(export_main, ["prepack", "--model", str(model)])
    assert result.exit_code == 1 and result.output == "Error: disk full, say\n"
    assert listing(model) == names
    assert {p: p.read_bytes() for p in (model / PREPACKED_DIR).rglob("*") if p.is_file()} == before


def test_prepack_refuses_bad_paths_in_one_line(model, variants, tmp_path):
    (model / "encoder.onnx").write_bytes(b"damaged")
    checkpoint = tmp_path / "ckpt.pt"
    checkpoint.write_bytes(b"x")
    cases = {tmp_path / "missing": "not found", checkpoint: "not a model directory",
             model: "sha256 differs", variants["int8-static"]: "nothing to pre-pack"}
    for path, message in cases.items():
        result = CliRunner().invoke(export_main, ["prepack", "--model", str(path)])
        assert result.exit_code == 1 and result.output.startswith("Error: "), result.output
        assert message in result.output and result.output.count("\n") == 1, result.output
    assert not [p for p in model.iterdir() if p.name.endswith(".partial")]


def test_prepack_into_a_read_only_directory_is_one_line(model):
    with unwritable_dir(model):
        result = CliRunner().invoke(export_main, ["prepack", "--model", str(model)])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert "cannot write its pre-packed graphs" in result.output



def test_no_prepack_leaves_them_out(demo_onnx, tmp_path):
    result = CliRunner().invoke(export_main, ["quantize", "--model", str(demo_onnx), "--precision", "int8", "--mode",
                                              "dynamic", "--output", str(tmp_path / "q"), "--no-prepack"])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "q" / PREPACKED_DIR).exists()


def test_a_quantize_that_cannot_prepack_writes_its_directory_and_warns(demo_onnx, tmp_path, monkeypatch, caplog):
    def fails(*args):
        raise TfmExportError("ONNX Runtime cannot save it, say")
    monkeypatch.setattr(PrepackedGraphs, "_build", fails)
    with caplog.at_level(logging.WARNING):
        result = CliRunner().invoke(export_main, ["quantize", "--model", str(demo_onnx), "--precision", "int8",
                                                  "--mode", "dynamic", "--output", str(tmp_path / "q")])
    assert result.exit_code == 0, result.output
    assert "pre-packed graphs not made (ONNX Runtime cannot save it, say)" in caplog.text
    assert not (tmp_path / "q" / PREPACKED_DIR).exists() and not [p for p in (tmp_path / "q").iterdir()
                                                              if p.name.startswith(".")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q"]


@pytest.fixture
def hashed(monkeypatch) -> list[Path]:
    """The files a load reads to hash them, as it reads them."""
    paths: list[Path] = []
    real = stamps_module.file_sha256

    def recording(path):
        paths.append(Path(path))
        return real(path)
    monkeypatch.setattr(stamps_module, "file_sha256", recording)
    return paths


@pytest.fixture
def prepacked(model) -> Path:
    """The test's copy remade in place by prepack, so that its stamps name this copy's files."""
    result = CliRunner().invoke(export_main, ["prepack", "--model", str(model)])
    assert result.exit_code == 0, result.output
    return model


def test_after_prepack_a_load_hashes_nothing_and_translates_the_same(prepacked, expected, hashed, caplog):
    with caplog.at_level(logging.INFO):
        assert translate(prepacked) == expected
    assert hashed == []
    assert ", 0 hashed" in caplog.text  # -v says so
    assert translate(prepacked, on=False) == expected
    assert {p.name for p in hashed} >= {"encoder.onnx", "decoder_step_search_fused.onnx"}  # off: stamps unread


def write_back(path: Path, offset: int) -> None:
    """One byte flipped, the file's size and modification time as they were (its change time cannot be)."""
    st = path.stat()
    flip_a_byte(path, offset)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_stamped_directory_file_written_since_is_hashed_and_refused(prepacked, hashed):
    write_back(prepacked / "encoder.onnx", (prepacked / "encoder.onnx").stat().st_size - 16)
    with pytest.raises(ModelDirError, match="encoder.onnx: sha256 differs"):
        Translator.load(prepacked)
    assert [p.name for p in hashed] == ["encoder.onnx"]


def test_a_stamped_entry_written_since_is_hashed_and_not_used(prepacked, expected, opened, hashed, caplog):
    write_back(prepacked / PREPACKED_DIR / "decoder_step_search_fused" / DATA, 0)
    with caplog.at_level(logging.WARNING):
        assert translate(prepacked) == expected
    assert "differ from the sha256" in caplog.text and DATA in [p.name for p in hashed]
    assert prepacked / "decoder_step_search_fused.onnx" in opened


def test_a_copy_of_a_prepacked_directory_hashes_its_files(prepacked, expected, opened, hashed, tmp_path, caplog):
    copy = Path(shutil.copytree(prepacked, tmp_path / "copy"))  # bytes and modification times kept
    with caplog.at_level(logging.INFO):
        assert translate(copy) == expected
    assert "0 file(s) known by their stamps" in caplog.text
    assert {p.name for p in hashed} >= {"encoder.onnx", "decoder_step_search_fused.onnx", DATA}
    assert from_cache(opened, copy) == FP32_GRAPHS


def test_a_damaged_directory_is_its_own_error_alone(model, monkeypatch, caplog):
    """Stale entries in a directory whose own file is damaged: the load fails on the damage, and says nothing of the
    entries (it would be two lines about one problem)."""
    monkeypatch.setattr(prepacked_graphs, "cpu_kernel_key", lambda: "something else")
    flip_a_byte(model / "encoder.onnx", (model / "encoder.onnx").stat().st_size - 16)
    with caplog.at_level(logging.WARNING), pytest.raises(ModelDirError, match="encoder.onnx: sha256 differs"):
        Translator.load(model)
    assert not caplog.records


def rehash_manifest(model: Path, name: str) -> None:
    manifest = json.loads((model / "manifest.json").read_text())
    manifest["files"][name] = file_sha256(model / name)
    (model / "manifest.json").write_text(json.dumps(manifest))


def test_an_entry_made_from_other_weights_is_not_used(model, opened, caplog):
    """The graphs as they were, their weights file and the manifest another model's (`cp B/* A/`): the entry's key
    names the weights it was made from, so it is stale, and the directory's own graph opens."""
    data = "decoder_step_search_fused.onnx.data"
    flip_a_byte(model / data, 0)
    rehash_manifest(model, data)
    with caplog.at_level(logging.WARNING):
        translate(model)
    assert f"{PREPACKED_DIR}/decoder_step_search_fused: made for another graph;" in caplog.text
    assert model / "decoder_step_search_fused.onnx" in opened
    assert from_cache([p for p in opened if p.parent != model], model) == ["encoder"]


@pytest.mark.parametrize("how", ["record dropped", "stray folder"])
def test_an_entry_whose_graph_could_load_an_unlisted_file_is_not_used(model, expected, opened, caplog, how):
    """Every file below the entry's folder but entry.json must be one it lists with its sha256: ONNX Runtime resolves
    external data anywhere below the graph's folder, and would load an unlisted file unchecked. Here the listed data
    is zeroed with its record dropped, or a stray copy waits in a folder the entry does not list."""
    slot = model / PREPACKED_DIR / "decoder_step_search_fused"
    if how == "record dropped":
        entry = json.loads((slot / ENTRY).read_text())
        del entry["files"][DATA]
        (slot / ENTRY).write_text(json.dumps(entry))
        (slot / DATA).write_bytes(bytes((slot / DATA).stat().st_size))
    else:
        (slot / "sub").mkdir()
        shutil.copyfile(slot / DATA, slot / "sub" / DATA)
    with caplog.at_level(logging.WARNING):
        assert translate(model) == expected
    assert f"{slot}: its files are not the ones its entry lists" in caplog.text
    assert model / "decoder_step_search_fused.onnx" in opened


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_stamps_that_are_a_pipe_or_a_device_are_not_read(model, expected, caplog, kind):
    """A FIFO's read waits for a writer forever; /dev/zero never ends. Neither is read: every file is hashed."""
    stamps = model / PREPACKED_DIR / STAMPS
    stamps.unlink()
    os.mkfifo(stamps) if kind == "fifo" else os.symlink("/dev/zero", stamps)
    with caplog.at_level(logging.INFO):
        assert within(120, lambda: translate(model)) == expected
    assert "0 file(s) known by their stamps" in caplog.text


@pytest.mark.parametrize("kind", ["symlink", "file"])
def test_prepack_refuses_a_cache_that_is_a_link_or_a_file_and_leaves_nothing(model, tmp_path, kind):
    cache = model / PREPACKED_DIR
    if kind == "symlink":
        shutil.move(cache, tmp_path / "elsewhere")
        os.symlink(tmp_path / "elsewhere", cache)
    else:
        shutil.rmtree(cache)
        cache.write_text("x")
    before, outside = listing(model), listing(tmp_path)
    result = CliRunner().invoke(export_main, ["prepack", "--model", str(model)])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert {"symlink": "is a symbolic link", "file": "is a file"}[kind] in result.output
    assert "nothing was changed" in result.output
    assert listing(model) == before and listing(tmp_path) == outside


def test_a_translation_does_not_follow_a_linked_cache(model, expected, opened, tmp_path, caplog):
    """Its files would lie outside the model directory: the load says so and opens the directory's own graphs."""
    shutil.move(model / PREPACKED_DIR, tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", model / PREPACKED_DIR)
    with caplog.at_level(logging.WARNING):
        assert translate(model) == expected
    assert [r.getMessage().count("is a symbolic link") for r in caplog.records] == [1]
    not_from_cache(opened, model)


def test_a_cache_that_cannot_be_moved_aside_is_left_as_it_was(model, monkeypatch):
    """An immutable .tfm-cache refuses its rename (EPERM): the old one stays, and no empty .tfm-cache.old.* is left
    beside it. The file system's refusal is injected for the one rename it stands for."""
    real = os.replace

    def refusing(src, dst):
        if Path(src) == model / PREPACKED_DIR:
            raise PermissionError(1, "Operation not permitted")
        return real(src, dst)
    before = {p: p.read_bytes() for p in (model / PREPACKED_DIR).rglob("*") if p.is_file()}
    names = listing(model)
    monkeypatch.setattr(prepacked_graphs.os, "replace", refusing)
    result = CliRunner().invoke(export_main, ["prepack", "--model", str(model)])
    assert result.exit_code == 1 and "Operation not permitted" in result.output, result.output
    assert "nothing was changed" in result.output
    assert listing(model) == names
    assert {p: p.read_bytes() for p in (model / PREPACKED_DIR).rglob("*") if p.is_file()} == before
