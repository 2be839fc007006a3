"""A random Marian directory shaped like a published opus-mt model, for benchmarks without downloads.

opus-mt-en-de's sizes (d_model 512, 6 + 6 layers, 8 heads, FFN 2048, Swish, sinusoid positions, 58,101 tokens,
tied embeddings, final_logits_bias, pad as decoder start and banned), random weights with the pad row zero as
training leaves it, and real tokenizer files: source.spm and target.spm trained on the repository's own text,
vocab.json filled to the published vocabulary size (the filler pieces are never produced, as the target pieces of
a joint vocabulary are not). What `save_pretrained` writes plus the tokenizer files: `tfm-export onnx` and
`tfm-run bench` take the directory as they take a downloaded one.

    python -m tfm_export.benchmarks.marian_shape --output build/bench/opus-like
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its docs and sources train the tokenizers
VOCAB_SIZE = 58101  # opus-mt-en-de's
SIZES = dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
             encoder_ffn_dim=2048, decoder_ffn_dim=2048, max_position_embeddings=512, activation_function="swish",
             scale_embedding=True, static_position_embeddings=True)


def _lines() -> list[str]:
    files = sorted(ROOT.glob("docs/*.md")) + [ROOT / "README.md"] + sorted(ROOT.glob("tfm_export/**/*.py"))
    return [t for f in files for t in f.read_text(encoding="utf-8").split("\n") if t.strip()]


def _tokenizer(output: Path) -> int:
    """source.spm and target.spm (unigram, </s> 0, <unk> 1) and a vocab.json of VOCAB_SIZE - 1 pieces; returns
    the id of <pad>, the last, as MarianTokenizer adds it."""
    import sentencepiece as spm  # here only: random_marian serves machines without it (scripts/gpu_check.py)
    lines = _lines()
    for name, text in (("source", lines[::2]), ("target", lines[1::2])):
        spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_prefix=str(output / name),
                                       vocab_size=4000, model_type="unigram", character_coverage=0.9995,
                                       unk_id=1, eos_id=0, bos_id=-1, pad_id=-1, minloglevel=2)
        (output / f"{name}.model").rename(output / f"{name}.spm")
        (output / f"{name}.vocab").unlink()
    vocab: dict[str, int] = {}
    for name in ("source.spm", "target.spm"):
        sp = spm.SentencePieceProcessor(model_file=str(output / name))
        for piece in ["</s>", "<unk>"] + [sp.id_to_piece(i) for i in range(sp.get_piece_size())]:
            vocab.setdefault(piece, len(vocab))
    for i in range(VOCAB_SIZE - 1 - len(vocab)):
        vocab[f"\u2581filler{i}"] = len(vocab)
    vocab["<pad>"] = len(vocab)
    (output / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (output / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "MarianTokenizer"}))
    return vocab["<pad>"]


def random_marian(output: Path, vocab_size: int, pad: int, **sizes: int | str | bool) -> None:
    """A Marian model of opus-mt's shape (SIZES, overridden by `sizes`) with random weights, the pad row zero as
    training leaves it, and opus-mt's generation config (pad as decoder start and banned, beam 4), saved in
    `output` (tokenizer files are the caller's)."""
    torch.manual_seed(0)
    config = transformers.MarianConfig(**{**SIZES, **sizes}, vocab_size=vocab_size, pad_token_id=pad,
                                       decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0)
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        for key, tensor in model.state_dict().items():
            if "embed_positions" not in key and tensor.dim() > 1:
                tensor.normal_(0, 1.0 / tensor.shape[-1] ** 0.5)
        model.get_input_embeddings().weight[pad] = 0
    model.generation_config.update(bad_words_ids=[[pad]], max_length=config.max_position_embeddings, num_beams=4)
    model.save_pretrained(output)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    random_marian(args.output, VOCAB_SIZE, _tokenizer(args.output))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
