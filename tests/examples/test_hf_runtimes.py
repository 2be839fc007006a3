"""`tfm-export hf` directories in Hugging Face's own runtimes, unchanged: transformers.js in Node and in headless
Chromium (examples/transformers-js: pipeline("translation") for text, generate() for ids) and Optimum's
ORTModelForSeq2SeqLM (in its own venv, every job in one process: support/optimum_jobs.py). The demo and a random
Marian and the multilingual families (NLLB, M2M100, mBART-50, languages chosen as each library chooses them) against
`tfm-run translate` on the directory the layout was made from (their rules are generate()'s); the variant presets
against PyTorch's reference decoder, differences judged as verify judges them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from support import hf_language_models, hf_text_models
from support.common import DEMO_CKPT, REPO, npm_example
from support.hf_oracle import sample_texts
from support.variant_cases import exported_case

from tfm_export.artifacts.model_dir import ModelDir
from tfm_export.cli.run_cli import main as run_main
from tfm_export.demo import numbers as demo_numbers
from tfm_export.graphs.parity import DEFAULT_TOLERANCE
from tfm_export.hf_layout import export_hf
from tfm_export.model import reference_decoding
from tfm_export.model.loading import load_checkpoint
from tfm_export.verify.fp32 import near_tie

JS_DIR = REPO / "examples" / "transformers-js"
OPTIMUM_PYTHON = REPO / ".venv-optimum" / "bin" / "python"
CHROMIUM = Path("/usr/bin/chromium")
PRESETS = ("modern", "t5-like")
MARIAN_SEARCHES = {"greedy": {}, "beam 4": {"num_beams": 4},
                   "beam 4, length penalty 0.6": {"num_beams": 4, "length_penalty": 0.6}}
MARIAN_TEXTS = {"greedy": 50, "beam 4": 50, "beam 4, length penalty 0.6": 25}  # of its 50 sample texts
# family -> (source, target) as tfm-run names them; M2M100's from its saved default source (Python has no fast
# M2M100 tokenizer, so Optimum's example reads tokenizer.json as it is, and cannot choose another)
LANGUAGES = {"nllb": ("fra_Latn", "deu_Latn"), "m2m100": (None, "__de__"), "mbart-50": ("fr_XX", "de_DE")}
LANGUAGE_CLASSES = {"nllb": "NllbTokenizerFast", "m2m100": "M2M100Tokenizer", "mbart-50": "MBart50TokenizerFast"}
# Hugging Face families beside Marian, each under its own model_type: T5 (a SentencePiece Unigram, relative
# positions, the decoder starting from <pad>) and BART (byte-level BPE, forced <s> first, forced </s> last)
FAMILIES = {"t5-even": "t5", "bart": "bart"}
FAMILY_TEXTS = 25  # of their 50 sample texts, for Optimum's saved search (here and for the multilingual ones)


@pytest.fixture(scope="module")
def transformers_js(tmp_path_factory) -> Path:
    return npm_example(tmp_path_factory, JS_DIR)


@pytest.fixture(scope="module")
def views(demo_onnx, variants, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("views")
    export_hf(demo_onnx, root / "fp32", checkpoint=DEMO_CKPT)
    export_hf(variants["int8-dynamic"], root / "int8")
    export_hf(demo_onnx, root / "external", checkpoint=DEMO_CKPT, external_above=0)  # a large model's layout
    return {"fp32": root / "fp32", "int8": root / "int8", "external": root / "external"}


@pytest.fixture(scope="module")
def marian(tmp_path_factory) -> tuple[Path, Path, list[str]]:
    """(the Marian's export, its layout, source texts): the Hugging Face text tests' random Marian, whose eos is an
    ordinary token and whose outputs end at many lengths, greedy and beam."""
    hf, onnx_dir = hf_text_models.made(tmp_path_factory, "marian")
    view = tmp_path_factory.mktemp("marian") / "view"
    export_hf(onnx_dir, view, checkpoint=hf)
    return onnx_dir, view, hf_text_models.sample_texts()


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory) -> dict[str, tuple[Path, Path, list[str]]]:
    """The languages tests' random models, saved with beam search, length penalties and early stopping as their
    generation defaults."""
    return laid_out(tmp_path_factory, {family: hf_language_models.made(tmp_path_factory, family)
                                       for family in LANGUAGES})


@pytest.fixture(scope="module")
def families(tmp_path_factory) -> dict[str, tuple[Path, Path, list[str]]]:
    return laid_out(tmp_path_factory, {"t5-even": hf_text_models.made(tmp_path_factory, "t5-even"),
                                       "bart": hf_language_models.made(tmp_path_factory, "bart")})


def laid_out(tmp_path_factory, made: dict[str, tuple[Path, Path]]) -> dict[str, tuple[Path, Path, list[str]]]:
    """Per name, from its (Hugging Face directory, export): (the export, its layout held to PyTorch, the Hugging
    Face tests' 50 sample texts)."""
    out = {}
    for name, (hf, onnx_dir) in made.items():
        view = tmp_path_factory.mktemp(name) / "view"
        export_hf(onnx_dir, view, checkpoint=hf)
        out[name] = (onnx_dir, view, sample_texts())
    return out


@pytest.fixture(scope="module")
def presets(tmp_path_factory) -> dict[str, tuple[Path, Path, list[str]]]:
    """Per variant preset: (its checkpoint, its layout, random word sources)."""
    rng = np.random.default_rng(0)
    made = {}
    for preset in PRESETS:
        ckpt, model_dir = exported_case(tmp_path_factory, preset)
        view = tmp_path_factory.mktemp(preset) / "view"
        export_hf(model_dir, view, checkpoint=ckpt)
        texts = [" ".join(f"w{i}" for i in rng.integers(0, 9, rng.integers(2, 9))) for _ in range(16)]
        made[preset] = (ckpt, view, texts)
    return made


@pytest.fixture(scope="module")
def optimum(views, marian, multilingual, families, presets, tmp_path_factory) -> dict[str, list[tuple[list[int], str]]]:
    """Every Optimum job of this file, run in one process: per job, each text's (ids, text). Each directory is
    named by a relative path, as people type one: Optimum then finds generation_config.json only beside the
    graphs (given an absolute path, it also looks above them)."""
    if not OPTIMUM_PYTHON.exists():
        pytest.skip(f"{OPTIMUM_PYTHON} is missing: `make optimum-env` builds Optimum's venv")
    here = tmp_path_factory.mktemp("optimum")
    jobs = {"demo fp32": (views["fp32"], "", held_out(60), {}),
            "demo int8": (views["int8"], "_quantized", held_out(60), {}),
            "demo external": (views["external"], "", held_out(20), {}),
            **{f"marian {name}": (marian[1], "", marian[2][:MARIAN_TEXTS[name]], search)
               for name, search in MARIAN_SEARCHES.items()},
            **{preset: (view, "", texts, {}) for preset, (_, view, texts) in presets.items()},
            **{family: (view, "", texts[:FAMILY_TEXTS], {}) for family, (_, view, texts) in families.items()}}
    spec = [{"model": os.path.relpath(view, here), "suffix": suffix, "texts": texts, "generate": search}
            for view, suffix, texts, search in jobs.values()]
    for family, (_, view, texts) in multilingual.items():  # generation_config.json's searches, the languages set
        source, target = LANGUAGES[family]
        spec.append({"model": os.path.relpath(view, here), "suffix": "", "texts": texts[:FAMILY_TEXTS],
                     "generate": {}, "src_lang": source, "tgt_lang": target})
    result = subprocess.run([str(OPTIMUM_PYTHON), str(REPO / "tests" / "support" / "optimum_jobs.py")], cwd=here,
                            input=json.dumps(spec), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    return dict(zip([*jobs, *multilingual], json.loads(result.stdout), strict=True))


def held_out(count: int) -> list[str]:
    return [en for en, _ in demo_numbers.held_out_pairs()[:count]]


def tfm_run(model: Path, lines: list[str]) -> list[str]:
    result = CliRunner().invoke(run_main, ["translate", "--model", str(model)], input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    return result.output.split("\n")[:-1]


def tfm_run_ids(model: Path, lines: list[str], *options: str) -> list[tuple[int, ...]]:
    result = CliRunner().invoke(run_main, ["translate", "--model", str(model), "--format", "jsonl", *options],
                                input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    return [tuple(json.loads(line)["ids"]) for line in result.output.splitlines()]


def run_js(example: Path, view: Path, lines: list[str], dtype: str = "fp32", *options: str) -> list[str]:
    result = subprocess.run(["node", "translate.mjs", str(view), "--dtype", dtype, *options], cwd=example,
                            input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.split("\n")[:-1]


def generated(view: Path, rows: list[list[int]]) -> list[tuple[int, ...]]:
    """Generated ids as tfm-run reports a translation's: without the </s> that ended it."""
    eos = json.loads((view / "generation_config.json").read_text())["eos_token_id"]
    return [tuple(row[:-1]) if row and row[-1] == eos else tuple(row) for row in rows]


def js_ids(printed: list[str]) -> list[list[int]]:
    return [[int(i) for i in line.split()] for line in printed]


def test_transformers_js_translates_the_held_out_numbers_as_tfm_run(transformers_js, views, demo_onnx):
    lines = held_out(1000)
    assert run_js(transformers_js, views["fp32"], lines) == tfm_run(demo_onnx, lines)


def test_transformers_js_in_headless_chromium_translates_as_tfm_run(transformers_js, views, demo_onnx):
    """browser.html: the same pipeline in Debian's Chromium, ONNX Runtime's wasm served with the page."""
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed at /usr/bin/chromium (make test installs it with apt-get "
                    "where it can)")
    lines = held_out(1000)[-100:]
    result = subprocess.run(["node", "browser.mjs", str(views["fp32"]), "--chromium", str(CHROMIUM)],
                            cwd=transformers_js, input="\n".join(lines) + "\n", capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[:-1] == tfm_run(demo_onnx, lines)


def test_transformers_js_q8_translates_as_tfm_run_on_the_int8_directory(transformers_js, views, variants):
    lines = held_out(120)
    assert run_js(transformers_js, views["int8"], lines, "q8") == tfm_run(variants["int8-dynamic"], lines)


def test_the_external_weights_layout_loads_in_both_libraries(transformers_js, views, optimum, demo_onnx):
    """Weights in `<file>.onnx_data` (the layout past 2 GB, here at the demo's size): transformers.js fetches what
    config.json names; Optimum's two decoders read the merged decoder's file."""
    lines = held_out(60)
    assert run_js(transformers_js, views["external"], lines) == tfm_run(demo_onnx, lines)
    assert [text for _, text in optimum["demo external"]] == tfm_run(demo_onnx, held_out(20))


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_optimum_greedy_equals_tfm_run(optimum, demo_onnx, variants, precision):
    source = demo_onnx if precision == "fp32" else variants["int8-dynamic"]
    assert [text for _, text in optimum[f"demo {precision}"]] == tfm_run(source, held_out(60))


@pytest.mark.parametrize("search", list(MARIAN_SEARCHES))
def test_optimum_decodes_a_marian_as_tfm_run(optimum, marian, search):
    """Ids, not text: this model's </s> is an ordinary word, which the libraries print and tfm-run does not."""
    onnx_dir, view, texts = marian
    options = MARIAN_SEARCHES[search]
    ours = [*(("--beam-size", str(options["num_beams"])) if "num_beams" in options else ()),
            *(("--length-penalty", str(options["length_penalty"])) if "length_penalty" in options else ())]
    got = generated(view, [ids for ids, _ in optimum[f"marian {search}"]])
    assert got == tfm_run_ids(onnx_dir, texts[:MARIAN_TEXTS[search]], *ours)


def test_transformers_js_decodes_a_marian_as_tfm_run(transformers_js, marian):
    onnx_dir, view, texts = marian
    got = generated(view, js_ids(run_js(transformers_js, view, texts, "fp32", "--ids")))
    assert got == tfm_run_ids(onnx_dir, texts)


@pytest.mark.parametrize("preset", PRESETS)
def test_variant_presets_decode_as_pytorch_in_both_libraries(transformers_js, optimum, presets, preset):
    """Greedy against PyTorch's reference decoder: identical, or a near-tie verify would name (nothing else)."""
    ckpt_path, view, texts = presets[preset]
    ckpt = load_checkpoint(ckpt_path)
    limit = ckpt.config.n_position
    for name, rows in (("transformers.js", js_ids(run_js(transformers_js, view, texts, "fp32", "--ids"))),
                       ("Optimum", [ids for ids, _ in optimum[preset]])):
        for text, got in zip(texts, generated(view, rows), strict=True):
            src = np.array(ckpt.vocab.source.encode(text, framed=True))
            with torch.no_grad():
                want = reference_decoding.greedy_decode(ckpt.model, torch.from_numpy(src[None]), limit)[0].tokens
            assert got == want or near_tie(ckpt, src, got, want, True, limit, DEFAULT_TOLERANCE), (name, text)


@pytest.mark.parametrize("family", list(LANGUAGES))
def test_transformers_js_translates_multilingual_families_as_tfm_run(transformers_js, multilingual, family):
    """Greedy, the languages given as transformers.js spells them (its tokenizer class frames the source and
    forces the target), against tfm-run --source-lang/--target-lang."""
    onnx_dir, view, texts = multilingual[family]
    source, target = LANGUAGES[family]
    model_dir = ModelDir.read(onnx_dir)
    default_source = model_dir.vocabulary().source.framing_codes(model_dir.rules.languages)[0]
    config = json.loads((view / "tokenizer_config.json").read_text())
    assert (config["tokenizer_class"], config["src_lang"]) == (LANGUAGE_CLASSES[family],
                                                              hf_language_models.hf_language(default_source))
    js_languages = [*(("--src-lang", hf_language_models.hf_language(source)) if source else ()),
                    "--tgt-lang", hf_language_models.hf_language(target)]
    got = generated(view, js_ids(run_js(transformers_js, view, texts, "fp32", "--ids", *js_languages)))
    assert got == tfm_run_ids(onnx_dir, texts, "--beam-size", "1", *tfm_run_languages(family))


@pytest.mark.parametrize("family", list(LANGUAGES))
def test_optimum_decodes_multilingual_families_as_tfm_run(optimum, multilingual, family):
    """With generation_config.json's own search (beam 4 or 5, early stopping, mBART-50's length penalty 0.6) and
    the target forced as generate() forces it."""
    onnx_dir, view, texts = multilingual[family]
    got = generated(view, [ids for ids, _ in optimum[family]])
    assert got == tfm_run_ids(onnx_dir, texts[:FAMILY_TEXTS], *tfm_run_languages(family))


def tfm_run_languages(family: str) -> list[str]:
    source, target = LANGUAGES[family]
    return [*(("--source-lang", source) if source else ()), "--target-lang", target]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_other_families_decode_as_tfm_run_in_both_libraries(transformers_js, optimum, families, family):
    """Under their own model_type: transformers.js greedy, and Optimum with the model's saved search, against
    tfm-run (ids: these models' </s> is an ordinary word)."""
    onnx_dir, view, texts = families[family]
    assert json.loads((view / "config.json").read_text())["model_type"] == FAMILIES[family]
    got = generated(view, js_ids(run_js(transformers_js, view, texts, "fp32", "--ids")))
    assert got == tfm_run_ids(onnx_dir, texts, "--beam-size", "1")
    got = generated(view, [ids for ids, _ in optimum[family]])
    assert got == tfm_run_ids(onnx_dir, texts[:FAMILY_TEXTS])
