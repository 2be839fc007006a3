"""`tfm-export triton` repositories on a real tritonserver (nvidia-pytriton's, started from .venv-serving).

The oracle is `tfm-run translate` on the same model directory in this process: the Translator that the rest of
the suite holds to PyTorch's reference decoders. The translator layout must equal it sentence for sentence on
the 1,000 held-out demo numbers, under concurrent load, with bad requests failing alone; the bls layout runs its
own Python model (the decoding loop over BLS calls) against stand-ins for the onnxruntime backend, which the
bundled server lacks.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpc
import tritonclient.http as http
from click.testing import CliRunner
from support.common import REPO
from support.triton_server import SERVING_VENV, serving_environment, stand_in_native_models, text_input, translate

from tfm_export.cli.run_cli import main as run_main
from tfm_export.serving.load import model_counts, run_load
from tfm_export.serving.local_server import LocalTritonServer
from tfm_export.serving.repository import RepositoryRequest, write_repository

HELDOUT = REPO / "models" / "demo" / "heldout.en.txt"
LINES = HELDOUT.read_text().splitlines()


@pytest.fixture(scope="module")
def oracle(demo_onnx) -> dict[int, list[str]]:
    """`tfm-run translate` on the held-out numbers, greedy and beam 4."""
    outputs = {}
    for beam in (1, 4):
        result = CliRunner().invoke(run_main, ["translate", "--model", str(demo_onnx), "--input", str(HELDOUT),
                                               "--beam-size", str(beam)])
        assert result.exit_code == 0, result.output
        outputs[beam] = result.output.splitlines()
    assert len(outputs[1]) == len(LINES) == 1000
    return outputs


@pytest.fixture(scope="module")
def environment():
    return serving_environment()


@pytest.fixture(scope="module")
def translator_server(environment, demo_onnx, tmp_path_factory):
    root = tmp_path_factory.mktemp("triton-translator")
    write_repository(RepositoryRequest(demo_onnx, root / "repo", max_batch=32))
    with LocalTritonServer(environment, root / "repo", root / "work") as server:
        yield server


@pytest.fixture(scope="module")
def bls_server(environment, demo_onnx, tmp_path_factory):
    root = tmp_path_factory.mktemp("triton-bls")
    repository = write_repository(RepositoryRequest(demo_onnx, root / "repo", layout="bls", max_batch=32))
    stand_in_native_models(root / "repo", repository.models[1:])
    with LocalTritonServer(environment, root / "repo", root / "work") as server:
        yield server


def test_heldout_greedy_over_http_equals_tfm_run(translator_server, oracle):
    """1,000 one-sentence requests from 8 concurrent clients: dynamically batched, each answer its own."""
    result = run_load(translator_server.http_url, "translator", LINES, clients=8)
    assert result.errors == {}
    assert result.answers == oracle[1]
    assert result.mean_batch > 1


def test_heldout_beam4_over_grpc_equals_tfm_run(translator_server, oracle):
    client = grpc.InferenceServerClient(translator_server.grpc_url)
    answers = [t for start in range(0, len(LINES), 25)
               for t in translate(grpc, client, "translator", LINES[start:start + 25], {"beam_size": 4})]
    assert answers == oracle[4]


def test_a_repository_of_the_external_layout_serves_as_tfm_run(environment, demo_external, tmp_path):
    """Every graph's weights in one shared file (the layout of models past 2 GB): the repository copies it once and
    the server translates 200 held-out numbers, greedy and beam 4, as tfm-run does on the same directory."""
    repository = write_repository(RepositoryRequest(demo_external, tmp_path / "repo", max_batch=32))
    copied = sorted(p.name for p in (tmp_path / "repo").rglob("*.data"))
    assert copied == ["weights.onnx.data"], copied
    lines = LINES[:200]
    with LocalTritonServer(environment, tmp_path / "repo", tmp_path / "work") as server:
        client = http.InferenceServerClient(server.http_url)
        for beam in (1, 4):
            want = CliRunner().invoke(run_main, ["translate", "--model", str(demo_external), "--beam-size", str(beam),
                                                 *lines])
            got = [t for start in range(0, len(lines), 25) for t in
                   translate(http, client, repository.models[0], lines[start:start + 25], {"beam_size": beam})]
            assert want.exit_code == 0 and got == want.output.splitlines()


def test_n_best_and_scores(translator_server, demo_onnx):
    """N_BEST lists beam hypotheses best first with the scores that rank them, as `tfm-run translate --n-best`
    does, exactly n_best per sentence: where the beams finished fewer (the held-out numbers have such inputs),
    the rest are "" with score -inf, and N_BEST_COUNT says how many are real."""
    client = http.InferenceServerClient(translator_server.http_url)
    texts = LINES[:32]  # the repository's --max-batch
    result = client.infer("translator", [text_input(http, [t.encode() for t in texts])],
                          parameters={"beam_size": 4, "n_best": 3, "length_penalty": 0.6})
    local = CliRunner().invoke(run_main, ["translate", "--model", str(demo_onnx), "--beam-size", "4", "--n-best",
                                          "3", "--length-penalty", "0.6", "--format", "jsonl", *texts])
    expected = [json.loads(line) for line in local.output.splitlines()]
    assert result.as_numpy("N_BEST").shape == result.as_numpy("N_BEST_SCORES").shape == (32, 3)
    assert sum(want["n_best_count"] < 3 for want in expected) >= 3
    for row, want in enumerate(expected):
        assert [t.decode() for t in result.as_numpy("N_BEST")[row]] == [h["translation"] for h in want["n_best"]]
        scores = [-np.inf if h["score"] is None else h["score"] for h in want["n_best"]]
        assert result.as_numpy("N_BEST_SCORES")[row].tolist() == pytest.approx(scores, abs=1e-5)
        assert result.as_numpy("N_BEST_COUNT")[row, 0] == want["n_best_count"]
        assert result.as_numpy("TRANSLATION")[row, 0].decode() == want["translation"]
        assert result.as_numpy("SCORE")[row, 0] == pytest.approx(want["score"], abs=1e-5)


BAD_REQUESTS = {  # request -> what its error must say
    "empty": ([b"  "], None, "TEXT element 1 is empty"),
    "over-long": ([b"forty-two", b" ".join([b"one"] * 300)], None, "TEXT line 2: 302 tokens"),
    "not UTF-8": ([b"forty-two", b"\xff\xfe"], None, "TEXT element 2 is not valid UTF-8"),
    "beam 0": ([b"forty-two"], {"beam_size": 0}, "beam_size 0 is outside 1..32"),
    "beam 1000": ([b"forty-two"], {"beam_size": 1000}, "beam_size 1000 is outside 1..32"),
    "n_best > beam": ([b"forty-two"], {"beam_size": 2, "n_best": 3}, "n_best 3 is outside 1..2"),
    "max_length 0": ([b"forty-two"], {"max_length": 0}, "max_length 0 is outside 1..200"),
    "unknown parameter": ([b"forty-two"], {"beam": 4}, "unknown request parameter(s) beam"),
    "string beam": ([b"forty-two"], {"beam_size": "4"}, "beam_size must be a whole number"),
    "penalty out of range": ([b"forty-two"], {"length_penalty": -11.5}, "length_penalty -11.5 is outside -10..10"),
    "language on a model without": ([b"forty-two"], {"target_lang": "fr"}, "this model takes no language codes"),
}


def test_bad_requests_fail_alone_within_one_dynamic_batch(translator_server, oracle):
    """A slow request occupies the model while good and bad requests queue, so the dynamic batcher hands them
    over together; each bad one gets its own 400 with its message, every good one its translation."""
    good = {f"good {i}": ([LINES[i].encode()], None, oracle[1][i]) for i in range(8)}
    requests = {**BAD_REQUESTS, **good}
    outcomes: dict[str, str] = {}
    blocker_sent = threading.Event()

    def send(name: str, texts: list[bytes], parameters: dict | None) -> None:
        client = http.InferenceServerClient(translator_server.http_url)
        if name != "blocker":
            blocker_sent.wait()
        try:
            outcomes[name] = client.infer("translator", [text_input(http, texts)], parameters=parameters) \
                .as_numpy("TRANSLATION")[0, 0].decode()
        except Exception as exc:
            outcomes[name] = f"error: {exc}"

    before = model_counts(translator_server.http_url, "translator")
    blocker = threading.Thread(target=send, args=("blocker", [t.encode() for t in LINES[:32]], {"beam_size": 4}))
    blocker.start()
    time.sleep(0.1)  # the blocker reaches the model first
    threads = [threading.Thread(target=send, args=(name, texts, params)) for name, (texts, params, _) in
               requests.items()]
    for thread in threads:
        thread.start()
    blocker_sent.set()
    for thread in (blocker, *threads):
        thread.join()
    inferences, executions = (a - b for a, b in zip(model_counts(translator_server.http_url, "translator"), before,
                                                    strict=True))
    for name, (_, _, expected) in requests.items():
        if name in BAD_REQUESTS:
            assert outcomes[name].startswith("error: [400]") and expected in outcomes[name], (name, outcomes[name])
        else:
            assert outcomes[name] == expected, name
    assert outcomes["blocker"] == oracle[4][0]
    assert executions < 1 + len(requests)  # some requests shared an execution


@pytest.mark.parametrize("module", [http, grpc])
def test_wrong_tensor_name_or_dtype_is_refused_by_the_server(translator_server, oracle, module):
    url = translator_server.http_url if module is http else translator_server.grpc_url
    client = module.InferenceServerClient(url)
    with pytest.raises(module.InferenceServerException, match="unexpected inference input 'SOURCE'"):
        client.infer("translator", [text_input(module, [b"forty-two"], name="SOURCE")])
    ids = module.InferInput("TEXT", [1, 1], "INT32")
    ids.set_data_from_numpy(np.array([[42]], dtype=np.int32))
    with pytest.raises(module.InferenceServerException, match="data-type is 'INT32', but model 'translator' "
                                                              "expects 'BYTES'"):
        client.infer("translator", [ids])
    assert translate(module, client, "translator", LINES[:3]) == oracle[1][:3]


def test_clients_disconnecting_mid_request_do_not_hurt_the_server(translator_server, oracle):
    """An HTTP client that hangs up after sending a long request, and a gRPC client whose deadline passes while
    its request runs: the server finishes or drops them and keeps answering."""
    body = json.dumps({"inputs": [{"name": "TEXT", "shape": [32, 1], "datatype": "BYTES", "data": LINES[:32]}],
                       "parameters": {"beam_size": 4}}).encode()
    host, port = translator_server.http_url.split(":")
    for _ in range(3):
        with socket.create_connection((host, int(port))) as raw:
            raw.sendall(b"POST /v2/models/translator/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    client = grpc.InferenceServerClient(translator_server.grpc_url)
    with pytest.raises(grpc.InferenceServerException, match="Deadline Exceeded"):
        client.infer("translator", [text_input(grpc, [t.encode() for t in LINES[:32]])], parameters={"beam_size": 4},
                     client_timeout=0.005)  # the demo decodes these 32 at beam 4 in ~30 ms
    assert translate(grpc, client, "translator", LINES[100:130]) == oracle[1][100:130]
    assert translator_server.process.poll() is None


def test_bounded_load_is_answered_in_full_and_memory_stays_flat(translator_server, oracle):
    """16 clients, 2 rounds of 240 requests: every answer correct, none lost, batches formed, and the second
    round leaves the server's memory (server and stub together) where the first left it."""
    rounds = []
    for start in (200, 440):
        texts = LINES[start:start + 240]
        result = run_load(translator_server.http_url, "translator", texts, clients=16,
                          rss=translator_server.rss_bytes, sample_every_s=0.2)
        assert result.errors == {} and result.answers == oracle[1][start:start + 240]
        assert len(result.latencies_s) == 240 and result.mean_batch > 1
        rounds.append(result)
    first, second = max(rounds[0].rss_bytes), max(rounds[1].rss_bytes)
    assert second <= first * 1.05 + 8e6, (first, second)


