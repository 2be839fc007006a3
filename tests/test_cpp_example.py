"""examples/cpp: its tokenizer is held to Python's; its translator, built as `make cpp` builds it
(scripts/build_cpp.py: Debian's ONNX Runtime headers, the onnxruntime wheel's library), is held to tfm-run: the same
text on the demo's 1,000 held-out numbers (step loop and generate.onnx), the same ids and n-best scores on a random
base-size export and a random tiny Marian, and one line for each bad input."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DEMO_CKPT, REPO

from tfm_export import Translator
from tfm_export.bench.protocol import BenchSettings, measure
from tfm_export.bench.runners import Artifacts
from tfm_export.core.batching import pad_batch
from tfm_export.core.tokenizer import load_tokenizer, plain_word_tokenizer
from tfm_export.demo import numbers as demo_numbers
from tfm_export.runtime.translator import DecodeOptions

CPP_DIR = REPO / "examples" / "cpp"
BUILD_SCRIPT = REPO / "scripts" / "build_cpp.py"
HEADERS_UNAVAILABLE = 3  # build_cpp.py's exit status where ONNX Runtime's headers cannot be fetched
SCORE_TOLERANCE = 1e-4
DEMO_MODES = {"greedy": ((), DecodeOptions()),
              "beam 4": (("--beam", "4"), DecodeOptions(beam_size=4)),
              "beam 4, length penalty 0.6": (("--beam", "4", "--length-penalty", "0.6"),
                                             DecodeOptions(beam_size=4, length_penalty=0.6))}


def build(tmp: Path, *cmake_args: str) -> Path:
    if not shutil.which("cmake") or not (shutil.which("g++") or shutil.which("c++")):
        pytest.skip("cmake and a C++17 compiler are needed")
    subprocess.run(["cmake", "-S", str(CPP_DIR), "-B", str(tmp), "-DCMAKE_BUILD_TYPE=Release", *cmake_args],
                   check=True, capture_output=True, timeout=300)
    subprocess.run(["cmake", "--build", str(tmp), "-j", "2"], check=True, capture_output=True, timeout=600)
    return tmp


@pytest.fixture(scope="module")
def tokenize_check(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("cpp")) / "tokenize_check"


@pytest.fixture(scope="session")
def tfm_translate() -> Path:
    """The C++ translator, built once (cached in build/) by what `make cpp` runs; skipped, saying why, only where
    ONNX Runtime's headers cannot be fetched (no apt, no network)."""
    if not shutil.which("cmake") or not (shutil.which("g++") or shutil.which("c++")):
        pytest.skip("cmake and a C++17 compiler are needed")
    done = subprocess.run([sys.executable, str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=1200)
    if done.returncode == HEADERS_UNAVAILABLE:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stdout + done.stderr
    binary = Path(done.stdout.splitlines()[-1])  # `make cpp` prints the binary's path last
    assert binary.is_file()
    return binary


def run_cpp(binary: Path, model: Path, lines: list[str], *options: str) -> list[str]:
    """The translator over `lines` on stdin, one thread (the tests' workers share the cores): its output lines."""
    done = subprocess.run([str(binary), str(model), "--threads", "1", *options], input="\n".join(lines) + "\n",
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[:-1]


def cpp_nbest(binary: Path, model: Path, sources: list[list[int]], beam: int, n_best: int, *options: str
              ) -> list[list[tuple[tuple[int, ...], float, float]]]:
    """--ids --n-best: per source its n_best (ids, score, log-probability), best first."""
    out = run_cpp(binary, model, [" ".join(map(str, s)) for s in sources], "--ids", "--beam", str(beam),
                  "--n-best", str(n_best), *options)
    rows = [(tuple(int(t) for t in ids.split()), float(score), float(log_prob))
            for score, log_prob, ids in (line.split("\t") for line in out)]
    assert len(rows) == len(sources) * n_best
    return [rows[i * n_best:(i + 1) * n_best] for i in range(len(sources))]


def assert_same_ids_and_scores(binary: Path, model: Path, sources: list[list[int]], max_length: int) -> None:
    """Greedy, and beam 4 with the 3 best at length penalty 0.6, one source per call in both (C++ decodes one at a
    time; ONNX Runtime may round a batch of one differently from a padded batch): identical ids, and scores and
    log-probabilities within SCORE_TOLERANCE."""
    translator = Translator.load(model)
    for beam, n_best, penalty in ((1, 1, 1.0), (4, 3, 0.6)):
        options = DecodeOptions(beam_size=beam, n_best=n_best, length_penalty=penalty, max_length=max_length,
                                batch_size=1)
        want = translator.translate_ids(sources, options)
        got = cpp_nbest(binary, model, sources, beam, n_best, "--length-penalty", str(penalty),
                        "--max-length", str(max_length))
        for source, hypotheses, found in zip(sources, want, got, strict=True):
            assert [ids for ids, _, _ in found] == [h.tokens for h in hypotheses], (beam, source)
            np.testing.assert_allclose([(s, p) for _, s, p in found],
                                       [(h.normalized_score, h.score) for h in hypotheses], atol=SCORE_TOLERANCE)


def test_cpp_tokenizer_matches_python_on_the_demo_tokenizer(tokenize_check):
    path = DEMO_CKPT.parent / "tokenizer.json"
    tok = load_tokenizer(path)
    lines = [text for n in demo_numbers.held_out_numbers()[:100]
             for text in (demo_numbers.english(n), demo_numbers.french(n))]
    lines += ["", "   ", "  Forty-Two ,  ONE", "unknown words here", "quatre-vingt-dix-neuf"]
    assert cpp_tokenize(tokenize_check, path, lines) == [(tok.encode(s), tok.decode(tok.encode(s))) for s in lines]


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
    """All 1,000 held-out numbers (and a blank line), through decoder_step_search and through generate.onnx:
    the text `tfm-run translate` gives, line for line."""
    flags, options = DEMO_MODES[mode]
    lines = [en for en, _ in demo_numbers.held_out_pairs()] + [""]
    want = [r.text for r in Translator.load(demo_generate).translate(lines, options)]
    for graph in ((), ("--generate",)):
        got = run_cpp(tfm_translate, demo_generate, lines, *flags, *graph)
        differ = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
        assert not differ, f"{mode} {graph}: {len(differ)} lines differ, first {lines[differ[0]]!r}: " \
                           f"{got[differ[0]]!r} against {want[differ[0]]!r}"


def test_demo_nbest_ranks_and_scores_as_tfm_run_does(tfm_translate, demo_onnx):
    """Beam 4's 4 best of 100 held-out numbers, which end at different lengths, so the length penalty decides
    their order: the same texts in the same order, and the same scores."""
    lines = [en for en, _ in demo_numbers.held_out_pairs()[:100]]
    for penalty in (0.6, 2.0):
        want = Translator.load(demo_onnx).translate(lines, DecodeOptions(beam_size=4, n_best=4, length_penalty=penalty))
        out = run_cpp(tfm_translate, demo_onnx, lines, "--beam", "4", "--n-best", "4", "--length-penalty", str(penalty))
        got = [line.split("\t") for line in out]
        for i, result in enumerate(want):
            found = got[4 * i:4 * i + 4]
            assert [text for _, _, text in found] == [a.text for a in result.n_best], (penalty, lines[i])
            np.testing.assert_allclose([(float(s), float(p)) for s, p, _ in found],
                                       [(a.score, a.log_prob) for a in result.n_best], atol=SCORE_TOLERANCE)


def test_base_size_export_decodes_the_ids_tfm_run_does(tfm_translate, base_onnx):
    """Random weights of the base config (vocab 32,000): 4 sources, 12 tokens at most (a random model rarely ends
    earlier: the ranking, length penalty and scores are what is compared)."""
    _, model = base_onnx
    rng = np.random.default_rng(0)
    sources = [[2, *rng.integers(4, 32000, rng.integers(3, 12)).tolist(), 3] for _ in range(4)]
    assert_same_ids_and_scores(tfm_translate, model, sources, max_length=12)


VOCAB = 101


@pytest.fixture(scope="module")
def tiny_marian(tmp_path_factory) -> Path:
    """A random tiny Marian (transformers, no download) exported by tfm-export, whose </s> is a token it generates
    mid-sentence for about half of the inputs and whose most frequent other token is banned (hf_oracle), so
    stopping and banning change outputs; beam search follows generate()'s rule. Its tokenizer is a plain word
    list: the C++ example reads ids, as an app with its own SentencePiece tokenizer would give them."""
    transformers = pytest.importorskip("transformers", reason="the tiny Marian needs the hf extra")
    from hf_oracle import randomize, retarget_stop

    from tfm_export.graphs.pipeline import export_model_dir
    from tfm_export.model.loading import load_checkpoint

    root = tmp_path_factory.mktemp("marian")
    torch.manual_seed(3)
    config = transformers.MarianConfig(
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64, vocab_size=VOCAB, pad_token_id=VOCAB - 1,
        decoder_start_token_id=VOCAB - 1, eos_token_id=0, activation_function="swish", scale_embedding=True)
    model = randomize(transformers.MarianMTModel(config), 2.0)
    src = torch.from_numpy(pad_batch(marian_sources(), VOCAB - 1))
    with torch.no_grad():
        out = model.generate(input_ids=src, attention_mask=(src != VOCAB - 1).long(), num_beams=1, do_sample=False,
                             eos_token_id=None, max_length=21)
    retarget_stop(model, [tuple(row) for row in out[:, 1:].tolist()], force_eos=False)
    model.generation_config.max_length = 24
    model.save_pretrained(root / "hf")
    words = ["<unk>", "<blank>", "<s>", "</s>", *(f"w{i}" for i in range(4, VOCAB))]
    plain_word_tokenizer(words, "tiny marian").save(root / "hf" / "tokenizer.json")
    export_model_dir(load_checkpoint(root / "hf"), root / "onnx", progress=False)
    return root / "onnx"


def marian_sources() -> list[list[int]]:
    """24 random sources framed as Marian's tokenizer frames them: ids, then </s> (0)."""
    rng = np.random.default_rng(11)
    return [[*rng.integers(3, VOCAB - 2, rng.integers(1, 15)).tolist(), 0] for _ in range(24)]


def test_tiny_marian_decodes_the_ids_tfm_run_does(tfm_translate, tiny_marian):
    manifest = json.loads((tiny_marian / "manifest.json").read_text())
    assert manifest["token_rules"]["beam_rule"] == "transformers" and len(manifest["token_rules"]["banned"]) == 2
    want = Translator.load(tiny_marian).translate_ids(marian_sources(), DecodeOptions(batch_size=1))
    assert len({len(h[0].tokens) for h in want}) >= 3  # stops at </s> at several lengths
    assert_same_ids_and_scores(tfm_translate, tiny_marian, marian_sources(), max_length=23)


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
