"""The C++ example on the pretrained families' own tokenizers, held to tfm-run: random tiny models with tokenizers
trained here (made and exported once per run, shared with the Hugging Face tests): Marian (its source.spm and
vocab.json, opus-mt's >>fra<< before the text), M2M100 (SentencePiece BPE, __xx__ codes by --source-lang and
--target-lang), mBART-50 (a Unigram tokenizer.json, which the export writes as a SentencePiece model), T5 (the
same, words split on Unicode's whitespace) and NLLB as its repositories ship it (a BPE tokenizer.json and the
sentencepiece.bpe.model it was converted from, given the tokenizer's words). On 200 generated sentences with
non-ASCII text: the same source ids (tokenize_check), the same text greedy and at beam 4, and n-best scores within
1e-4.

SentencePiece and `tokenizers` search the same Unigram lattice, but where two segmentations score exactly the same
(the same pieces in another order: '000' as 0+00 or 00+0) each library keeps its own: such a difference is judged
a tie by its score, and anything else fails. Both decode in batches of 32, of sentences sorted by length (tfm-run
takes the texts as arguments, the C++ command from a file on stdin: the same batches)."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from support import hf_language_models, hf_text_models
from support.common import REPO
from support.cpp import SCORE_TOLERANCE, built_translator, run_cpp
from support.hf_oracle import made_and_exported, repository_lines
from tokenizers import Tokenizer

from tfm_export.artifacts.manifest import MANIFEST, MODEL_FORMAT, MODEL_FORMAT_VERSION
from tfm_export.artifacts.model_dir import SENTENCEPIECE
from tfm_export.cli.run_cli import main as run_main
from tfm_export.core.graph_spec import (
    ATTENTION_MASK,
    CACHE_LENGTH,
    ENCODER_ATTENTION_MASK,
    FORCED_TOKEN,
    INPUT_IDS,
    LAST_HIDDEN_STATE,
    LOGITS,
    TOKEN_BIAS,
    TOP_IDS,
    TOP_LOGPROBS,
    TOTAL_LENGTH,
    cache_name,
)
from tfm_export.core.tokenizer import SENTENCEPIECE_FILE, SENTENCEPIECE_INPUTS
from tfm_export.model.hf_tokenizer import RUN_END, RUN_START

CPP_DIR = REPO / "examples" / "cpp"
SENTENCES = 200
# (how the model is made, its kind, tfm-run's and the C++ command's language options)
CASES = {
    "marian": (hf_text_models.made, "marian", ()),
    "marian into >>fra<<": (hf_text_models.made, "marian", ("--target-lang", ">>fra<<")),
    "t5": (hf_text_models.made, "t5", ()),
    "m2m100 __fr__ to __de__": (hf_language_models.made, "m2m100",
                                ("--source-lang", "__fr__", "--target-lang", "__de__")),
    "mbart-50 fr_XX to de_DE": (hf_language_models.made, "mbart-50",
                                ("--source-lang", "fr_XX", "--target-lang", "de_DE")),
    "nllb as shipped, fra_Latn to deu_Latn": (lambda factory, _: made_and_exported(
        factory, "languages-nllb-hub", hf_language_models.save_nllb_hub), "nllb-hub",
        ("--source-lang", "fra_Latn", "--target-lang", "deu_Latn")),
}
FOREIGN = ["café", "naïve", "coûte", "Straße", "größer", "ÆØÅ", "ΣΊΣΥΦΟΣ", "Ὀδυσσεύς", "東京", "日本語", "привет",
           "мир", "🙂", "€5", "İstanbul", "ﬁne", "ｆｕｌｌ", "a\u00a0b", "x\u3000y"]
TIE = 1e-4  # two segmentations whose summed piece scores differ by less are a tie


@pytest.fixture(scope="module")
def tfm_translate() -> Path:
    return built_translator()


@pytest.fixture(scope="module")
def tokenize_check() -> Path:
    return built_translator().parent.parent / "tokenize_check"


def generated_sentences(count: int = SENTENCES, seed: int = 0) -> list[str]:
    """Sentences of the repository's own words (the tokenizers were trained on them), a third with words in other
    scripts, accents, an emoji, ligatures, full-width letters and non-ASCII spaces."""
    words = sorted({w for line in repository_lines() for w in re.findall(r"[A-Za-z][a-z]+", line)})
    rng = random.Random(seed)
    sentences = []
    for _ in range(count):
        chosen = rng.sample(words, rng.randint(2, 6))
        if rng.random() < 0.35:
            chosen.insert(rng.randint(0, len(chosen)), rng.choice(FOREIGN))
        sentences.append(" ".join(chosen) + rng.choice(["", ".", "?", "!", ","]))
    return sentences


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    make, kind, languages = CASES[request.param]
    _, model = make(tmp_path_factory, kind)
    return model, languages


def _tokenizer(model: Path) -> tuple[Path, list[str]]:
    """The source tokenizer and tokenize_check's arguments for its SentencePiece model."""
    manifest = json.loads((model / MANIFEST).read_text())
    spm = manifest[SENTENCEPIECE]
    return model / manifest["tokenizer"]["source"], [str(model / spm["file"]), spm["input"]]


