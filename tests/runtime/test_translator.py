"""The runtime: one decoding loop on ONNX Runtime and PyTorch, batching, the CLI's inputs and errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from support.backends import recording_translator
from support.common import DEMO_CKPT, listing, unwritable_dir

from tfm_export import DecodeOptions, Translator
from tfm_export.cli.run_cli import main as run_main
from tfm_export.core.errors import TfmExportError
from tfm_export.core.files import file_sha256
from tfm_export.demo import numbers as demo_numbers
from tfm_export.runtime.search import LoopSearcher

TEXTS = [en for en, _ in demo_numbers.held_out_pairs()[:210]] + ["forty-two", "", "eighty", "seven thousand and one"]


@pytest.fixture(scope="module")
def ort_translator(demo_onnx):
    return Translator.load(demo_onnx)


@pytest.fixture(scope="module")
def torch_translator():
    return Translator.load(DEMO_CKPT)


def texts_of(results):
    return [r.text for r in results]


@pytest.mark.parametrize("beam_size", [1, 4])
def test_onnxruntime_and_torch_agree(ort_translator, torch_translator, beam_size):
    options = DecodeOptions(beam_size=beam_size)
    ort_results = ort_translator.translate(TEXTS, options)
    torch_results = torch_translator.translate(TEXTS, options)
    assert [r.ids for r in ort_results] == [r.ids for r in torch_results]
    assert [r.score for r in ort_results] == pytest.approx([r.score for r in torch_results], abs=1e-3)
    assert ort_results[211].text == "" and ort_results[210].text == "quarante-deux"


@pytest.mark.parametrize("beam_size", [1, 4])
def test_batch_size_changes_nothing(ort_translator, beam_size):
    outputs = [texts_of(ort_translator.translate(TEXTS[:60], DecodeOptions(beam_size=beam_size, batch_size=size)))
               for size in (1, 7, 32)]
    assert outputs[0] == outputs[1] == outputs[2]


def test_python_api_and_jsonl(demo_onnx, tmp_path):
    runner = CliRunner()
    out = tmp_path / "out.jsonl"
    result = runner.invoke(run_main, ["translate", "--model", str(demo_onnx), "--format", "jsonl", "--output",
                                      str(out), "forty-two", "", "eighty"])
    assert result.exit_code == 0 and result.output == ""
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["translation"] for r in rows] == ["quarante-deux", "", "quatre-vingts"]
    assert rows[0]["tokens"] == ["▁quarante", "-", "deux"] and rows[0]["score"] < 0 and rows[0]["time_ms"] > 0


def test_arguments_file_and_stdin_agree_on_onnxruntime(demo_onnx, tmp_path):
    lines = TEXTS[:20] + ["", "one"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    runner = CliRunner()
    base = ["translate", "--model", str(demo_onnx), "--beam-size", "2"]
    outputs = [runner.invoke(run_main, [*base, *lines]), runner.invoke(run_main, [*base, "--input",
                                                                                  str(tmp_path / "in.txt")]),
               runner.invoke(run_main, base, input="\n".join(lines) + "\n")]
    assert all(o.exit_code == 0 for o in outputs)
    assert outputs[0].output == outputs[1].output == outputs[2].output
    assert len(outputs[0].output.splitlines()) == len(lines)


def _broken_dirs(demo_onnx, tmp_path):
    missing_graph = tmp_path / "missing-graph"
    shutil.copytree(demo_onnx, missing_graph)
    (missing_graph / "decoder_step.onnx").unlink()
    changed = tmp_path / "changed"
    shutil.copytree(demo_onnx, changed)
    with open(changed / "encoder.onnx", "ab") as f:
        f.write(b"\0")
    (tmp_path / "bad.txt").write_bytes(b"forty-two\n\xc3\x28 oops\n")
    (tmp_path / "empty.txt").write_bytes(b"")
    return missing_graph, changed


@pytest.mark.parametrize("args, message", [
    (["--model", "{tmp}/nowhere", "x"], "nowhere: model not found"),
    (["--model", "{tmp}/missing-graph", "x"], "decoder_step.onnx: graph file of decoder_step is missing"),
    (["--model", "{tmp}/changed", "x"], "encoder.onnx: sha256 differs from manifest.json"),
    (["--model", "{demo}", "--input", "{tmp}/bad.txt"], "bad.txt: line 2 is not valid UTF-8"),
    (["--model", "{demo}", "--input", "{tmp}/empty.txt"], "empty.txt: is empty; nothing to translate"),
    (["--model", "{demo}", "--device", "cuda", "x"], "--device cuda: this onnxruntime has no CUDAExecutionProvider"),
    (["--model", str(DEMO_CKPT), "--device", "cuda", "x"], "--device cuda: PyTorch sees no CUDA GPU"),
    (["--model", "{demo}", "--backend", "torch", "x"], "is a model directory; the torch backend takes a checkpoint"),
    (["--model", str(DEMO_CKPT), "--backend", "onnxruntime", "x"], "is a checkpoint; the onnxruntime backend"),
    (["--model", "{demo}", "--max-length", "500", "x"], "--max-length 500 is outside 1..200"),
    (["--model", "{demo}", " ".join(["one"] * 250)], "line 1: 252 tokens with <s> and </s>, but the model takes at"),
])
def test_bad_input_is_one_clear_line(demo_onnx, tmp_path, monkeypatch, args, message):
    import torch
    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    _broken_dirs(demo_onnx, tmp_path)
    args = [a.format(tmp=tmp_path, demo=demo_onnx) for a in args]
    monkeypatch.chdir(tmp_path)
    before = listing(tmp_path)
    result = CliRunner().invoke(run_main, ["translate", *args])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: ") and len(result.output.strip().splitlines()) == 1
    assert message in result.output
    assert listing(tmp_path) == before


def test_unknown_backend_and_unwritable_output(demo_onnx, tmp_path):
    runner = CliRunner()
    result = runner.invoke(run_main, ["translate", "--model", str(demo_onnx), "--backend", "magic", "x"])
    assert result.exit_code == 2 and "'magic' is not one of" in result.output
    with unwritable_dir(tmp_path / "ro") as ro:
        result = runner.invoke(run_main, ["translate", "--model", str(demo_onnx), "--output", str(ro / "o.txt"),
                                          "forty-two"])
        assert result.exit_code == 1 and "not writable; choose another --output" in result.output and listing(ro) == []


def test_truncate_cuts_and_translates(ort_translator, caplog):
    [result] = ort_translator.translate([" ".join(["one"] * 250)], DecodeOptions(truncate=True, max_length=5))
    assert "line 1: cut from 252 to 200 tokens" in caplog.text and len(result.ids) <= 5


def test_session_options_reach_onnxruntime(demo_onnx):
    from tfm_export.runtime.backends import open_backend
    from tfm_export.runtime.session import SessionOptions
    opened = open_backend(demo_onnx, options=SessionOptions(intra_op_threads=1, optimization="basic",
                                                            memory_arena=False))
    translator, options = Translator.of(opened), opened.backend.decoder.get_session_options()
    assert options.intra_op_num_threads == 1 and not options.enable_cpu_mem_arena
    assert translator.translate(["eighty"])[0].text == "quatre-vingts"


def test_cuda_translation_matches_cpu(demo_onnx, ort_translator):
    import onnxruntime as ort
    import torch
    if not torch.cuda.is_available() or "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("needs an NVIDIA GPU with onnxruntime-gpu (CUDAExecutionProvider)")
    from tfm_export.runtime.session import SessionOptions
    cuda = Translator.load(demo_onnx, session_options=SessionOptions(device="cuda"))
    assert texts_of(cuda.translate(TEXTS[:100])) == texts_of(ort_translator.translate(TEXTS[:100]))


def test_tensorrt_execution_provider_needs_cuda(demo_onnx):
    result = CliRunner().invoke(run_main, ["translate", "--model", str(demo_onnx), "--ort-trt", "x"])
    assert result.exit_code == 1 and "--ort-trt needs --device cuda" in result.output


def test_n_best_lists_distinct_hypotheses_best_first(demo_onnx, torch_translator):
    result = CliRunner().invoke(run_main, ["translate", "--model", str(demo_onnx), "--beam-size", "4", "--n-best",
                                           "3", "--format", "jsonl", "seventy-one"])
    row = json.loads(result.output)
    scores = [alt["score"] for alt in row["n_best"]]
    assert row["n_best"][0]["translation"] == row["translation"] == "soixante et onze"
    assert len(row["n_best"]) == 3 and len({alt["translation"] for alt in row["n_best"]}) == 3
    assert row["n_best"][0]["log_prob"] == row["score"] and scores == sorted(scores, reverse=True)
    assert all(s < 0 for s in scores) and row["n_best_count"] == 3
    [same] = torch_translator.translate(["seventy-one"], DecodeOptions(beam_size=4, n_best=3))
    assert [a.text for a in same.n_best] == [alt["translation"] for alt in row["n_best"]]
    bad = CliRunner().invoke(run_main, ["translate", "--model", str(demo_onnx), "--n-best", "2", "x"])
    assert bad.exit_code == 1 and "--n-best 2 needs --beam-size >= 2" in bad.output


def test_n_best_is_filled_up_where_the_beams_finish_fewer(demo_onnx):
    """Beam 4, n_best 3 on held-out numbers: where the reference beam search (PyTorch) finishes fewer than 3
    hypotheses, tfm-run still lists exactly 3, the real ones as the reference ranks and scores them, then empty
    entries with score null (jsonl) or -inf (text), and says how many are real."""
    import torch

    from tfm_export.model import reference_decoding
    from tfm_export.model.loading import load_checkpoint
    texts = [en for en, _ in demo_numbers.held_out_pairs()[:40]]
    ckpt = load_checkpoint(DEMO_CKPT)
    options = ["--model", str(demo_onnx), "--beam-size", "4", "--n-best", "3", "--length-penalty", "0.6"]
    rows = [json.loads(line) for line in CliRunner().invoke(run_main, ["translate", *options, "--format", "jsonl",
                                                                        *texts]).output.splitlines()]
    lines = CliRunner().invoke(run_main, ["translate", *options, *texts]).output.splitlines()
    assert len(rows) == len(texts) and len(lines) == 3 * len(texts)
    short = 0
    for number, (text, row) in enumerate(zip(texts, rows, strict=True)):
        src = torch.tensor([ckpt.vocab.source.encode(text, framed=True)])
        want = reference_decoding.beam_search(ckpt.model, src, 4, ckpt.config.n_position, 0.6, n_best=3)[0]
        short += len(want) < 3
        assert row["n_best_count"] == len(want) and len(row["n_best"]) == 3
        for alt, hyp in zip(row["n_best"], want, strict=False):
            assert alt["translation"] == ckpt.vocab.target.decode(hyp.tokens)
            assert (alt["score"], alt["log_prob"]) == pytest.approx((hyp.normalized_score, hyp.score), abs=1e-4)
        assert row["n_best"][len(want):] == [{"translation": "", "score": None, "log_prob": None}] * (3 - len(want))
        shown = [line.split("\t") for line in lines[3 * number:3 * number + 3]]
        assert [(float(score), text) for score, text in shown] == [
            (pytest.approx(a["score"], abs=1e-6) if a["score"] is not None else -np.inf, a["translation"])
            for a in row["n_best"]]
    assert short >= 3  # inputs where the beams really finished fewer than n_best


@pytest.mark.parametrize("vocab_size", [12, 97])
def test_exact_ties_break_like_the_reference(vocab_size):
    """All logits equal (zero output projection): ties must go to the lower (beam, token) index in both loops."""
    import torch
    from support.common import tiny_config

    from tfm_export.model import reference_decoding
    from tfm_export.model.transformer import Transformer
    from tfm_export.runtime.backends.reference import TorchBackend
    from tfm_export.runtime.decoding import beam_search, greedy
    torch.manual_seed(0)
    model = Transformer(tiny_config(src_vocab_size=vocab_size, trg_vocab_size=vocab_size, proj_share_weight=False,
                                    embs_share_weight=False)).eval()
    with torch.no_grad():
        model.trg_word_prj.weight.zero_()
    src = np.array([[2, 5, 6, 3], [2, 7, 3, 1]])
    for k in (3, 4, 5):
        got = beam_search(TorchBackend(model), src, k, 6, n_best=k)
        want = reference_decoding.beam_search(model, torch.from_numpy(src), k, 6, n_best=k)
        assert [[h.tokens for h in nb] for nb in got] == [[h.tokens for h in nb] for nb in want]
    assert [h.tokens for h in greedy(TorchBackend(model), src, 6)] == \
        [h.tokens for h in reference_decoding.greedy_decode(model, torch.from_numpy(src), 6)]


def test_only_newlines_split_input_lines(demo_onnx, tmp_path):
    (tmp_path / "in.txt").write_bytes("forty-two\x0cone\r\neighty\u2028x\n\n".encode())
    result = CliRunner().invoke(run_main, ["translate", "--model", str(demo_onnx), "--input",
                                           str(tmp_path / "in.txt")])
    assert result.exit_code == 0 and len(result.output.split("\n")[:-1]) == 3


def test_bad_utf8_argument_and_options_checked_even_for_blank_input(demo_onnx):
    runner = CliRunner()
    bad = runner.invoke(run_main, ["translate", "--model", str(demo_onnx), "forty\udcff"])
    assert bad.exit_code == 1 and "TEXT argument 1 is not valid UTF-8" in bad.output
    blank = runner.invoke(run_main, ["translate", "--model", str(demo_onnx), "--n-best", "3", " "])
    assert blank.exit_code == 1 and "--n-best 3 needs --beam-size >= 3" in blank.output


@pytest.mark.parametrize("edit, message", [
    (lambda m: [], "not a tfm-export-model manifest"),
    (lambda m: {**m, "graphs": {"encoder": m["graphs"]["encoder"]}}, "lacks graphs.decoder_step.file"),
    (lambda m: {k: v for k, v in m.items() if k != "tokenizer"}, "lacks tokenizer.source, tokenizer.target"),
])
def test_malformed_manifest_is_one_line(demo_onnx, tmp_path, edit, message):
    copy = tmp_path / "model"
    shutil.copytree(demo_onnx, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps(edit(manifest)))
    result = CliRunner().invoke(run_main, ["translate", "--model", str(copy), "x"])
    assert result.exit_code == 1 and message in result.output and len(result.output.splitlines()) == 1


def test_tokenizer_that_does_not_fit_the_graphs(demo_onnx, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(demo_onnx, copy)
    words = ["<unk>", "<blank>", "<s>", "</s>", *[f"w{i}" for i in range(200)]]
    (copy / "tokenizer.json").write_text(json.dumps(words))
    manifest = json.loads((copy / "manifest.json").read_text())  # hashed in: only the size is wrong
    manifest["files"]["tokenizer.json"] = file_sha256(copy / "tokenizer.json")
    (copy / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(run_main, ["translate", "--model", str(copy), "w150"])
    assert result.exit_code == 1 and "has 204 tokens but the model's source vocabulary has 88" in result.output


def test_bad_environment_values_are_one_line(demo_onnx, monkeypatch):
    from tfm_export.core.errors import TfmExportError
    from tfm_export.runtime.session import SessionOptions
    with pytest.raises(TfmExportError, match="thread count 'four' .TFM_THREADS.. is not a whole number"):
        Translator.load(demo_onnx, session_options=SessionOptions(intra_op_threads="four"))
    with pytest.raises(TfmExportError, match="optimisation level 'Basic'"):
        Translator.load(demo_onnx, session_options=SessionOptions(optimization="Basic"))


@pytest.mark.parametrize("vocab, ties", [(32000, False), (32000, True), (1501, True), (97, True), (5, False)])
@pytest.mark.parametrize("allow_eos", [False, True])
def test_top_candidates_equal_a_stable_descending_sort(vocab, ties, allow_eos):
    """The block-floor selection is exact: the same (beam, token) indices and values as a full stable sort of
    every candidate score + log p (the same float operations), ties by lower index, barred tokens never."""
    from tfm_export.core.token_rules import SEED_RULES
    from tfm_export.runtime.step import StepRule, _normalizers, _score, _top_candidates
    mask = StepRule(SEED_RULES, 1, allow_eos).mask
    rng = np.random.default_rng(vocab)
    inputs, k, count = 6, 4, 8
    logits = rng.standard_normal((inputs * k, vocab)).astype(np.float32)
    if ties:
        logits = np.round(logits, 1)  # many exact ties, also at the cut
    scores = rng.standard_normal((inputs, k)).astype(np.float32)
    if ties:
        scores[1] = 0.0  # equal beams: equal candidates across beams too
    scores[0, 1:] = -np.inf  # dead beams, as at the first step
    x = logits.copy()
    top, norm = _normalizers(x)
    mask(x)
    cand = _score(x, top, norm, scores.reshape(-1, 1)).reshape(inputs, k * vocab)
    want = np.argsort(-cand, axis=1, kind="stable")[:, :count]
    got, values = _top_candidates(logits.copy(), scores, count, mask)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(values, np.take_along_axis(cand, want, axis=1))


def test_engine_limits_bound_rows_and_lengths(demo_onnx, ort_translator):
    """What engines were built for (rows, target length) bounds every call, with the same results."""
    translator, backend = recording_translator(demo_onnx)
    limited = Translator(LoopSearcher(backend), translator.vocab, translator.config,
                         {"max_batch": 8, "max_source_length": 200, "max_target_length": 12})
    texts = TEXTS[:20]
    results = limited.translate(texts, DecodeOptions(beam_size=4, batch_size=32))
    assert max(rows for rows, _, _ in backend.calls) <= 8  # 2 sentences x 4 beams per batch
    assert texts_of(results) == texts_of(ort_translator.translate(texts, DecodeOptions(beam_size=4, max_length=12)))
    with pytest.raises(TfmExportError, match="outside 1..12 .the engines' --max-target-length"):
        limited.translate(texts, DecodeOptions(max_length=20))
    with pytest.raises(TfmExportError, match="--beam-size 9 exceeds the engines' --max-batch 8"):
        limited.translate(texts, DecodeOptions(beam_size=9))
