"""Pretrained-model exports on a real tritonserver: a Marian, an NLLB (M2M100 with its language codes) and a T5,
random and tiny (built offline by support.hf_text_models and support.hf_language_models, which skip this file
without the hf extra; the Hugging Face tests build the same), each served in both layouts by one server.

The oracle is `tfm-run translate` on the same export, which the Hugging Face tests hold to transformers'
generate(): every answer (text and score) must equal it, greedy, beam 4 and with the model's own generation
defaults, with the languages a request names; n-best lists as tfm-run's jsonl; bad parameters as one-line 400s.
"""

from __future__ import annotations

import json
import math
import threading
import time

import pytest
import tritonclient.grpc as grpc
import tritonclient.http as http
from click.testing import CliRunner
from support import hf_language_models, hf_text_models
from support.hf_oracle import sample_texts
from support.triton_server import serving_environment, stand_in_native_models, text_input

from tfm_export.cli.run_cli import main as run_main
from tfm_export.serving.contract import LAYOUTS
from tfm_export.serving.load import model_counts
from tfm_export.serving.local_server import LocalTritonServer
from tfm_export.serving.repository import RepositoryRequest, write_repository

TEXTS = sample_texts()[:20]
# the languages every request to a model names (NLLB's generation config names no target language)
LANGUAGES = {"marian": {}, "nllb": {"source_lang": "fra_Latn", "target_lang": "deu_Latn"}, "t5": {}}
FLAGS = {"source_lang": "--source-lang", "target_lang": "--target-lang"}
MAX_BATCH = 32


@pytest.fixture(scope="module")
def environment():
    return serving_environment()


@pytest.fixture(scope="module")
def exports(environment, tmp_path_factory) -> dict[str, object]:
    """The same models and exports as the Hugging Face tests', made once per run."""
    return {kind: (hf_language_models if kind == "nllb" else hf_text_models).made(tmp_path_factory, kind)[1]
            for kind in LANGUAGES}


@pytest.fixture(scope="module")
def server(environment, exports, tmp_path_factory):
    """One server for all six models: each export in the translator layout (`KIND_translator`) and the bls layout
    (`KIND_bls`, its native models served by the ONNX Runtime stand-in), one repository each."""
    root = tmp_path_factory.mktemp("pretrained-repositories")
    repositories = []
    for kind, model in exports.items():
        for layout in LAYOUTS:
            repository = root / f"{kind}-{layout}"
            written = write_repository(RepositoryRequest(model, repository, name=f"{kind}_{layout}", layout=layout,
                                                         max_batch=MAX_BATCH))
            stand_in_native_models(repository, written.models[1:])
            repositories.append(repository)
    more = tuple(a for r in repositories[1:] for a in ("--model-repository", str(r)))
    with LocalTritonServer(environment, repositories[0], root / "work", more) as running:
        yield running


@pytest.fixture(scope="module")
def tfm_run(exports):
    """`tfm-run translate --format jsonl` rows on an export, with request parameters as its flags (cached)."""
    cache: dict[str, list[dict]] = {}

    def rows(kind: str, texts: list[str], parameters: dict) -> list[dict]:
        flags = [f for name, value in parameters.items()
                 for f in (FLAGS.get(name, "--" + name.replace("_", "-")), str(value))]
        key = json.dumps([kind, texts, flags])
        if key not in cache:
            result = CliRunner().invoke(run_main, ["translate", "--model", str(exports[kind]), "--format", "jsonl",
                                                   *flags, *texts])
            assert result.exit_code == 0, result.output
            cache[key] = [json.loads(line) for line in result.stdout.splitlines()]
        return cache[key]
    return rows


def _infer(url: str, model: str, texts: list[str], parameters: dict):
    client = grpc.InferenceServerClient(url)
    return client.infer(model, [text_input(grpc, [t.encode() for t in texts])], parameters=parameters)


def _strings(array) -> list[list[str]]:
    return [[s.decode() for s in row] for row in array]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", sorted(LANGUAGES))
@pytest.mark.parametrize("beam", [1, 4, None])
def test_answers_equal_tfm_run(server, tfm_run, kind, layout, beam):
    """20 inputs per model, layout and search: greedy, beam 4, and no beam_size (the model's default: NLLB's
    generation config says 4 beams and early stopping, the others greedy)."""
    parameters = {**LANGUAGES[kind], **({} if beam is None else {"beam_size": beam})}
    result = _infer(server.grpc_url, f"{kind}_{layout}", TEXTS, parameters)
    want = tfm_run(kind, TEXTS, parameters)
    assert [t[0] for t in _strings(result.as_numpy("TRANSLATION"))] == [w["translation"] for w in want]
    assert result.as_numpy("SCORE")[:, 0].tolist() == pytest.approx([w["score"] for w in want], abs=1e-4)
    assert len({w["translation"] for w in want}) >= 10  # the models answer differently per input


