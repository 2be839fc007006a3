"""examples/cpp: its tokenizer is held to Python's; its translator, built as `make cpp` builds it
(scripts/build_cpp.py: Debian's ONNX Runtime headers, the onnxruntime wheel's library), is held to tfm-run: the same
text on the demo's 1,000 held-out numbers (step loop and generate.onnx), the demo's n-best order and scores, the
bench's cpp backend, and one line for each bad input. Its --ids mode on other models: test_cpp_ids.py."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from click.testing import CliRunner
from support.common import DEMO_CKPT, REPO
from support.cpp import SCORE_TOLERANCE, built_translator, run_cpp

from tfm_export import Translator
from tfm_export.artifacts.manifest import MODEL_FORMAT, MODEL_FORMAT_VERSION
from tfm_export.bench.protocol import BenchSettings, measure
from tfm_export.bench.runners import Artifacts
from tfm_export.cli.run_cli import main as run_main
from tfm_export.core.tokenizer import load_tokenizer, plain_word_tokenizer
from tfm_export.demo import numbers as demo_numbers
from tfm_export.runtime.translator import DecodeOptions

CPP_DIR = REPO / "examples" / "cpp"
DEMO_MODES = {"greedy": ((), DecodeOptions()),
              "beam 4": (("--beam-size", "4"), DecodeOptions(beam_size=4)),
              "beam 4, length penalty 0.6": (("--beam-size", "4", "--length-penalty", "0.6"),
                                             DecodeOptions(beam_size=4, length_penalty=0.6))}
DEMO_LINES = {"greedy": 1000, "beam 4": 1000, "beam 4, length penalty 0.6": 300}  # of the held-out numbers
DEMO_BATCHES = {"greedy": (1, 32), "beam 4": (1, 32), "beam 4, length penalty 0.6": (32,)}  # the step loop's
GENERATE_LINES = 300


@pytest.fixture(scope="module")
def tokenize_check() -> Path:
    """Built beside the translator by `make cpp`'s script, with the nlohmann-json it fetches from Debian."""
    return built_translator().parent.parent / "tokenize_check"


@pytest.fixture(scope="module")
def tfm_translate() -> Path:
    return built_translator()


def test_cpp_tokenizer_matches_python_on_the_demo_tokenizer(tokenize_check):
    path = DEMO_CKPT.parent / "tokenizer.json"
    tok = load_tokenizer(path)
    lines = [text for n in demo_numbers.held_out_numbers()[:100]
             for text in (demo_numbers.english(n), demo_numbers.french(n))]
    lines += ["", "   ", "  Forty-Two ,  ONE", "unknown words here", "quatre-vingt-dix-neuf", *UNICODE_LINES]
    assert cpp_tokenize(tokenize_check, path, lines) == [(tok.encode(s), tok.decode(tok.encode(s))) for s in lines]


# what NFKC, lowercasing and Unicode's whitespace change: full-width letters, ligatures, numerals, Greek capitals
# (sigma lowercased alone, as Rust does), dotted I, non-breaking and other spaces, vertical tab, NEL, separators
UNICODE_LINES = ["ＦＯＲＴＹ－ＴＷＯ", "ﬁve ﬂ Ⅻ ①", "ΣΊΣΥΦΟΣ ὈΔΥΣΣΕΎΣ", "İstanbul ǅ", "forty\u00a0two\u2003one",
                 "one\u000btwo\u0085three\u2028four\u3000five", "\u200bzero\u200bwidth", "café naïve 東京 🙂"]


def cpp_tokenize(binary: Path, tokenizer_json: Path, lines: list[str]) -> list[tuple[list[int], str]]:
    out = subprocess.run([str(binary), str(tokenizer_json)], input="\n".join(lines) + "\n", capture_output=True,
                         text=True, check=True, timeout=60).stdout
    rows = [line.split("\t") for line in out.split("\n")[:-1]]
    return [([int(i) for i in ids.split()], text) for ids, text in rows]


def test_cpp_tokenizer_matches_python_on_a_plain_vocabulary(tokenize_check, tmp_path):
    tok = plain_word_tokenizer(["<unk>", "<blank>", "<s>", "</s>", "ein", "Haus", "am", "See"], "test")
    tok.save(tmp_path / "tokenizer.json")
    lines = ["ein Haus am See", "  ein   fremdes Haus ", ""]
    got = cpp_tokenize(tokenize_check, tmp_path / "tokenizer.json", lines)
    assert got == [(tok.encode(s), tok.decode(tok.encode(s))) for s in lines]


