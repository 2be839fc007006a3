"""Hugging Face model directories from text to text: tokenizers, `tfm-export onnx`, `tfm-run translate`.

Oracles: the Hugging Face tokenizers themselves (MarianTokenizer on two SentencePiece models and vocab.json;
T5's fast tokenizer) and transformers' generate(). The models are support.hf_text_models' (shared with serving's
tests): tokenizers trained on the repository's own text, random weights (tiny configs), nothing downloaded.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from support.hf_judge import Reference, assert_agrees, text_inputs
from support.hf_oracle import HOSTILE, generate, repository_lines, sample_texts, translate
from support.hf_text_models import made, marian_tokenizer, random_model

from tfm_export.artifacts.manifest import MANIFEST
from tfm_export.artifacts.model_dir import SENTENCEPIECE
from tfm_export.bench.artifacts import build_fp32, open_model
from tfm_export.bench.runners import open_decoder, unavailable
from tfm_export.cli.export_cli import main as export_main
from tfm_export.cli.run_cli import main as run_main
from tfm_export.core.files import file_sha256
from tfm_export.model.loading import load_checkpoint
from tfm_export.verify.fp32 import graph_backends

transformers = pytest.importorskip("transformers", reason="the oracle needs the hf extra: pip install '.[hf]'")
spm = pytest.importorskip("sentencepiece", reason="the oracle needs the hf extra: pip install '.[hf]'")

LINES = repository_lines() + HOSTILE


def _hf_tokenizer(directory: Path):
    return transformers.AutoTokenizer.from_pretrained(str(directory))


ONE_TOKENIZER_EACH = pytest.mark.parametrize("hf_dir", ["marian", "t5"], indirect=True)  # t5-v1.1 shares T5's


@pytest.fixture(scope="module", params=["marian", "t5", pytest.param("t5-v1.1", marks=pytest.mark.slow)])
def hf_dir(request, tmp_path_factory) -> tuple[str, Path]:
    return request.param, made(tmp_path_factory, request.param)[0]


@ONE_TOKENIZER_EACH
def test_tokenizer_json_gives_the_hugging_face_ids(hf_dir) -> None:
    """>= 500 lines of prose and code with accents, unknown characters, odd spaces, special-token text, empty
    lines: the tokenizer tfm-export writes gives the Hugging Face tokenizer's source ids. The one allowed
    difference is an exact tie, two segmentations of the same text with equal summed scores (2000 as 2|00|0 or
    2|0|00), which SentencePiece breaks by float32 rounding and a Unigram tokenizer by its order: each is checked
    to be one, and they stay rare."""
    kind, directory = hf_dir
    ours = load_checkpoint(directory).vocab.source
    theirs = _hf_tokenizer(directory)
    assert len(LINES) >= 500 and sum(not t.strip() for t in LINES) >= 10
    unknown, ties = 0, []
    for text in LINES:
        want, got = theirs(text).input_ids, ours.encode(text, framed=True)
        if got != want:
            assert kind == "marian" and _is_tie(directory, got, want), f"{kind}: {text!r}"
            ties.append(text)
        unknown += theirs.unk_token_id in want
    assert unknown >= 5  # the lines do reach characters the models lack
    assert len(ties) <= len(LINES) // 50, ties


def _is_tie(directory: Path, a: list[int], b: list[int]) -> bool:
    """Both Marian id sequences spell the same pieces' text with the same summed SentencePiece score."""
    names = {i: p for p, i in json.loads((directory / "vocab.json").read_text(encoding="utf-8")).items()}
    sp = spm.SentencePieceProcessor(model_file=str(directory / "source.spm"))
    pieces = [[names[i] for i in ids] for ids in (a, b)]
    scores = [sum(sp.get_score(sp.piece_to_id(p)) for p in row) for row in pieces]
    return "".join(pieces[0]) == "".join(pieces[1]) and abs(scores[0] - scores[1]) < 1e-4


@ONE_TOKENIZER_EACH
def test_marian_target_pieces_decode_as_marian_does(hf_dir) -> None:
    kind, directory = hf_dir
    ours, theirs = load_checkpoint(directory).vocab.target, _hf_tokenizer(directory)
    for start in range(3, min(theirs.vocab_size, 400), 37):
        ids = list(range(start, start + 25))
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), f"{kind}: ids {ids}"


