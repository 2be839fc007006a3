"""Shared by the Hugging Face tests: random models whose decoding stops and bans where it matters, the
repository's own text to train tokenizers on, generate() as the oracle and `tfm-run translate` as the subject."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
from click.testing import CliRunner

from support.common import made_once
from tfm_export.cli.export_cli import main as export_main
from tfm_export.cli.run_cli import main as run_main

CORPUS = Path(__file__).resolve().parents[1] / "data" / "hf_corpus.txt"  # docs, README and tfm_export/core at 308ea99
# lines a tokenizer must get right beside the repository's text: accents, scripts, emoji, odd spaces, special-token
# text, language codes at and away from the start, empty and blank lines
HOSTILE = [
    "", "   ", "\u00c7a co\u00fbte 5 \u20ac, na\u00efve caf\u00e9: d\u00e9j\u00e0 vu",
    "\u6f22\u5b57\u304b\u306a\u4ea4\u3058\u308a\u6587 \U0001f600\U0001f44d\U0001f3fd",
    "e\u0301 vs \u00e9, \ufb01 ligature, \uff26\uff55\uff4c\uff4c", "tab\there  and  double  spaces ",
    "\u00a0non-breaking\u2003em space", "x </s> y <pad> z <unk>", ">>fra<< with a language code",
    ">>fra<<glued", "mid >>fra<< text", "  >>fra<< after spaces", "</s>>>fra<< after a special token",
    "\u00c6\u00d8\u00c5 \u00e6\u00f8\u00e5 \u00df\u1e9e \u0132\u0133\u0152\u0153", "#!@$%^&*()_+{}|:\"<>?",
    "Stra\u00dfe \u00c4rger \u00d6l \u00dcbel", "\u200bzero\u200dwidth",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440", "1234567890 \u00bd \u00b2 \u2462"
]


def retarget_stop(model, outputs: list[tuple[int, ...]], force_eos: bool, keep: tuple[int, ...] = ()) -> None:
    """Name as </s> a token the model generates mid-sentence for about half of `outputs` (a random model rarely
    chooses its configured </s>), and ban its most frequent other token (bad_words_ids, with pad as opus-mt's
    configs have it); force_eos: a configured forced </s> becomes that token too; `keep` (a forced language
    code) is neither. Only ids change, no weight."""
    pad, start = model.config.pad_token_id, model.generation_config.decoder_start_token_id
    skip = {pad, start, *keep}
    longest = max(map(len, outputs))
    early = {token: sum(0 < row.index(token) < longest - 1 for row in outputs if token in row)
             for token in {t for row in outputs for t in row} - skip}
    eos = max(sorted(early), key=lambda t: min(early[t], len(outputs) - early[t]))
    frequent = Counter(t for row in outputs for t in row if t not in {*skip, eos}).most_common(1)[0][0]
    model.generation_config.bad_words_ids = [[pad], [frequent]]
    model.config.eos_token_id = model.generation_config.eos_token_id = eos
    if force_eos and model.generation_config.forced_eos_token_id is not None:
        model.config.forced_eos_token_id = model.generation_config.forced_eos_token_id = eos


def repository_lines() -> list[str]:
    """Lines of the repository's own prose and code (>= 500 of them), as they are: its docs, README and core code,
    frozen in CORPUS so that editing them does not change the tokenizers and random models the tests build."""
    return CORPUS.read_text(encoding="utf-8").split("\n")


def sample_texts() -> list[str]:
    """50 distinct non-empty inputs of varied length."""
    lines = list(dict.fromkeys(t.strip() for t in repository_lines() if 3 < len(t.strip()) < 60))
    return lines[::max(1, len(lines) // 50)][:50]


def randomize(model, spread: float):
    """Weights large enough that outputs depend on the input; norm gains near 1; fixed position tables kept
    (seed torch before building the model)."""
    with torch.no_grad():
        for key, tensor in model.state_dict().items():
            if "norm" in key and key.endswith("weight"):
                tensor.copy_(1 + torch.randn_like(tensor) * 0.1)
            elif "embed_positions" not in key:
                tensor.normal_(0, spread / tensor.shape[-1] ** 0.5 if tensor.dim() > 1 else 0.1)
    return model.eval()


def generate(transformers, directory: Path, texts: list[str], source_lang: str | None = None,
             **options) -> list[tuple[int, ...]]:
    """generate() on the Hugging Face tokenizer's ids (from `source_lang` where given), each output without
    the decoder start and cut at its first </s> (exclusive)."""
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(directory).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    if source_lang is not None:
        tokenizer.src_lang = source_lang
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, **options)
    eos = options.get("eos_token_id", model.generation_config.eos_token_id)
    return [tuple(row[:row.index(eos)] if eos in row else row) for row in out[:, 1:].tolist()]


def translate(model: Path, texts: list[str], *options: str) -> list[tuple[int, ...]]:
    """`tfm-run translate --format jsonl`'s ids, which must succeed."""
    result = CliRunner().invoke(run_main, ["translate", "--model", str(model), "--format", "jsonl", *options, *texts])
    assert result.exit_code == 0, result.output
    return [tuple(json.loads(line)["ids"]) for line in result.stdout.splitlines()]


def export_onnx(directory: Path, output: Path) -> Path:
    """`tfm-export onnx` of a Hugging Face directory, which must succeed."""
    result = CliRunner().invoke(export_main, ["onnx", "--checkpoint", str(directory), "--output", str(output)])
    assert result.exit_code == 0, result.output
    return output


def made_and_exported(tmp_path_factory, name: str, save: Callable[[Path], Path]) -> tuple[Path, Path]:
    """(Hugging Face directory, its export), made once per test run for every file that builds the same
    seeded model (made_once): the model builders are deterministic, and the tests only read both."""
    def make(root: Path) -> None:
        (root / "hf").mkdir(parents=True)
        export_onnx(save(root / "hf"), root / "onnx")
    root = made_once(tmp_path_factory, f"hf-{name}", make)
    return root / "hf", root / "onnx"