def _scores(path: Path) -> dict[int, float]:
    data = json.loads(path.read_text(encoding="utf-8"))["model"]
    return {i: score for i, (_, score) in enumerate(data["vocab"])} if data["type"] == "Unigram" else {}


def _assert_tie(path: Path, text: str, want: list[int], got: list[int]) -> None:
    """Two segmentations of `text` that score the same under the tokenizer's Unigram table (a BPE has no ties)."""
    scores = _scores(path)
    tok = Tokenizer.from_file(str(path))
    assert scores, f"{text!r}: {want} != {got} (a BPE model: no tie to judge)"
    assert tok.decode(want) == tok.decode(got), (text, want, got)
    assert abs(sum(scores.get(i, 0.0) for i in want) - sum(scores.get(i, 0.0) for i in got)) < TIE, (text, want, got)


def source_ids_agree(tokenize_check: Path, model: Path, texts: list[str]) -> list[int]:
    """tokenize_check's ids of every text against the Python tokenizer's (ties judged); returns the indices whose
    ids are the same."""
    path, spm = _tokenizer(model)
    out = subprocess.run([str(tokenize_check), str(path), *spm], input="\n".join(texts) + "\n", capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    tok = Tokenizer.from_file(str(path))
    same = []
    for index, (text, line) in enumerate(zip(texts, out.stdout.split("\n")[:-1], strict=True)):
        got = [int(i) for i in line.split("\t")[0].split()]
        want = tok.encode(text, add_special_tokens=False).ids
        if got == want:
            same.append(index)
        else:
            _assert_tie(path, text, want, got)
    return same


def tfm_run(model: Path, texts: list[str], *options: str) -> list[dict]:
    result = CliRunner().invoke(run_main, ["translate", "--model", str(model), "--format", "jsonl", *options, *texts])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_sources_tokenize_as_python_does(tokenize_check, case):
    model, _ = case
    texts = generated_sentences()
    assert len(source_ids_agree(tokenize_check, model, texts)) >= SENTENCES * 0.95  # the rest: judged ties


def test_text_translates_as_tfm_run_does(tfm_translate, tokenize_check, case):
    """Greedy (text out) and beam 4 with its 2 best at length penalty 0.7 (jsonl), on the sentences whose source
    ids the two tokenizers agree on (the others are ties, test_sources_tokenize_as_python_does)."""
    model, languages = case
    texts = generated_sentences()
    texts = [texts[i] for i in source_ids_agree(tokenize_check, model, texts)]
    want = [r["translation"] for r in tfm_run(model, texts, *languages)]
    assert run_cpp(tfm_translate, model, texts, *languages) == want
    beam = ("--beam-size", "4", "--n-best", "2", "--length-penalty", "0.7", *languages)
    want = tfm_run(model, texts, *beam)
    got = [json.loads(line) for line in run_cpp(tfm_translate, model, texts, *beam, "--format", "jsonl")]
    assert [[h["translation"] for h in r["n_best"]] for r in got] == [[h["translation"] for h in r["n_best"]]
                                                                      for r in want]
    assert [r["ids"] for r in got] == [r["ids"] for r in want]
    for key in ("score", "log_prob"):
        np.testing.assert_allclose([[np.nan if h[key] is None else h[key] for h in r["n_best"]] for r in got],
                                   [[np.nan if h[key] is None else h[key] for h in r["n_best"]] for r in want],
                                   atol=SCORE_TOLERANCE)


@pytest.fixture(scope="module")
def marian(tmp_path_factory) -> Path:
    return hf_text_models.made(tmp_path_factory, "marian")[1]


@pytest.fixture(scope="module")
def m2m100(tmp_path_factory) -> Path:
    return hf_language_models.made(tmp_path_factory, "m2m100")[1]


def _one_line_error(binary: Path, model: Path, stdin: bytes, *options: str | bytes) -> str:
    """The command's one-line error, nothing translated: every line of what has arrived is read before any is."""
    done = subprocess.run([str(binary), str(model), *options], input=stdin, capture_output=True, timeout=60)
    assert done.returncode == 1 and done.stdout == b"", done
    error = done.stderr.decode()
    assert error.count("\n") == 1 and error.startswith("error: "), error
    return error


def test_a_changed_sentencepiece_model_is_refused(tfm_translate, marian, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(marian, copy)
    with open(copy / SENTENCEPIECE_FILE, "ab") as f:
        f.write(b"\0")
    error = _one_line_error(tfm_translate, copy, b"hello\n")
    assert f"{SENTENCEPIECE_FILE}: sha256 differs from {MANIFEST}" in error


@pytest.mark.parametrize(("entry", "python", "cpp"), [
    ("text", "has an invalid sentencepiece;", "cannot use at() with string; export the model again"),
    ({"file": SENTENCEPIECE_FILE, "input": "bytes"}, "has an invalid sentencepiece.input;",
     "sentencepiece.input 'bytes' is not one this reads")])
def test_a_mistyped_sentencepiece_entry_is_one_line(tfm_translate, marian, tmp_path, entry, python, cpp):
    """The manifest's entry checked by both readers before anything is translated."""
    copy = tmp_path / "model"
    shutil.copytree(marian, copy)
    manifest = json.loads((copy / MANIFEST).read_text())
    (copy / MANIFEST).write_text(json.dumps({**manifest, SENTENCEPIECE: entry}))
    error = _one_line_error(tfm_translate, copy, b"hello\n")
    assert error.startswith(f"error: {copy / MANIFEST}: ") and cpp in error
    result = CliRunner().invoke(run_main, ["translate", "--model", str(copy), "hello"])
    assert result.exit_code == 1 and f"{copy / MANIFEST}: {python}" in result.output


LANGUAGE_ERRORS = {  # name -> (model fixture, options, the line's words)
    "a code the model lacks": ("m2m100", ("--target-lang", "__xx__"),
                               "--target-lang '__xx__' is not one of the model's 100 language codes (__af__,"),
    "no target where the model needs one": ("m2m100", (), "languages and its generation config names none; pass "
                                                          "--target-lang"),
    "a source language for a model whose sources carry none": ("marian", ("--source-lang", ">>fra<<"),
                                                               "this model's sources carry no language code"),
}


@pytest.mark.parametrize("name", LANGUAGE_ERRORS)
def test_language_mistakes_are_one_line_as_tfm_run_says_them(tfm_translate, request, name):
    fixture, options, words = LANGUAGE_ERRORS[name]
    model = request.getfixturevalue(fixture)
    assert words in _one_line_error(tfm_translate, model, b"hello\n", *options)
    python = CliRunner().invoke(run_main, ["translate", "--model", str(model), *options, "hello"])
    assert python.exit_code != 0 and words in python.output


def test_invalid_utf8_is_one_line_naming_the_line(tfm_translate, marian):
    assert "<stdin>: line 2 is not valid UTF-8; convert the file to UTF-8" in \
        _one_line_error(tfm_translate, marian, b"hello\nbad \xff byte\n")
    assert "TEXT argument 2 is not valid UTF-8" in \
        _one_line_error(tfm_translate, marian, b"", b"fine", b"\xed\xa0\x80 a surrogate")


def test_a_tokenizer_without_a_sentencepiece_model_points_to_ids(tfm_translate, tmp_path_factory):
    """The NLLB of the languages tests has a BPE tokenizer.json trained by `tokenizers`: no SentencePiece model
    reproduces it, so the export names none and the command says to give ids."""
    _, model = hf_language_models.made(tmp_path_factory, "nllb")
    assert SENTENCEPIECE not in json.loads((model / MANIFEST).read_text())
    error = _one_line_error(tfm_translate, model, b"hello\n", "--target-lang", "deu_Latn")
    assert "no SentencePiece model reproduces this tokenizer (a BPE model)" in error and "--ids" in error


def test_the_contract_the_headers_spell_is_the_python_sides():
    """examples/cpp spells the graph contract's names, the manifest's format and its SentencePiece entry in one
    place (tfm::contract), and the run markers of a Marian source table in the tokenizer: each as the Python side
    defines it."""
    header = (CPP_DIR / "tfm_translate.hpp").read_text()
    assert f'kFormat = "{MODEL_FORMAT}"' in header and f"kFormatVersion = {MODEL_FORMAT_VERSION};" in header
    assert f'kEncoderInputs = {{"{INPUT_IDS}", "{ATTENTION_MASK}"}}' in header
    assert f'kEncoderHidden = "{LAST_HIDDEN_STATE}"' in header and f'kTotalLength = "{TOTAL_LENGTH}"' in header
    assert f'kLogits = "{LOGITS}", kTopLogprobs = "{TOP_LOGPROBS}", kTopIds = "{TOP_IDS}"' in header
    search = (INPUT_IDS, ENCODER_ATTENTION_MASK, CACHE_LENGTH, TOKEN_BIAS, FORCED_TOKEN)
    assert "out = {" + ", ".join(f'"{n}"' for n in search) + "}" in header  # decoder_step_search's first inputs
    assert 'return prefix + "." + std::to_string(layer) + "." + side + "." + role;' in header  # tfm::contract::cache
    assert cache_name("past_key_values", 0, "decoder", "key") == ".".join(("past_key_values", "0", "decoder", "key"))
    assert f'kSentencePiece = "{SENTENCEPIECE}"' in header
    assert "kSentencePieceInputs = {" + ", ".join(f'"{i}"' for i in SENTENCEPIECE_INPUTS) + "}" in header
    markers = re.search(r'kRunStart = "([^"]+)", kRunEnd = "([^"]+)"', (CPP_DIR / "tokenizer.hpp").read_text())
    as_bytes = [bytes(int(x, 16) for x in re.findall(r"\\x([0-9A-F]{2})", m)) for m in markers.groups()]
    assert as_bytes == [RUN_START.encode(), RUN_END.encode()]