@pytest.fixture(scope="module")
def exported(hf_dir, tmp_path_factory) -> tuple[str, Path, Path]:
    kind, _ = hf_dir
    return kind, *made(tmp_path_factory, kind)


@ONE_TOKENIZER_EACH
@pytest.mark.parametrize("beam, penalty", [(1, 1.0), (4, 1.0), (4, 0.6), (4, 2.0)])
def test_translate_matches_generate(exported, beam, penalty) -> None:
    """tfm-run translate on the exported directory (ONNX Runtime) and on the Hugging Face directory itself
    (PyTorch): as generate() with the model's generation config, on 50 inputs, greedy and beam 4 with length
    penalties below, at and above 1. As generate() means token-identical, or differing only where generate()
    itself, its log-probabilities moved by the tolerance, decodes ours (hf_judge), and 90% identical: these random
    models decide beams by less than our backends' distance from transformers (random T5: gaps of 1e-5 and less
    against 1e-6, T5 v1.1 against 3e-5), so which way a near tie goes depends on the machine's kernels."""
    _translate_matches_generate(exported, beam, penalty)


@pytest.mark.slow  # most of a minute of export; make test holds gated T5 to generate() as mT5 (test_huggingface)
@pytest.mark.parametrize("hf_dir", ["t5-v1.1"], indirect=True)
@pytest.mark.parametrize("beam, penalty", [(1, 1.0), (4, 1.0), (4, 0.6)])
def test_gated_t5_translates_as_generate(exported, beam, penalty) -> None:
    """The same for T5 v1.1 (gated GELU, untied head), below and at penalty 1: at 2 this random model runs every
    output to max_length, where T5 v1.0's case above already compares the ranking."""
    _translate_matches_generate(exported, beam, penalty)


def _translate_matches_generate(exported: tuple[str, Path, Path], beam: int, penalty: float) -> None:
    kind, directory, output = exported
    texts = sample_texts()
    reference = Reference(directory, text_inputs(directory, texts),
                          dict(num_beams=beam, do_sample=False, length_penalty=penalty))
    want = reference.want
    lengths = 2 if penalty > 1 else 3  # a penalty above 1 favours running to max_length
    assert len({len(t) for t in want}) >= lengths and len(set(want)) >= 10  # stops at </s>, differs by input
    options = ["--beam-size", str(beam), "--length-penalty", str(penalty)]
    assert_agrees(reference.judge(f"{kind} beam {beam}: onnxruntime", translate(output, texts, *options)))
    assert_agrees(reference.judge(f"{kind} beam {beam}: torch",
                                  translate(directory, texts, "--backend", "torch", *options)))


@pytest.mark.parametrize("hf_dir", ["marian"], indirect=True)
def test_marian_target_language_code_goes_before_the_source(exported) -> None:
    """Multilingual opus-mt: --target-lang >>fra<< translates as generate() does on ">>fra<< " + text."""
    _, directory, output = exported
    assert load_checkpoint(directory).rules.languages == (">>fra<<",)
    texts = sample_texts()
    reference = Reference(directory, text_inputs(directory, [">>fra<< " + t for t in texts]),
                          dict(num_beams=4, do_sample=False))  # judged as in test_translate_matches_generate
    assert reference.want != generate(transformers, directory, texts, num_beams=4, do_sample=False)  # the code acts
    assert_agrees(reference.judge(">>fra<<", translate(output, texts, "--target-lang", ">>fra<<", "--beam-size", "4")))
    result = CliRunner().invoke(run_main, ["translate", "--model", str(output), "--source-lang", ">>fra<<", "x"])
    assert result.exit_code == 1 and "sources carry no language code" in result.output, result.output


PRECISIONS = {"fp16": ["--precision", "fp16"], "int8-dynamic": ["--precision", "int8", "--mode", "dynamic"],
              "int8-static": ["--precision", "int8", "--mode", "static"]}


def _agreement(report: str, decode: str) -> float:
    """The 'identical to fp32' share of a decode row of verify's table."""
    row = next(line for line in report.splitlines() if line.startswith(f"| {decode} |"))
    return float(row.split("|")[2].split("(")[1].rstrip("%) ")) / 100


