"""Multilingual and BPE Hugging Face families from text to text: NLLB (M2M100 with NllbTokenizer), M2M100 (its
SentencePiece BPE model and vocab.json, no tokenizer.json), mBART-50, mBART-cc25 and BART, with `--source-lang`
and `--target-lang` and each model's generation defaults (num_beams, length_penalty, early_stopping True /
"never" / False).

Oracles: the Hugging Face tokenizers (with `src_lang` set) and transformers' generate() (with forced_bos_token_id or
decoder_start_token_id for the target language). The models are support.hf_language_models' (serving's tests share
NLLB's): tokenizers trained on the repository's own text (with `tokenizers`, and SentencePiece for M2M100 and mBART)
and handed to the transformers tokenizer classes, random weights (tiny configs); nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from support.hf_judge import Reference, assert_agrees, text_inputs
from support.hf_language_models import CASES, NLLB_CODES, RULES, hf_language, made, save, target_options
from support.hf_oracle import HOSTILE, generate, repository_lines, sample_texts, translate

from tfm_export.cli.export_cli import main as export_main
from tfm_export.cli.run_cli import main as run_main
from tfm_export.model.loading import load_checkpoint

transformers = pytest.importorskip("transformers", reason="the oracle needs the hf extra: pip install '.[hf]'")

# Languages by rules make test also holds in another family: M2M100's forced language id (NLLB's and mBART-50's
# rule) and mBART-cc25's decoder start run in make test-slow, most of a minute of export each.
SLOW = ("m2m100", "mbart-cc25")


@pytest.fixture(scope="module", params=[pytest.param(f, marks=pytest.mark.slow if f in SLOW else ())
                                        for f in sorted(CASES)])
def family_dir(request, tmp_path_factory) -> tuple[str, Path]:
    return request.param, made(tmp_path_factory, request.param)[0]


@pytest.fixture(scope="module")
def exported(family_dir, tmp_path_factory) -> tuple[str, Path, Path]:
    family, _ = family_dir
    return family, *made(tmp_path_factory, family)


def test_languages_and_defaults_are_read(family_dir) -> None:
    family, directory = family_dir
    rules = load_checkpoint(directory).rules
    assert rules.language_rule == RULES[family]
    codes = {"nllb": NLLB_CODES, "m2m100": ["__en__", "__fr__", "__de__"], "bart": []}.get(
        family, ["en_XX", "de_DE", "fr_XX", "ro_RO"])
    assert set(codes) <= set(rules.languages) and bool(codes) == bool(rules.languages)
    defaults = CASES[family][2]
    assert (rules.num_beams, rules.length_penalty, rules.early_stopping) == (
        defaults["num_beams"], defaults.get("length_penalty", 1.0), defaults.get("early_stopping", False))


def test_source_language_framing_matches_the_tokenizer(family_dir) -> None:
    """>= 500 lines (the repository's text and the hostile lines) framed with a source language other than the
    saved one: the ids of the Hugging Face tokenizer with src_lang set."""
    family, directory = family_dir
    ours = load_checkpoint(directory)
    theirs = transformers.AutoTokenizer.from_pretrained(str(directory))
    source = CASES[family][0] or ("de_DE" if family == "mbart-cc25" else None)
    tokenizer = ours.vocab.source
    if source is not None:
        tokenizer = tokenizer.with_code(source, ours.rules.languages)
        theirs.src_lang = hf_language(source)
    lines = repository_lines() + HOSTILE
    assert len(lines) >= 500
    for text in lines:
        assert tokenizer.encode(text, framed=True) == theirs(text).input_ids, f"{family}: {text!r}"


def _language_options(family: str) -> list[str]:
    source, target, _ = CASES[family]
    return [*(["--source-lang", source] if source else []), *(["--target-lang", target] if target else [])]


@pytest.mark.parametrize("beam", [None, 1])
def test_translate_matches_generate(exported, beam) -> None:
    """tfm-run translate (ONNX Runtime on the export, PyTorch on the directory) with the case's languages:
    as generate() on 50 inputs. beam None: neither side is given a beam size or length penalty, so both take the
    model's generation config (beam 3-5, its length penalty and early_stopping rule). As generate() means
    token-identical, or differing only where generate() itself, its log-probabilities moved by the tolerance,
    decodes ours (hf_judge), and 90% identical: greedy decisions here come as close as 2e-4 (mBART-cc25), beams
    closer, against backends up to 4e-5 from transformers on these random models."""
    family, directory, output = exported
    texts = sample_texts()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    options = {} if beam is None else dict(num_beams=beam, length_penalty=1.0)
    reference = Reference(directory, text_inputs(directory, texts, hf_language(CASES[family][0])),
                          dict(do_sample=False, **target_options(tokenizer, family), **options))
    want = reference.want
    assert len({len(t) for t in want}) >= 2 and len(set(want)) >= 10  # stops at </s>, differs by input
    flags = _language_options(family) + ([] if beam is None else ["--beam-size", str(beam)])
    assert_agrees(reference.judge(f"{family} beam {beam}: onnxruntime", translate(output, texts, *flags)))
    assert_agrees(reference.judge(f"{family} beam {beam}: torch",
                                  translate(directory, texts, "--backend", "torch", *flags)))


@pytest.mark.parametrize("family_dir", ["nllb"], indirect=True)
@pytest.mark.parametrize("flags, message", [
    ([], "pass --target-lang (eng_Latn, fra_Latn"),
    (["--target-lang", "xx_Latn"], "--target-lang 'xx_Latn' is not one of the model's"),
    (["--source-lang", "deu_Latn", "--target-lang", "en_XX"], "--target-lang 'en_XX' is not one of"),
])
def test_language_errors_are_one_line(exported, flags, message) -> None:
    _, _, output = exported  # an NLLB model whose generation config names no target language
    result = CliRunner().invoke(run_main, ["translate", "--model", str(output), *flags, "a sentence"])
    assert result.exit_code == 1 and message in result.output and len(result.output.strip().splitlines()) == 1, \
        result.output


@pytest.mark.parametrize("family_dir", ["bart"], indirect=True)
def test_languages_on_a_model_without_them_are_one_line(exported) -> None:
    _, _, output = exported
    result = CliRunner().invoke(run_main, ["translate", "--model", str(output), "--target-lang", "fr_XX", "x"])
    assert result.exit_code == 1 and "takes no language codes" in result.output, result.output


def test_tokenizer_files_linked_from_outside_are_refused(tmp_path) -> None:
    """transformers reads M2M100's vocab.json by name and would follow a link out of the directory: export
    refuses it in one line and writes nothing."""
    (tmp_path / "m2m100").mkdir()
    directory = save("m2m100", tmp_path / "m2m100")
    (directory / "vocab.json").rename(tmp_path / "elsewhere.json")
    (directory / "vocab.json").symlink_to(tmp_path / "elsewhere.json")
    output = tmp_path / "out"
    result = CliRunner().invoke(export_main, ["onnx", "--checkpoint", str(directory), "--output", str(output)])
    assert result.exit_code == 1 and "points outside" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and not output.exists()


@pytest.mark.slow  # M2M100's model is made and exported once, most of a minute (the bench's anchor: make bench-scale)
@pytest.mark.parametrize("family_dir", ["m2m100"], indirect=True)
def test_ctranslate2_runs_a_table_larger_than_its_tokenizer(family_dir, tmp_path) -> None:
    """M2M100's table runs past its tokenizer (language codes, made-up words): the benchmark's CTranslate2 model gets a
    filler token for each extra row, loads, and decodes greedily as generate() does, the target language first.
    Its GEMMs round differently, so 90% must be identical (as for Marian, tests/model/test_huggingface_text.py)."""
    ctranslate2 = pytest.importorskip("ctranslate2", reason="CTranslate2 is in the dev/bench extras")
    from tfm_export.bench.ctranslate2 import convert_to_ctranslate2
    family, directory = family_dir
    ckpt = load_checkpoint(directory)
    assert ckpt.config.trg_vocab_size > ckpt.vocab.target.vocab_size  # the case under test
    model = ctranslate2.Translator(str(convert_to_ctranslate2(ckpt, tmp_path / "ct2")), intra_threads=1)
    source, target = CASES[family][:2]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    tokenizer.src_lang = hf_language(source)
    texts = sample_texts()
    tokens = [tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"]) for text in texts]
    results = model.translate_batch(tokens, target_prefix=[[target]] * len(texts), beam_size=1,
                                    max_decoding_length=20, suppress_sequences=[
                                        [ckpt.vocab.target.tokenizer.id_to_token(i)] for i in ckpt.rules.banned])
    theirs = [tuple(tokenizer.convert_tokens_to_ids(r.hypotheses[0]))[:20] for r in results]
    want = [row[:20] for row in generate(transformers, directory, texts, hf_language(source), num_beams=1,
                                         do_sample=False, max_length=21, **target_options(tokenizer, family))]
    assert len(set(want)) >= 10 and all(row[0] == tokenizer.convert_tokens_to_ids(target) for row in want)
    assert sum(a == b for a, b in zip(theirs, want, strict=True)) >= 0.9 * len(want), (theirs[:3], want[:3])

