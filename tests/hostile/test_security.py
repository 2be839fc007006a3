"""Security: names in checkpoints and manifests that lead out of their directory, pickled code, files changed
behind the manifest's back, links planted where outputs are staged, and outputs that are devices, pipes or links."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from . import forge
from .commands import WRITERS, checkpoint_run, reader_run, writer_out_names, writer_run
from .scratch import Case
from .support import (
    DEMO_SRC,
    TINY_SENT,
    Result,
    SilentWrong,
    WroteOutside,
    assert_ok,
    assert_ok_or_refused,
    assert_refused,
    same_output,
    under,
)

# -- tokenizer names in checkpoints -----------------------------------------------------------------

TOKENIZER_NAMES: dict[str, Any] = {  # @FX@: the fixtures' directory
    "dotdot": "../outside/tokenizer.json",
    "absolute": "@FX@/outside/tokenizer.json",
    "etc-passwd": "/etc/passwd",
    "fifo-outside": "@FX@/outside/fifo.json",
    "symlink-out": "link.json",
    "subdir": "sub/tokenizer.json",
    "empty": "",
    "dot": ".",
    "dotdot-bare": "..",
    "none": None,
    "int": 5,
    "nul-byte": "tokenizer.json\x00.txt",
}
TOKNAME_CASES = [pytest.param(key, cmd, id=f"{key}/{cmd}") for key in TOKENIZER_NAMES
                 for cmd in ("onnx", "translate", "eval-demo")
                 if cmd != "eval-demo" or key in ("dotdot", "absolute", "symlink-out", "etc-passwd")]
TOKNAME_CASES += [pytest.param("dotdot", cmd, id=f"dotdot/{cmd}") for cmd in ("verify", "translate-demo")]


def tokenizer_named(case: Case, key: str, base: str) -> Path:
    """A checkpoint naming its tokenizer `key`, beside a valid tokenizer one directory up (where ../ leads)."""
    value = TOKENIZER_NAMES[key]
    if isinstance(value, str):
        value = value.replace("@FX@", str(case.fx.fx))
    ck = case.copy_ck(case.fx.forged(f"tokname-{key}-{base}", base,
                                     forge.top(tokenizer={"source": value, "target": value})))
    src = case.fx.tiny_ck() if base == "tiny" else case.fx.demo_ck()
    case.text("outside/tokenizer.json", (src / "tokenizer.json").read_bytes())
    case.input(case.p("outside"))
    if key == "symlink-out":
        os.symlink("../outside/tokenizer.json", ck.parent / "link.json")
    if key == "subdir":
        (ck.parent / "sub").mkdir()
        shutil.copyfile(src / "tokenizer.json", ck.parent / "sub" / "tokenizer.json")
    return ck


@pytest.mark.parametrize("key,command", TOKNAME_CASES)
def test_ckpt_tokenizer(case: Case, key: str, command: str) -> None:
    base = "demo" if command in ("eval-demo", "translate-demo") else "tiny"
    r = checkpoint_run(case, command, tokenizer_named(case, key, base))
    if key == "subdir":  # inside the directory: refusing or reading it are both fine
        assert_ok_or_refused(r)
    else:
        assert_refused(r, "read a tokenizer outside the checkpoint's directory")


def test_ckpt_tokenizer_source_only_dotdot(case: Case) -> None:
    ck = case.copy_ck(case.fx.forged("tokname-src-only-dotdot-tiny", "tiny",
                                     lambda ck: ck["tokenizer"].update(source="../outside/tokenizer.json")))
    case.text("outside/tokenizer.json", (case.fx.tiny_ck() / "tokenizer.json").read_bytes())
    assert_refused(case.run("tfm-run", "translate", "--model", ck, TINY_SENT), "read ../outside/tokenizer.json")


@pytest.mark.parametrize("command", ["onnx", "translate"])
def test_ckpt_pickle_payload(case: Case, command: str) -> None:
    pwned = case.fx.fx / "PWNED"
    ck = case.copy_ck(case.fx.forged("pickle-payload", "tiny", forge.top(evil=forge.Payload(f"touch {pwned}"))))
    r = checkpoint_run(case, command, ck)
    if pwned.exists():
        pwned.unlink()
        raise WroteOutside("the pickle's payload ran (PWNED created)", r)
    assert_refused(r)


@pytest.mark.parametrize("command", ["onnx", "translate"])
def test_ckpt_tokenizer_file_linked_outside(case: Case, command: str) -> None:
    ck = case.copy_ck(case.fx.tiny_ck())
    copy = case.text("outside/tokenizer.json", (ck.parent / "tokenizer.json").read_bytes())
    (ck.parent / "tokenizer.json").unlink()
    os.symlink(copy, ck.parent / "tokenizer.json")
    assert_refused(checkpoint_run(case, command, ck), "followed tokenizer.json out of the checkpoint's directory")


# -- file names in manifests ------------------------------------------------------------------------

MANIFEST_FILE_FIELDS = {
    "encoder": ("graphs.encoder.file", "encoder.onnx"),
    "decoder": ("graphs.decoder_step.file", "decoder_step.onnx"),
    "tok-source": ("tokenizer.source", "tokenizer.json"),
    "tok-both": ("tokenizer.*", "tokenizer.json"),
}
MANIFEST_BAD_NAMES = ("dotdot", "absolute", "symlink-out", "symlink-abs", "subdir", "hardlink-inside")
MANIFEST_NAME_CASES = [pytest.param(f, bad, "translate", id=f"{f}-{bad}/translate")
                       for f in MANIFEST_FILE_FIELDS for bad in MANIFEST_BAD_NAMES]
MANIFEST_NAME_CASES += [pytest.param(f, bad, reader, id=f"{f}-{bad}/{reader}")
                        for reader in ("inspect", "check", "quantize", "verify", "bench", "trt")
                        for f, bad in (("encoder", "symlink-out"), ("tok-both", "dotdot"))]


def manifest_naming(case: Case, field_key: str, bad: str) -> Path:
    """A copy of the tiny model whose manifest names a file by `bad`, a valid copy of it waiting outside."""
    m = case.copy_model(case.fx.tiny())
    dotted, fname = MANIFEST_FILE_FIELDS[field_key]
    outside = case.p("outside")
    outside.mkdir()
    shutil.copyfile(m / fname, outside / fname)  # a valid copy, so following the name would "work"
    case.input(outside)
    value = {"dotdot": f"../outside/{fname}", "absolute": str(outside / fname), "symlink-out": f"link-{fname}",
             "symlink-abs": f"abslink-{fname}", "subdir": f"sub/{fname}", "hardlink-inside": f"hard-{fname}"}[bad]
    if bad == "symlink-out":
        os.symlink(f"../outside/{fname}", m / value)
    elif bad == "symlink-abs":
        os.symlink(outside / fname, m / value)
    elif bad == "subdir":
        (m / "sub").mkdir()
        shutil.copyfile(m / fname, m / value)
    elif bad == "hardlink-inside":
        os.link(m / fname, m / value)
    if dotted == "tokenizer.*":
        forge.edit_manifest(m, lambda man: man.update(tokenizer={"source": value, "target": value}))
    else:
        forge.edit_manifest(m, lambda man: forge.set_dotted(man, dotted, value))
    forge.rehash(m)
    return m


@pytest.mark.parametrize("field_key,bad,reader", MANIFEST_NAME_CASES)
def test_manifest_file_name(case: Case, field_key: str, bad: str, reader: str) -> None:
    r = reader_run(case, reader, manifest_naming(case, field_key, bad))
    if bad in ("subdir", "hardlink-inside"):  # still inside the directory: either answer is fine
        assert_ok_or_refused(r)
    else:
        assert_refused(r, f"followed a manifest name ({bad}) out of the model directory")


# -- files changed with the manifest unchanged: integrity on every read ------------------------------

TAMPER_CASES = [pytest.param(target, reader, id=f"{target}/{reader}")
                for target in ("tokenizer", "encoder", "decoder", "extdata")
                for reader in ("translate", "inspect", "check", "quantize", "verify", "bench", "trt", "eval-demo")
                if reader != "eval-demo" or target == "tokenizer"]


def tampered(case: Case, target: str, demo: bool) -> Path:
    """A copy of a model with one file changed and the manifest left as it was."""
    if target == "extdata":
        m = case.copy_model(case.fx.graphs()["extdata"])
        data = m / "encoder.onnx.data"
        data.write_bytes(bytes(data.stat().st_size))  # zeroed weights, same size
    elif target == "tokenizer":
        m = case.copy_model(case.fx.demo() if demo else case.fx.tiny())
        forge.swap_tokens(m / forge.load_manifest(m)["tokenizer"]["source"])
    else:
        m = case.copy_model(case.fx.tiny())
        g = "encoder.onnx" if target == "encoder" else "decoder_step.onnx"
        shutil.copyfile(case.fx.graphs()[g], m / g)
    return m


@pytest.mark.parametrize("target,reader", TAMPER_CASES)
def test_tampered(case: Case, target: str, reader: str) -> None:
    demo = reader == "eval-demo" or (reader == "translate" and target == "tokenizer")
    m = tampered(case, target, demo)
    if reader == "translate" and demo:
        r = case.run("tfm-run", "translate", "--model", m, DEMO_SRC)
    else:
        r = reader_run(case, reader, m)
    assert_refused(r, f"{target} changed but the manifest not")


def test_extdata_untampered_control(case: Case) -> None:
    m = case.copy_model(case.fx.graphs()["extdata"])
    ref = case.fx.tiny_ref()
    assert_ok(case.run("tfm-run", "translate", "--model", m, TINY_SENT), same_output(ref))


LINK_SWAP_CASES = [pytest.param(target, reader, id=f"{target}/{reader}")
                   for target in ("tokenizer", "encoder", "decoder")
                   for reader in ("translate", "inspect", "check", "quantize")]


@pytest.mark.parametrize("target,reader", LINK_SWAP_CASES)
def test_model_file_linked_outside(case: Case, target: str, reader: str) -> None:
    """A file replaced by a link to an identical copy outside: the manifest still matches byte for byte, only
    containment can refuse it."""
    m = case.copy_model(case.fx.tiny())
    name = {"tokenizer": "tokenizer.json", "encoder": "encoder.onnx", "decoder": "decoder_step.onnx"}[target]
    copy = case.text(f"outside/{name}", (m / name).read_bytes())
    (m / name).unlink()
    os.symlink(copy, m / name)
    assert_refused(reader_run(case, reader, m), f"{name} is a link out of the directory")


# -- links planted at the names a writer might stage its output under ------------------------------

PLANTED_CASES = [pytest.param(w, to_dir, False, id=f"to-{'dirs' if to_dir else 'files'}/{w}")
                 for w in WRITERS for to_dir in (False, True)]
PLANTED_CASES += [pytest.param(w, False, True, id=f"inside-old-output-force/{w}") for w in ("onnx", "quantize")]


def plant(case: Case, folder: Path, names: list[str], to_dir: bool) -> list[tuple[Path, str]]:
    """Links at `names` in folder, each to a decoy file or a directory holding one."""
    links = []
    for name in names:
        i = len(case.decoys)
        if to_dir:
            target = case.p(f"decoydir{i}")
            target.mkdir()
            case.decoy(target / "keep.txt")
        else:
            target = case.decoy(case.p(f"decoy{i}.txt"))
        os.symlink(target, folder / name)
        links.append((folder / name, str(target)))
    return links


def guess_names(name: str) -> list[str]:
    return [f".{name}.partial", f".{name}.tmp", f".{name}.old", f"{name}.tmp", f"{name}.partial", f".{name}.lock",
            f".{name}.1.partial", f".{name}.99999999.x.partial", f".{name}.old.x", f".{name}.old-1", f"{name}~",
            f".{name}.swp"]


@pytest.mark.parametrize("writer,to_dir,inside_old", PLANTED_CASES)
def test_planted_links(case: Case, writer: str, to_dir: bool, inside_old: bool) -> None:
    """Links at every guessable temporary name beside the output (and inside it, for writers that fill an existing
    directory); inside_old: an existing model directory with links inside is replaced with --force."""
    name, inner = writer_out_names(writer)
    out = case.p(name)
    links = plant(case, case.dir, guess_names(name), to_dir)
    extra: tuple = ()
    if inside_old or (inner and writer not in ("onnx", "quantize")):  # onnx and quantize make their directory
        if inside_old:
            shutil.copytree(case.fx.tiny() if writer == "onnx" else case.fx.int8(), out)
            extra = ("--force",)
        else:
            out.mkdir()
        for n in inner:
            links += plant(case, out, guess_names(n)[:4], to_dir)
    case.output(out)
    if assert_ok_or_refused(writer_run(case, writer, out, extra)) != "ok":
        return
    for link, target in links:
        if inside_old and under(str(link), [str(out)]):
            continue  # replaced with the old directory
        if not link.is_symlink() or os.readlink(link) != target:
            raise WroteOutside(f"planted link {link.name} replaced or removed")
    for n in inner:
        if n in ("manifest.json", "ckpt.pt") and not (out / n).is_file():
            raise SilentWrong(f"{n} not written")


# -- outputs that are devices, pipes or links -------------------------------------------------------

SPECIAL_OUTPUT_CASES = [pytest.param(kind, w, id=f"{kind}/{w}") for w in ("translate", "bench-json", "bench-markdown")
                        for kind in ("devnull", "devfull", "fifo", "symlink-file", "devstdout")]
SPECIAL_OUTPUT_CASES += [pytest.param(kind, w, id=f"{kind}/{w}")
                         for w in ("onnx", "quantize", "random-checkpoint", "verify-report")
                         for kind in ("devnull", "devfull", "fifo", "symlink-file")]


@pytest.mark.parametrize("kind,writer", SPECIAL_OUTPUT_CASES)
def test_special_output(case: Case, kind: str, writer: str) -> None:
    """A device is written in place, a FIFO fed, a link to a file written through; directory writers refuse."""
    name, inner = writer_out_names(writer)
    is_dir = bool(inner)
    box, decoy = None, case.p("real-" + name)
    if kind in ("devnull", "devfull", "devstdout"):
        out = Path("/dev/" + kind[3:])
    elif kind == "fifo":
        out = case.p(name)
        os.mkfifo(out)
        case.input(out)  # must stay a FIFO
        box = case.fifo_reader(out)
    else:  # symlink-file
        decoy.write_bytes(b"old content\n")
        out = case.p(name)
        os.symlink(decoy, out)
        if is_dir:
            case.decoys.append(str(decoy))
        else:
            case.output(decoy)
            case.input(out)
    r = writer_run(case, writer, out)
    got = case.release_fifo(box) if box else None
    if is_dir or kind == "devfull":
        assert_refused(r, f"a directory writer accepted {kind}" if is_dir else "wrote to a full device")
    elif kind == "fifo":
        assert_ok_or_refused(r, lambda r: None if got else "nothing arrived through the FIFO")
    elif kind == "symlink-file":
        assert_ok_or_refused(r, lambda r: written_through(out, decoy))
    elif kind == "devstdout":
        assert_ok_or_refused(r, lambda r: None if r.out.strip() else "nothing on stdout")
    else:
        assert_ok_or_refused(r)


def written_through(link: Path, target: Path) -> str | None:
    if not link.is_symlink():
        return "the link was replaced instead of written through"
    content = target.read_bytes()
    return "link target not written" if content in (b"old content\n", b"") else None


# -- pathological tokenizer regexes -----------------------------------------------------------------

REGEX_CASES = [
    pytest.param(r"(a+)+$", "a" * 50_000 + "!", "translate", id="nested-quantifier/translate"),
    pytest.param(r"(\w|\w\w)*$", "w" * 50_000 + "!", "translate", id="word-alternation/translate"),
    pytest.param(r"((w\d)\s?)*\2$", "w1 " * 20_000 + "!", "translate", id="backref/translate"),
    *[pytest.param(r"(((", "w1", reader, id=f"invalid/{reader}") for reader in ("translate", "check", "quantize")],
]


@pytest.mark.parametrize("pattern,line,reader", REGEX_CASES)
def test_tokenizer_regex(case: Case, pattern: str, line: str, reader: str) -> None:
    m = case.copy_model(case.fx.tiny())
    tok = m / "tokenizer.json"
    data = json.loads(tok.read_text())
    data["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "WhitespaceSplit"}]}
    tok.write_text(json.dumps(data))
    forge.rehash(m)
    if reader == "translate":
        r: Result = case.run("tfm-run", "translate", "--model", m, "--input", case.text("long.txt", line + "\n"),
                             "--truncate")
    else:
        r = reader_run(case, reader, m)
    assert_ok_or_refused(r)