@ONE_TOKENIZER_EACH
@pytest.mark.parametrize("precision", sorted(PRECISIONS))
def test_quantized_directories_report_agreement(exported, precision, tmp_path) -> None:
    """fp16 and int8 (dynamic, static calibrated on the texts) of Marian and T5 build and `verify` reports
    their agreement with fp32 (greedy and beam 4). A random tiny model's near-flat distributions make int8
    agreement low, so only fp16's is held to a floor; below verify's thresholds the exit is 1 with one line.
    `check` finds fp16 and int8 static TensorRT-compatible."""
    kind, _, output = exported
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(sample_texts()) + "\n", encoding="utf-8")
    options = PRECISIONS[precision] + (["--calibration", str(texts)] if precision == "int8-static" else [])
    quantized = tmp_path / precision
    result = CliRunner().invoke(export_main, ["quantize", "--model", str(output), "--output", str(quantized),
                                              *options])
    assert result.exit_code == 0, result.output
    manifest = json.loads((quantized / MANIFEST).read_text())  # the C++ command's tokenizer comes along, hashed
    spm = manifest[SENTENCEPIECE]["file"]
    assert file_sha256(quantized / spm) == manifest["files"][spm] == file_sha256(output / spm)
    result = CliRunner().invoke(export_main, ["verify", "--model", str(quantized), "--input", str(texts)])
    rates = {decode: _agreement(result.output, decode) for decode in ("greedy", "beam 4")}
    if result.exit_code:
        assert result.exit_code == 1 and result.output.splitlines()[-1].startswith("Error: precision check failed")
    assert all(0 < rate <= 1 for rate in rates.values()), rates
    if precision == "fp16":
        assert rates["greedy"] >= 0.8, f"{kind}: {rates}"
    result = CliRunner().invoke(export_main, ["check", "--model", str(quantized)])  # TensorRT's static report
    if precision == "int8-dynamic":  # ONNX Runtime's integer ops: not for TensorRT, and check says so
        assert result.exit_code == 1 and "TensorRT needs --mode static" in result.output, result.output
    else:
        assert result.exit_code == 0 and "check OK" in result.output, result.output


def test_verify_compares_with_generate(exported, tmp_path) -> None:
    """`tfm-export verify` on a Hugging Face export decodes under the model's rules and holds the graphs to
    generate() itself, on random sources and on text; `tfm-export check` finds them TensorRT-compatible. Each
    decode is identical or a near-tie (verify's own rule: which way these random models' near ties go depends on
    the machine's kernels), and 90% of each row's are identical."""
    _, directory, output = exported
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(sample_texts()) + "\n", encoding="utf-8")
    result = CliRunner().invoke(export_main, ["verify", "--model", str(output), "--checkpoint", str(directory),
                                              "--input", str(texts)])
    assert result.exit_code == 0, result.output
    for row in ("greedy, 16 random sources vs generate()", "beam 4, 50 input lines vs generate()"):
        assert row in result.output
    decoders = len(graph_backends(output))  # the contract's step and the search steps, each held to generate()
    rows = re.findall(r"^(.*?) +(\d+)/(\d+) +identical \([\d.]+%\)(?:, (\d+) near-ties?)?$", result.output, re.M)
    assert decoders >= 2 and len(rows) == 4 * decoders, result.output
    for name, identical, total, ties in rows:
        identical, total, ties = int(identical), int(total), int(ties or 0)
        assert identical + ties == total and identical >= 0.9 * total, f"{name}: {identical}/{total}, {ties} ties"
    result = CliRunner().invoke(export_main, ["check", "--model", str(output)])  # TensorRT's static report
    assert result.exit_code == 0 and "check OK" in result.output, result.output


@pytest.fixture(scope="module")
def opus_like_marian(tmp_path_factory) -> Path:
    """A random Marian as trained opus-mt models are: the pad row of the embedding (the decoder start) zero,
    pad banned, no retargeted ids."""
    directory = tmp_path_factory.mktemp("opus-like")
    model = random_model("marian", marian_tokenizer(directory))
    with torch.no_grad():
        model.get_input_embeddings().weight[model.config.pad_token_id] = 0
    model.generation_config.bad_words_ids = [[model.config.pad_token_id]]
    model.save_pretrained(directory)
    return directory


