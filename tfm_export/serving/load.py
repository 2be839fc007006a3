"""A bounded concurrent load on a Triton text model, for the load test and `make bench-serving`.

`clients` threads, each with its own HTTP client (tritonclient's HTTP client must not be shared between
threads), take request indices from one shared counter, so every request is sent exactly once and its answer is
kept under its index. Latency is each request's own round trip; throughput is requests over the wall time of
the whole run. The mean dynamic batch comes from the server's own statistics (inferences / executions over the
run), and the server's memory is sampled while it runs.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .contract import TEXT, TRANSLATION

NETWORK_TIMEOUT_S = 600.0


@dataclass
class LoadResult:
    answers: list[str | None]  # per request, None where it failed
    errors: dict[int, str]  # request index -> the server's message
    latencies_s: list[float]
    wall_s: float
    inferences: int  # sentences the model executed during the run (server statistics)
    executions: int  # model executions (dynamic batches) during the run
    rss_bytes: list[int] = field(default_factory=list)  # server memory, sampled over the run

    @property
    def throughput(self) -> float:
        """Requests answered per second of wall time."""
        return sum(a is not None for a in self.answers) / self.wall_s

    def latency_ms(self, percentile: float) -> float:
        return float(np.percentile(self.latencies_s, percentile) * 1000)

    @property
    def mean_batch(self) -> float:
        return self.inferences / max(self.executions, 1)


def request_input(texts: Sequence[str]):
    """The TEXT input of one request (HTTP client types)."""
    import tritonclient.http as http
    tensor = http.InferInput(TEXT, [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_))
    return tensor


def model_counts(url: str, model: str) -> tuple[int, int]:
    """(inference_count, execution_count) of a model, from the server's statistics endpoint."""
    import tritonclient.http as http
    stats = http.InferenceServerClient(url).get_inference_statistics(model)["model_stats"][0]
    return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))


def run_load(url: str, model: str, texts: Sequence[str], clients: int, parameters: dict | None = None,
             rss: Callable[[], int] | None = None, sample_every_s: float = 0.5) -> LoadResult:
    """One request per text, `clients` at a time, over HTTP to `url` (host:port)."""
    import tritonclient.http as http
    answers: list[str | None] = [None] * len(texts)
    errors: dict[int, str] = {}
    latencies: list[float] = []
    counter, lock, done = itertools.count(), threading.Lock(), threading.Event()

    def worker() -> None:
        client = http.InferenceServerClient(url, network_timeout=NETWORK_TIMEOUT_S, connection_timeout=60.0)
        while (index := _next(counter, lock)) < len(texts):
            start = time.perf_counter()
            try:
                result = client.infer(model, [request_input([texts[index]])], parameters=parameters)
                answers[index] = result.as_numpy(TRANSLATION)[0, 0].decode("utf-8")
            except Exception as exc:  # tritonclient's InferenceServerException, or a broken connection
                errors[index] = str(exc)
            with lock:
                latencies.append(time.perf_counter() - start)

    samples: list[int] = []
    sampler = threading.Thread(target=_sample, args=(rss, samples, done, sample_every_s), daemon=True)
    before = model_counts(url, model)
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    start = time.perf_counter()
    sampler.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    after = model_counts(url, model)
    return LoadResult(answers, errors, latencies, wall, after[0] - before[0], after[1] - before[1], samples)


def _next(counter: itertools.count, lock: threading.Lock) -> int:
    with lock:
        return next(counter)


def _sample(rss: Callable[[], int] | None, samples: list[int], done: threading.Event, every: float) -> None:
    while rss is not None and not done.wait(every):
        samples.append(rss())