@pytest.mark.parametrize("mode", DEMO_MODES)
def test_demo_heldout_numbers_translate_as_tfm_run_does(tfm_translate, demo_generate, mode):
    """The held-out numbers (all 1,000 greedy and beam 4, in batches of 1 and 32; 300 with a length penalty, in
    batches of 32) and a blank line through decoder_step_search, and the last 300 lines through generate.onnx (the
    suite's time): the text `tfm-run translate` gives, line for line."""
    flags, options = DEMO_MODES[mode]
    lines = [en for en, _ in demo_numbers.held_out_pairs()[:DEMO_LINES[mode]]] + [""]
    want = [r.text for r in Translator.load(demo_generate).translate(lines, options)]
    runs = [(("--batch-size", str(batch)), len(lines)) for batch in DEMO_BATCHES[mode]]
    runs.append((("--generate",), GENERATE_LINES))
    for graph, count in runs:
        lines, want = lines[-count:], want[-count:]  # the blank line kept
        got = run_cpp(tfm_translate, demo_generate, lines, *flags, *graph)
        differ = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
        assert not differ, f"{mode} {graph}: {len(differ)} lines differ, first {lines[differ[0]]!r}: " \
                           f"{got[differ[0]]!r} against {want[differ[0]]!r}"


def test_the_external_layout_translates_as_tfm_run_does(tfm_translate, demo_external):
    """Every graph's weights in one shared file (the layout of models past 2 GB), checked once and found by ONNX
    Runtime beside the graphs: 100 held-out numbers in each mode, as tfm-run gives them."""
    lines = [en for en, _ in demo_numbers.held_out_pairs()[:100]]
    for flags, options in DEMO_MODES.values():
        want = [r.text for r in Translator.load(demo_external).translate(lines, options)]
        assert run_cpp(tfm_translate, demo_external, lines, *flags) == want


def test_demo_nbest_ranks_and_scores_as_tfm_run_does(tfm_translate, demo_onnx):
    """Beam 4's 4 best of 100 held-out numbers, which end at different lengths, so the length penalty decides
    their order: tfm-run's SCORE<TAB>TRANSLATION lines, the same texts in the same order, and the same scores."""
    lines = [en for en, _ in demo_numbers.held_out_pairs()[:100]]
    for penalty in (0.6, 2.0):
        want = Translator.load(demo_onnx).translate(lines, DecodeOptions(beam_size=4, n_best=4, length_penalty=penalty))
        out = run_cpp(tfm_translate, demo_onnx, lines, "--beam-size", "4", "--n-best", "4", "--length-penalty",
                      str(penalty))
        got = [line.split("\t") for line in out]
        for i, result in enumerate(want):
            found = got[4 * i:4 * i + 4]
            assert [text for _, text in found] == [a.text for a in result.n_best], (penalty, lines[i])
            np.testing.assert_allclose([float(s) for s, _ in found], [a.score for a in result.n_best],
                                       atol=SCORE_TOLERANCE)


def test_jsonl_is_tfm_runs_jsonl(tfm_translate, demo_onnx):
    """--format jsonl, with and without --n-best, blank lines among the inputs: each line's keys in tfm-run's
    order and its values tfm-run's (scores within SCORE_TOLERANCE; time_ms is each decode's own)."""
    lines = [en for en, _ in demo_numbers.held_out_pairs()[:20]]
    lines[7:7] = [""]
    for options in ((), ("--beam-size", "4", "--n-best", "3", "--length-penalty", "0.6")):
        want = tfm_run_jsonl(demo_onnx, lines, *options)
        got = [json.loads(line) for line in run_cpp(tfm_translate, demo_onnx, lines, "--format", "jsonl", *options)]
        assert len(got) == len(want)
        for mine, theirs in zip(got, want, strict=True):
            assert list(mine) == list(theirs)
            assert _scores(mine) == pytest.approx(_scores(theirs), abs=SCORE_TOLERANCE)
            assert _without_scores(mine) == _without_scores(theirs)