def test_bls_layout_decodes_through_the_native_models(bls_server, oracle):
    """The BLS model's loop calls translator_encoder once per batch and translator_decoder_step once per token
    step; its output equals tfm-run's, greedy and beam 4, and its errors are the translator layout's."""
    client = grpc.InferenceServerClient(bls_server.grpc_url)
    encoder_before = model_counts(bls_server.http_url, "translator_encoder")
    for beam in (1, 4):
        answers = [t for start in range(0, 96, 32)
                   for t in translate(grpc, client, "translator", LINES[start:start + 32], {"beam_size": beam})]
        assert answers == oracle[beam][:96]
    encoder_after = model_counts(bls_server.http_url, "translator_encoder")
    assert encoder_after[1] - encoder_before[1] >= 6  # one encoder execution per request at least
    assert model_counts(bls_server.http_url, "translator_decoder_step")[1] > 6 * 10
    with pytest.raises(grpc.InferenceServerException, match="TEXT line 1: 302 tokens"):
        translate(grpc, client, "translator", [" ".join(["one"] * 300)])
    result = run_load(bls_server.http_url, "translator", LINES[:64], clients=8)
    assert result.errors == {} and result.answers == oracle[1][:64]


def test_a_failing_test_leaves_no_server_process(environment, demo_onnx, tmp_path):
    """The server and its Python-backend stubs are gone after the context exits by an exception."""
    write_repository(RepositoryRequest(demo_onnx, tmp_path / "repo", instances=2))
    with pytest.raises(RuntimeError, match="test body failed"):
        with LocalTritonServer(environment, tmp_path / "repo", tmp_path / "work") as server:
            pids = server.pids()
            assert len(pids) >= 3  # the server and two stubs
            raise RuntimeError("test body failed")
    assert server.pids() == []


def test_the_server_environment_has_the_runtime_only():
    """The Python backend runs tfm-export from the runtime-only install: no PyTorch, no ONNX there."""
    serving_environment()
    probe = ("import importlib.util as u, json; print(json.dumps({m: u.find_spec(m) is not None for m in "
             "('torch', 'onnx', 'onnxruntime', 'tfm_export', 'pytriton')}))")
    found = json.loads(subprocess.run([SERVING_VENV / "bin" / "python", "-c", probe], capture_output=True, text=True,
                                      check=True).stdout)
    assert found == {"torch": False, "onnx": False, "onnxruntime": True, "tfm_export": True, "pytriton": True}