@pytest.mark.parametrize("layout", LAYOUTS)
def test_n_best_equals_tfm_run(server, tfm_run, layout):
    """beam 4, n_best 4 with a length penalty: N_BEST, N_BEST_SCORES and N_BEST_COUNT are tfm-run's n_best list
    (null scores there are -inf here) on every model."""
    for kind in sorted(LANGUAGES):
        parameters = {**LANGUAGES[kind], "beam_size": 4, "n_best": 4, "length_penalty": 0.6}
        result = _infer(server.grpc_url, f"{kind}_{layout}", TEXTS[:8], parameters)
        want = tfm_run(kind, TEXTS[:8], parameters)
        assert _strings(result.as_numpy("N_BEST")) == [[a["translation"] for a in w["n_best"]] for w in want]
        scores = [[-math.inf if a["score"] is None else a["score"] for a in w["n_best"]] for w in want]
        assert result.as_numpy("N_BEST_SCORES").tolist() == [pytest.approx(s, abs=1e-4) for s in scores]
        assert result.as_numpy("N_BEST_COUNT")[:, 0].tolist() == [w["n_best_count"] for w in want]


def test_requests_into_different_languages_share_a_batch(server, tfm_run):
    """A slow request occupies the NLLB model while requests into three target languages queue behind it, so the
    dynamic batcher hands them over together: each answer is still tfm-run's into its own language."""
    model, blocker = "nllb_translator", {"source_lang": "fra_Latn", "target_lang": "deu_Latn", "beam_size": 4}
    cases = [{"source_lang": "fra_Latn", "target_lang": target, "beam_size": 2}
             for target in ("deu_Latn", "spa_Latn", "eng_Latn")]
    answers: dict[int, list[str]] = {}

    def send(index: int, texts: list[str], parameters: dict) -> None:
        result = _infer(server.grpc_url, model, texts, parameters)
        answers[index] = [t[0] for t in _strings(result.as_numpy("TRANSLATION"))]
    before = model_counts(server.http_url, model)
    # the blocker: a whole batch at beam 4, still running when the others arrive (they only need to queue behind it;
    # one that overtakes it shares its execution instead)
    first = threading.Thread(target=send, args=(-1, (TEXTS * 2)[:MAX_BATCH], blocker))
    first.start()
    time.sleep(0.02)
    threads = [threading.Thread(target=send, args=(i, TEXTS[:10], case)) for i, case in enumerate(cases)]
    for thread in threads:
        thread.start()
    for thread in (first, *threads):
        thread.join()
    executions = model_counts(server.http_url, model)[1] - before[1]
    wants = [[w["translation"] for w in tfm_run("nllb", TEXTS[:10], case)] for case in cases]
    assert len({tuple(w) for w in wants}) == 3  # the target language changes the answers
    assert [answers[i] for i in range(len(cases))] == wants
    assert executions < 1 + len(cases)  # some of them shared an execution


@pytest.mark.parametrize("layout", LAYOUTS)
def test_multilingual_marian_puts_the_target_code_before_the_source(server, tfm_run, layout):
    parameters = {"target_lang": ">>fra<<", "beam_size": 4}
    result = _infer(server.grpc_url, f"marian_{layout}", TEXTS, parameters)
    want = [w["translation"] for w in tfm_run("marian", TEXTS, parameters)]
    assert [t[0] for t in _strings(result.as_numpy("TRANSLATION"))] == want
    assert want != [w["translation"] for w in tfm_run("marian", TEXTS, {"beam_size": 4})]  # the code acts


BAD_PARAMETERS = {  # (model, parameters) -> the one line the 400 says
    "unknown target language": ("nllb", {"target_lang": "xx_Latn"},
                                "target_lang 'xx_Latn' is not one of the model's 4 language codes "
                                "(eng_Latn, fra_Latn, deu_Latn, spa_Latn)"),
    "no target language": ("nllb", {"beam_size": 2},
                           "this model translates into 4 languages and its generation config names none; pass "
                           "target_lang (eng_Latn, fra_Latn, deu_Latn, spa_Latn)"),
    "language on T5": ("t5", {"target_lang": "de"},
                       "source_lang/target_lang: this model takes no language codes; drop them"),
    "source language on Marian": ("marian", {"source_lang": ">>fra<<"},
                                  "source_lang: this model's sources carry no language code (it reads any language "
                                  "it knows); drop it"),
    "language not a string": ("nllb", {"target_lang": 7}, "request parameter target_lang must be a language code "
                                                          "(a string), got 7"),
    "beam_size a string": ("t5", {"beam_size": "4"}, "request parameter beam_size must be a whole number, got '4'"),
    "n_best not whole": ("marian", {"beam_size": 4, "n_best": 1.5},
                         "request parameter n_best must be a whole number, got 1.5"),
    "length_penalty a flag": ("marian", {"length_penalty": True},
                              "request parameter length_penalty must be a number, got True"),
    "n_best above the default beam": ("nllb", {"target_lang": "deu_Latn", "n_best": 5},
                                    "request parameter n_best 5 is outside 1..4: it may not exceed beam_size"),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bad_parameters_are_one_line_400s(server, layout):
    client = http.InferenceServerClient(server.http_url)
    for name, (kind, parameters, message) in BAD_PARAMETERS.items():
        with pytest.raises(http.InferenceServerException) as caught:
            client.infer(f"{kind}_{layout}", [text_input(http, [TEXTS[0].encode()])], parameters=parameters)
        assert caught.value.status() == "400" and caught.value.message() == message, (name, str(caught.value))