def tfm_run_jsonl(model: Path, lines: list[str], *options: str) -> list[dict]:
    result = CliRunner().invoke(run_main, ["translate", "--model", str(model), "--format", "jsonl", *options],
                                input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.output.splitlines()]


def _scores(row: dict) -> list[float | None]:
    return [row["score"], *(x for entry in row.get("n_best", []) for x in (entry["score"], entry["log_prob"]))]


def _without_scores(row: dict) -> dict:
    entries = [{**entry, "score": None, "log_prob": None} for entry in row.get("n_best", [])]
    return {**row, "score": None, "time_ms": None, **({"n_best": entries} if entries else {})}


def test_the_bench_times_the_cpp_loop_beside_tfm_run(tfm_translate, demo_onnx, monkeypatch):
    """`tfm-run bench`'s cpp backend: one process per setting kept running, forced lengths, ort-fp32's outputs."""
    monkeypatch.setenv("TFM_CPP_TRANSLATE", str(tfm_translate))
    artifacts = Artifacts(None, {"fp32": demo_onnx}, None)
    tokenizer = load_tokenizer(demo_onnx / "tokenizer.json")
    sources = [tokenizer.encode(en, framed=True) for en, _ in demo_numbers.held_out_pairs()[:4]]
    settings = BenchSettings(backends=("ort-fp32", "cpp"), batch_sizes=(1, 2), beam_sizes=(1, 4), output_length=8,
                             repeats=2, min_time=0, threads=1, sweep_backends=())
    reference = measure("ort-fp32", artifacts, sources, 8, 200, settings)
    result = measure("cpp", artifacts, sources, 8, 200, settings, reference.outputs)
    assert not result.skipped and result.outputs == reference.outputs and result.peak_rss_mb > 10
    for row in result.rows:
        assert row.tokens == 2 * row.batch * 8  # two timed batches of forced length 8


def _copied(demo: Path, tmp: Path) -> Path:
    out = tmp / "model"
    shutil.copytree(demo, out)
    return out


def _rehash(model: Path, graph: str, file: str) -> None:
    manifest = json.loads((model / "manifest.json").read_text())
    manifest["graphs"][graph]["sha256"] = hashlib.sha256((model / file).read_bytes()).hexdigest()
    (model / "manifest.json").write_text(json.dumps(manifest))


def _edit_manifest(model: Path, change: Callable[[dict], None]) -> None:
    manifest = json.loads((model / "manifest.json").read_text())
    change(manifest)
    (model / "manifest.json").write_text(json.dumps(manifest))


def _other_inputs(model: Path) -> None:
    """decoder_step.onnx put where decoder_step_search.onnx belongs, rehashed into the manifest."""
    shutil.copy(model / "decoder_step.onnx", model / "decoder_step_search.onnx")
    _rehash(model, "decoder_step_search", "decoder_step_search.onnx")