def test_ctranslate2_runs_the_hugging_face_weights_as_generate_does(opus_like_marian, tmp_path) -> None:
    """The benchmark's anchor on a Hugging Face directory: the same weights through CTranslate2's spec, with
    the model's start and end tokens and its banned ids, decode as generate() does (greedy, 20 tokens). Its
    GEMMs round differently, so a near tie late in a sentence may go the other way: 90% must be identical
    (CTranslate2's own converter, which starts Marian's decoder from a zero vector, matches none)."""
    ctranslate2 = pytest.importorskip("ctranslate2", reason="CTranslate2 is in the dev/bench extras")
    from tfm_export.bench.ctranslate2 import convert_to_ctranslate2
    ckpt = load_checkpoint(opus_like_marian)
    model = ctranslate2.Translator(str(convert_to_ctranslate2(ckpt, tmp_path / "ct2")), intra_threads=1)
    texts = sample_texts()
    source, target = ckpt.vocab.source.tokenizer, ckpt.vocab.target.tokenizer
    tokens = [[source.id_to_token(i) for i in ckpt.vocab.source.encode(t, framed=True)] for t in texts]
    results = model.translate_batch(tokens, beam_size=1, max_decoding_length=20,
                                    suppress_sequences=[[target.id_to_token(i)] for i in ckpt.rules.banned])
    theirs = [tuple(target.token_to_id(t) for t in r.hypotheses[0]) for r in results]
    want = generate(transformers, opus_like_marian, texts, num_beams=1, do_sample=False, max_length=21,
                    forced_eos_token_id=None)
    assert len(set(want)) >= 10
    assert sum(a == b for a, b in zip(theirs, want, strict=True)) >= 0.9 * len(want)


@pytest.mark.slow  # a minute; test_ctranslate2_runs_the_hugging_face_weights_as_generate_does holds the decode
def test_bench_times_ctranslate2_on_the_same_hugging_face_weights(opus_like_marian, tmp_path) -> None:
    pytest.importorskip("ctranslate2", reason="CTranslate2 is in the dev/bench extras")
    report = tmp_path / "bench.json"
    result = CliRunner().invoke(run_main, [
        "bench", "--model", str(opus_like_marian), "--backends", "ort-fp32,ct2-fp32", "--batch-sizes", "1",
        "--beam-sizes", "1,2", "--output-length", "8", "--sentences", "8", "--repeats", "2", "--min-time", "0.05",
        "--json", str(report)])
    assert result.exit_code == 0, result.output
    backends = json.loads(report.read_text())["backends"]
    assert backends["ct2-fp32"]["skipped"] is None and backends["ct2-fp32"]["agreement"] == 1.0, backends
    assert {r["beam"] for r in backends["ct2-fp32"]["rows"]} == {1, 2}


@pytest.mark.slow  # an export of its own; make bench runs the anchor
@pytest.mark.parametrize("beam", [1, 3])
def test_the_bench_anchor_generate_decodes_as_tfm_run_does(opus_like_marian, tmp_path, beam) -> None:
    """`tfm-run bench`'s hf-generate (transformers' generate() on the directory's weights) decodes the
    benchmark's inputs as the ONNX Runtime backend does, free and with </s> barred to a forced length, so the two
    time the same work; fp16 generate() is for GPUs and says so."""
    built = build_fp32(open_model(opus_like_marian), tmp_path)
    ckpt = load_checkpoint(opus_like_marian)
    sources = [ckpt.vocab.source.encode(t, framed=True) for t in sample_texts()[:7]]
    ours, theirs = (open_decoder(name, built.artifacts, threads=1) for name in ("ort-fp32", "hf-generate"))
    for length, forced in ((12, False), (10, True)):
        want = ours(sources, beam, length, forced)
        assert theirs(sources, beam, length, forced) == want
        assert not forced or {len(w) for w in want} == {length}
    assert "--device cuda" in unavailable("hf-generate-fp16", built.artifacts)
