"""A random M2M100 directory shaped like NLLB-200 1.3B, its weights in sharded safetensors, for the scale benchmark.

NLLB-200 1.3B's sizes (d_model 1024, 24 + 24 layers, 16 heads, FFN 8192, 256,206 tokens, sinusoid positions at
offset 2, pre-norm with final norms, tied embeddings scaled by sqrt(d_model)) in transformers' M2M100 classes, with
random weights (normal, 1/sqrt(fan-in)) and real tokenizer files: a SentencePiece BPE model trained on the
repository's own text and a vocab.json filled to the published vocabulary size, whose filler pieces are never
produced. `save_pretrained` writes the weights as model-0000N-of-0000M.safetensors shards of --shard-size, so that
`tfm-export onnx` reads a directory as it reads a downloaded large model: nothing fetched, nothing but local files.

    python -m tfm_export.benchmarks.m2m100_shape --output build/scale/nllb-like-1.3b
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its docs and sources train the tokenizers
VOCAB_SIZE = 256206  # NLLB-200's
LANGUAGE_CODES = 108  # M2M100Tokenizer's table ends with its 100 language codes and 8 made-up words
SIZES = dict(d_model=1024, encoder_layers=24, decoder_layers=24, encoder_attention_heads=16,
             decoder_attention_heads=16, encoder_ffn_dim=8192, decoder_ffn_dim=8192, max_position_embeddings=1024,
             scale_embedding=True, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)


def _lines() -> list[str]:
    files = sorted(ROOT.glob("docs/*.md")) + [ROOT / "README.md"] + sorted(ROOT.glob("tfm_export/**/*.py"))
    return [t for f in files for t in f.read_text(encoding="utf-8").split("\n") if t.strip()]


def tokenizer(output: Path) -> int:
    """M2M100Tokenizer files in `output` (a BPE SentencePiece model, vocab.json of VOCAB_SIZE - LANGUAGE_CODES
    pieces, fairseq's specials first); returns the model's vocabulary size."""
    import sentencepiece as spm
    with tempfile.TemporaryDirectory() as work:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(_lines()), model_prefix=f"{work}/bpe", vocab_size=4000,
                                       model_type="bpe", minloglevel=2)
        pieces = spm.SentencePieceProcessor(model_file=f"{work}/bpe.model")
        vocab = dict.fromkeys(["<s>", "<pad>", "</s>", "<unk>",
                               *(pieces.id_to_piece(i) for i in range(pieces.get_piece_size()))])
        for i in range(VOCAB_SIZE - LANGUAGE_CODES - len(vocab)):
            vocab[f"\u2581filler{i}"] = None
        (Path(work) / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}, ensure_ascii=False))
        made = transformers.M2M100Tokenizer(vocab_file=f"{work}/vocab.json", spm_file=f"{work}/bpe.model",
                                            src_lang="en", tgt_lang="fr")
        made.save_pretrained(output)
    return max([len(made), *(i + 9 for i in made.lang_token_to_id.values())])


def random_m2m100(output: Path, vocab_size: int, shard_size: str, **sizes: int) -> None:
    torch.manual_seed(0)
    config = transformers.M2M100Config(**{**SIZES, **sizes}, vocab_size=vocab_size)
    with torch.device("meta"):
        model = transformers.M2M100ForConditionalGeneration(config)
    model = model.to_empty(device="cpu").eval()  # no init pass over 1.37B parameters: filled once, below
    with torch.no_grad():
        for key, tensor in model.state_dict().items():
            if "embed_positions" in key:
                continue
            if tensor.dim() > 1:
                tensor.normal_(0, 1.0 / tensor.shape[-1] ** 0.5)
            elif key.endswith(("layer_norm.weight", "layernorm_embedding.weight")):
                tensor.fill_(1.0)
            else:
                tensor.zero_()
        model.model.encoder.embed_positions.weights = model.model.encoder.embed_positions.get_embedding(
            config.max_position_embeddings + 2, config.d_model, config.pad_token_id)
        model.model.decoder.embed_positions.weights = model.model.encoder.embed_positions.weights
        model.get_input_embeddings().weight[config.pad_token_id] = 0
    model.tie_weights()
    model.generation_config.update(max_length=200, num_beams=4)
    model.save_pretrained(output, max_shard_size=shard_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--shard-size", default="2GB", help="save_pretrained's max_shard_size")
    parser.add_argument("--layers", type=int, default=SIZES["encoder_layers"], help="encoder and decoder each")
    parser.add_argument("--d-model", type=int, default=SIZES["d_model"])
    parser.add_argument("--ffn", type=int, default=SIZES["encoder_ffn_dim"])
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    random_m2m100(args.output, tokenizer(args.output), args.shard_size, d_model=args.d_model,
                  encoder_layers=args.layers, decoder_layers=args.layers, encoder_ffn_dim=args.ffn,
                  decoder_ffn_dim=args.ffn)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