BAD = {  # name -> (what is done to a copy of the demo directory, input lines, options, the line's words)
    "not a model directory": (lambda m: (m / "manifest.json").unlink(), ["forty-two"], (),
                              "not a tfm-export model directory"),
    "unreadable manifest": (lambda m: (m / "manifest.json").write_text('{"format": "tfm-export-model",'),
                            ["forty-two"], (), "manifest.json: cannot read it"),
    "other graph inputs": (_other_inputs, ["forty-two"], ("--no-fused",),
                           "input 2 is 'past_key_values.0.decoder.key' where the contract has 'cache_length'"),
    "empty input": (lambda m: None, [], (), "empty input"),
    "damaged file": (lambda m: (m / "tokenizer.json").write_text("{}"), ["forty-two"], (), "sha256 differs"),
    "path outside": (lambda m: _edit_manifest(m, lambda d: d["graphs"]["encoder"].update(file="../encoder.onnx")),
                     ["forty-two"], (), "is not a plain file name"),
    "bad ids": (lambda m: None, ["2 x 3"], ("--ids",), "'x' is not a token id"),
    "manifest field missing": (lambda m: _edit_manifest(m, lambda d: d["model"].pop("n_layers")), ["forty-two"], (),
                               "key 'n_layers' not found; export the model again"),
    "manifest field mistyped": (lambda m: _edit_manifest(m, lambda d: d["model"].update(n_head="four")),
                                ["forty-two"], (), "type must be number, but is string; export the model again"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_and_exit_1(tfm_translate, demo_onnx, tmp_path, case):
    damage, lines, options, words = BAD[case]
    model = _copied(demo_onnx, tmp_path)
    damage(model)
    done = subprocess.run([str(tfm_translate), str(model), *options], input="".join(f"{x}\n" for x in lines),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ") and words in done.stderr, done.stderr


USAGE = {  # name -> (arguments after the model directory, the line's words)
    "unknown option": (("--beam", "4"), "unknown option --beam"),
    "missing value": (("--beam-size",), "--beam-size needs a value"),
    "not a number": (("--max-length", "ten"), "--max-length takes a whole number, not 'ten'"),
    "unknown device": (("--device", "tpu"), "--device takes cpu, cuda or tensorrt, not 'tpu'"),
}


@pytest.mark.parametrize("case", USAGE)
def test_a_usage_mistake_is_one_line_and_exit_2(tfm_translate, demo_onnx, case):
    arguments, words = USAGE[case]
    done = subprocess.run([str(tfm_translate), str(demo_onnx), *arguments], input="forty-two\n",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"error: {words} (tfm_translate --help lists the options)\n"


@pytest.mark.parametrize(("device", "provider"), [("cuda", "CUDAExecutionProvider"),
                                                  ("tensorrt", "TensorrtExecutionProvider")])
def test_a_device_the_library_lacks_is_refused_not_run_on_the_cpu(tfm_translate, demo_onnx, device, provider):
    """This machine's ONNX Runtime library is the CPU wheel's: --device cuda or tensorrt is one line and exit 1,
    before any input is read or translated."""
    if provider in onnxruntime.get_available_providers():
        pytest.skip(f"this ONNX Runtime has {provider}: the refusal cannot happen here")
    done = subprocess.run([str(tfm_translate), str(demo_onnx), "--device", device], input="forty-two\n",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and f"--device {device}: this ONNX Runtime library (" in done.stderr
    assert f"has no {provider}" in done.stderr


def test_help_and_version_answer_on_stdout(tfm_translate):
    """tfm-run's option names in --help; --version names the manifest format the command reads (the Python side's
    own) and the ONNX Runtime it runs on. Neither needs a model directory."""
    helped = subprocess.run([str(tfm_translate), "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and helped.stderr == ""
    for option in ("--beam-size N", "--length-penalty A", "--n-best N", "--max-length N", "--threads N"):
        assert f"\n  {option} " in helped.stdout
    version = subprocess.run([str(tfm_translate), "--version"], capture_output=True, text=True, timeout=60)
    major_minor = ".".join(onnxruntime.__version__.split(".")[:2])
    assert version.returncode == 0
    assert f"reads {MODEL_FORMAT} version {MODEL_FORMAT_VERSION} directories; ONNX Runtime {major_minor}" in \
        version.stdout


def test_a_source_too_long_is_named_by_its_line(tfm_translate, demo_onnx):
    """As tfm-run names it and when: every line of what has arrived is read before any is decoded, so a line
    after it in the same chunk is not translated, and one line says which input was too long."""
    done = subprocess.run([str(tfm_translate), str(demo_onnx)], input="forty-two\n" + "one " * 300 + "\n",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == "", done
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: line 2: source of 302 tokens"), done.stderr


def _build_script():
    """scripts/build_cpp.py as a module (scripts/ is not a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("build_cpp", REPO / "scripts" / "build_cpp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_headers_come_from_this_machines_own_mirror_with_only_the_suite_changed(tmp_path):
    """make cpp's apt sources: each of the machine's entries for its release's main suite, in either format, with
    the suite asked for (trixie for ONNX Runtime's headers) and its keyring kept; other suites and disabled entries
    are left out; none is one line."""
    script = _build_script()
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n"
        "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nEnabled: no\n")
    (tmp_path / "sources.list").write_text("deb [arch=amd64 signed-by=/k.gpg] http://other.example/debian bookworm "
                                           "main contrib\ndeb http://other.example/debian bookworm-backports main\n")
    assert script.mirror_sources("bookworm", "trixie", tmp_path) == (
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: trixie\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        "Types: deb\nURIs: http://other.example/debian\nSuites: trixie\nComponents: main\nSigned-By: /k.gpg\n")
    with pytest.raises(script.Unavailable, match="no apt source for Debian bookworm"):
        script.mirror_sources("bookworm", "trixie", tmp_path / "sources.list.d")
