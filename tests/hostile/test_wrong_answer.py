"""Silent wrong answers: poisoned weights, text that is not what it seems (byte-order marks, CR, NUL, empty lines),
option values that could quietly change a translation, and directories bench would time under the wrong label."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from . import forge
from .commands import checkpoint_run, writer_run
from .scratch import Case
from .support import (
    DEMO_SRC,
    DEMO_TGT,
    Result,
    assert_expected,
    assert_ok,
    assert_ok_or_refused,
    assert_refused,
    says,
    short,
)

# -- poisoned weights -------------------------------------------------------------------------------

W1 = "encoder.layer_stack.0.pos_ffn.w_1.weight"
W2 = "encoder.layer_stack.0.pos_ffn.w_2.weight"
LN = "encoder.layer_norm.weight"
PRJ = "trg_word_prj.weight"
WEIGHT_POISON: dict[str, forge.Change] = {
    "nan": forge.weight_entry(W1, (0, 0), math.nan),
    "inf": forge.weight_entry("decoder.layer_stack.0.enc_attn.fc.weight", (1, 1), math.inf),
    "neg-inf": forge.weight_entry("encoder.layer_norm.bias", 0, -math.inf),
    "int-weight": forge.weight(W2, lambda sd: sd[W2].long()),
    "all-int": forge.all_weights(lambda v: v.round().int()),
    "bool-weight": forge.weight(LN, lambda sd: sd[LN] > 0),
    "complex-weight": forge.weight(LN, lambda sd: sd[LN].cfloat()),
    "missing-weight": forge.without("decoder.layer_norm.bias", inner="model"),
    "extra-weight": forge.weight("surplus.weight", lambda sd: sd[LN].new_zeros(3)),
    "wrong-shape": forge.weight(LN, lambda sd: sd[LN].new_ones(17)),
    "not-a-tensor": forge.weight(LN, lambda sd: [1.0] * 16),
    "shared-differ": forge.weight(PRJ, lambda sd: sd[PRJ].clone() + 1),
    "pos-table-nan": forge.weight_entry("encoder.position_enc.pos_table", (0, 3, 0), math.nan),
    "huge-finite": forge.weight(W1, lambda sd: sd[W1] * 1e38),
}
OTHER_POISON: dict[str, tuple[str, forge.Change]] = {  # on the demo checkpoint, or legal
    "nan-demo": ("demo", forge.weight_entry(W1, (0, 0), math.nan)),  # the demo's first w_1
    "fp16": ("tiny", forge.all_weights(lambda v: v.half())),
}
POISON_CASES = [pytest.param(k, "onnx", id=f"{k}/onnx") for k in WEIGHT_POISON]
POISON_CASES += [pytest.param(k, "translate", id=f"{k}/translate-torch")
                 for k in ("nan", "inf", "int-weight", "shared-differ")]
POISON_CASES += [pytest.param("nan-demo", "eval-demo", id="nan-demo/eval-demo"),
                 pytest.param("fp16", "onnx", id="fp16/onnx")]


@pytest.mark.parametrize("key,command", POISON_CASES)
def test_poisoned_weights(case: Case, key: str, command: str) -> None:
    base, change = OTHER_POISON.get(key) or ("tiny", WEIGHT_POISON[key])
    r = checkpoint_run(case, command, case.copy_ck(case.fx.forged(f"poison-{key}", base, change)))
    if key in ("huge-finite", "fp16"):  # legal floats: overflow may be refused or produce some output
        assert_ok_or_refused(r)
    else:
        assert_refused(r, f"{key} weights accepted")


# -- text in, text out ------------------------------------------------------------------------------

Q = DEMO_TGT
LONG = ("forty-two " * 5000 + "\n").encode()
DEMO_TEXT_CASES = [  # content (None: none), arguments, expected lines (None: not checked), how given, expectation
    pytest.param(b"\xef\xbb\xbfforty-two\nforty-two\n", (), [Q, Q], "file", "ok", id="bom-input-file"),
    pytest.param(b"\xef\xbb\xbfforty-two\nforty-two\n", (), [Q, Q], "stdin", "ok", id="bom-stdin"),
    pytest.param(b"\xef\xbb\xbfforty-two\r\nforty-two\r\n", (), [Q, Q], "file", "ok", id="bom-crlf-input-file"),
    pytest.param(b"forty-two\r\nforty-two\r\n", (), [Q, Q], "file", "ok", id="crlf-input-file"),
    pytest.param(b"forty-two\rforty-two\r", (), None, "file", "either", id="cr-only-input-file"),
    pytest.param(None, ("\ufeffforty-two",), None, "args", "either", id="bom-text-argument"),
    pytest.param(b"\xef\xbb\xbfforty-two\n", ("--format", "jsonl"), None, "file", "ok", id="bom-input-jsonl"),
    pytest.param(b"\xef\xbb\xbf\xef\xbb\xbfforty-two\n", (), None, "file", "either", id="double-bom-input-file"),
    pytest.param("forty-two\n".encode("utf-16"), (), [Q], "file", "either", id="utf16-input-file"),
    pytest.param("forty-two caf\xe9\n".encode("latin-1"), (), None, "file", "error", id="latin1-input-file"),
    pytest.param(b"forty-two\nforty-two", (), [Q, Q], "file", "ok", id="no-final-newline"),
    pytest.param(b"forty-two\n\n\nforty-two\n", (), [Q, "", "", Q], "file", "ok", id="empty-lines-kept"),
    pytest.param(b"forty-two\n   \t \nforty-two\n", (), [Q, "", Q], "file", "either", id="blank-line-only-spaces"),
    pytest.param(b"forty\x00-two\nforty-two\n", (), None, "file", "either", id="nul-byte-in-line"),
    pytest.param(None, ("forty-two\nforty-two",), None, "args", "either", id="newline-inside-text-argument"),
    pytest.param(None, ("", DEMO_SRC), ["", Q], "args", "ok", id="empty-text-argument"),
    pytest.param("forty-two\u2028forty-two\n".encode(), (), None, "file", "either", id="unicode-line-separator"),
    pytest.param(b"", (), [], "file", "either", id="empty-input-file"),
    pytest.param(b"forty-two\n", (DEMO_SRC,), None, "file", "error", id="text-and-input-together"),
    pytest.param(b"one\n", (DEMO_SRC,), [Q], "stdin", "either", id="text-and-stdin"),
    pytest.param(LONG, (), None, "file", "error", id="long-line-no-truncate"),
    pytest.param(LONG, ("--truncate",), None, "file", "ok", id="long-line-truncate"),
    pytest.param(b"forty-two\n", ("--beam-size", 4, "--n-best", 2, "--format", "jsonl"), None, "file", "ok",
                 id="beam-nbest-jsonl"),
    pytest.param(b"forty-two\n", ("--beam-size", 1, "--n-best", 3, "--format", "jsonl"), None, "file", "error",
                 id="nbest-above-beam"),
    pytest.param(None, (DEMO_SRC,), [Q], "args", "ok", id="demo-oracle-greedy-control"),
    pytest.param(None, ("--beam-size", 4, DEMO_SRC), [Q], "args", "ok", id="demo-oracle-beam4-control"),
    pytest.param(None, ("--max-length", 1, DEMO_SRC), None, "args", "either", id="max-length-1"),
]


def lines_are(expected: list[str] | None) -> Any:
    def check(r: Result) -> str | None:
        got = r.out.split("\n")
        if got and got[-1] == "":
            got = got[:-1]
        return None if got == expected else f"output {short(repr(got), 80)}, expected {short(repr(expected), 60)}"
    return check if expected is not None else None


@pytest.mark.parametrize("content,args,expected,how,expect", DEMO_TEXT_CASES)
def test_demo_text(case: Case, content: bytes | None, args: tuple, expected: list[str] | None, how: str,
                   expect: str) -> None:
    m = case.fx.demo()
    case.input(m)
    if how == "file":
        r = case.run("tfm-run", "translate", "--model", m, "--input", case.text("in.txt", content), *args)
    else:
        r = case.run("tfm-run", "translate", "--model", m, *args, input=content if how == "stdin" else None)
    assert_expected(expect, r, lines_are(expected))


def test_jsonl_hostile_characters(case: Case) -> None:
    texts = ['say "forty-two"', "back\\slash", "tab\there", "\u00e9\u00e8 \U0001F600", "</s> <s> <blank> <unk>"]

    def check(r: Result) -> str | None:
        if len(r.out_lines) != len(texts):
            return f"{len(r.out_lines)} JSON lines for {len(texts)} inputs"
        for line in r.out_lines:
            try:
                json.loads(line)
            except ValueError:
                return f"invalid JSON line {short(line, 50)!r}"
        return None
    assert_ok(case.run("tfm-run", "translate", "--model", case.fx.demo(), "--format", "jsonl", *texts), check)


def test_special_tokens_as_text(case: Case) -> None:
    r = case.run("tfm-run", "translate", "--model", case.fx.demo(), "</s> </s> <s>", "<blank>", "forty-two </s> nine")
    assert_ok_or_refused(r, lambda r: None if len(r.out_lines) == 3 else f"{len(r.out_lines)} lines for 3")


def test_one_megabyte_token(case: Case) -> None:
    inp = case.text("in.txt", "x" * 1_000_000 + "\nforty-two\n")
    r = case.run("tfm-run", "translate", "--model", case.fx.demo(), "--input", inp)
    assert_ok_or_refused(r, lambda r: None if r.out_lines[-1:] == [DEMO_TGT] else "second line wrong")


def test_200k_empty_lines(case: Case) -> None:
    inp = case.text("in.txt", "\n" * 200_000 + "forty-two\n")
    r = case.run("tfm-run", "translate", "--model", case.fx.demo(), "--input", inp)
    assert_ok_or_refused(r, lambda r: None if r.out.count("\n") == 200_001 and r.out.endswith(DEMO_TGT + "\n")
                         else "line alignment lost")


# -- options that could quietly change a translation ------------------------------------------------

OPTION_CASES = [  # arguments, backend, environment, expectation, beam size
    *[pytest.param(("--length-penalty", lp), backend, None, "either" if lp in ("-0", "1e-400") else "error", 2,
                   id=f"length-penalty-{lp}/{backend}")
      for lp in ("nan", "inf", "-inf", "1e308", "-1e308", "11", "-0", "0x10", "1e-400")
      for backend in ("onnxruntime", "torch")],
    *[pytest.param(("--threads", th), backend, None, "error", 2, id=f"threads-{th}/{backend}")
      for th in ("4096", "100000", "-1", "9") for backend in ("onnxruntime", "torch")],
    *[pytest.param((), "onnxruntime", {"TFM_THREADS": th}, "error", 2, id=f"env-TFM_THREADS-{th}/onnxruntime")
      for th in ("100000", "abc", "-3", "4096")],
    pytest.param((), "onnxruntime", {"TFM_ORT_OPT_LEVEL": "turbo"}, "error", 2, id="env-TFM_ORT_OPT_LEVEL-bogus"),
    pytest.param(("--ort-trt",), "torch", None, "error", 2, id="ort-trt-with-torch-backend"),
    pytest.param(("--ort-trt",), "onnxruntime", None, "error", 2, id="ort-trt-on-cpu"),
    pytest.param(("--device", "cuda"), "onnxruntime", None, "either", 2, id="device-cuda-without-gpu"),
    pytest.param((), "tensorrt", None, "either", 2, id="backend-tensorrt-on-model-dir"),
    pytest.param((), "torch", None, "either", 1, id="demo-oracle-torch-control"),
    pytest.param(("--no-memory-arena",), "onnxruntime", None, "either", 2, id="no-memory-arena-control"),
    pytest.param(("--memory-arena", "--spinning"), "onnxruntime", None, "either", 2,
                 id="memory-arena-spinning-control"),
    pytest.param((), "onnxruntime", {"TFM_ORT_ARENA": "sometimes"}, "error", 2, id="env-TFM_ORT_ARENA-bogus"),
]


@pytest.mark.parametrize("args,backend,env,expect,beam", OPTION_CASES)
def test_translate_option(case: Case, args: tuple, backend: str, env: dict | None, expect: str, beam: int) -> None:
    m = case.fx.demo()
    case.input(m)
    model = m
    if backend == "torch":
        model = case.fx.demo_ck() / "ckpt.pt"
        case.input(case.fx.demo_ck())
    r = case.run("tfm-run", "translate", "--model", model, "--backend", backend, "--beam-size", beam, *args,
                 DEMO_SRC, env=env)
    assert_expected(expect, r, says(DEMO_TGT))


@pytest.mark.parametrize("threads", ["4096", "100000"])
def test_bench_threads(case: Case, threads: str) -> None:
    assert_refused(writer_run(case, "bench-json", case.out("b.json"), ("--threads", threads)))


def test_train_demo_threads_100000(case: Case) -> None:
    assert_refused(case.run("tfm-export", "train-demo", "--steps", 1, "--batch-size", 2, "--threads", 100000,
                            "--output", case.out("demo")))


@pytest.mark.parametrize("kind", ["int8", "fp16"])
def test_bench_model(case: Case, kind: str) -> None:
    """bench times fp32 graphs (ort-fp32): a quantized directory must be refused, not timed under that label."""
    src = case.fx.int8()
    if kind == "fp16":
        src = case.p("fp16")
        r0 = case.fx.run(["tfm-export", "quantize", "--model", case.fx.tiny(), "--precision", "fp16", "--output", src],
                         cwd=case.dir)
        if r0.rc != 0:
            pytest.skip(f"fp16 quantize failed: {short(r0.err)}")
    m = case.copy_model(src, "q")
    out = case.out("b.json")
    r = case.run("tfm-run", "bench", "--model", m, "--backends", "ort-fp32", "--batch-sizes", 1, "--beam-sizes", 1,
                 "--sentences", 2, "--repeats", 2, "--min-time", 0, "--output-length", 4, "--json", out,
                 timeout=2 * case.fx.timeout)
    labelled = " and labelled it ort-fp32"
    assert_ok_or_refused(r, lambda r: f"timed a {kind} directory" + (labelled if out.exists() and "ort-fp32" in
                                                                      out.read_text() else ""))
