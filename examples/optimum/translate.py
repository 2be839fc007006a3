"""Translate stdin, one line per line, with Optimum's ORTModelForSeq2SeqLM on a directory written by `tfm-export hf`
(local files only).
Usage: python translate.py DIR [--beams N] [--length-penalty X] [--suffix _quantized] [--src-lang CODE]
                           [--tgt-lang CODE] [--ids] < lines
--ids prints each translation's generated token ids (after the decoder's start token, </s> included) instead.
A multilingual model (NLLB, M2M100, mBART-50) takes its language codes as tokens: eng_Latn, __en__, en_XX."""

import argparse
import json
import sys
from pathlib import Path

from optimum.onnxruntime import ORTModelForSeq2SeqLM
from transformers import AutoTokenizer, PreTrainedTokenizerFast

# transformers has no fast M2M100 tokenizer, and its slow one needs SentencePiece files the layout does not have:
# read the layout's tokenizer.json as it is (sources framed with the saved default language)
PLAIN = {"M2M100Tokenizer"}


def tokenizer_for(model: str, source: str | None):
    saved = json.loads((Path(model) / "tokenizer_config.json").read_text())
    if saved.get("tokenizer_class") in PLAIN:
        if source:
            sys.exit(f"{model}: --src-lang: transformers reads this tokenizer only as it was saved; drop it")
        return PreTrainedTokenizerFast.from_pretrained(model, local_files_only=True)
    return AutoTokenizer.from_pretrained(model, local_files_only=True, **({"src_lang": source} if source else {}))


def load(model: str, suffix: str = "") -> ORTModelForSeq2SeqLM:
    """The layout's encoder and merged decoder (Optimum finds the pair beside them)."""
    return ORTModelForSeq2SeqLM.from_pretrained(model, subfolder="onnx", local_files_only=True,
                                                encoder_file_name=f"encoder_model{suffix}.onnx",
                                                decoder_file_name=f"decoder_model_merged{suffix}.onnx")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model")
    parser.add_argument("--beams", type=int, default=None, help="default: the directory's generation_config.json")
    parser.add_argument("--suffix", default="", help="the graphs' precision suffix: '' (fp32), _fp16, _quantized")
    parser.add_argument("--length-penalty", type=float, default=None,
                        help="default: the directory's generation_config.json")
    parser.add_argument("--src-lang", default=None, help="source language code (default: the saved one)")
    parser.add_argument("--tgt-lang", default=None, help="target language code, forced as the first token")
    parser.add_argument("--ids", action="store_true", help="print generated token ids instead of text")
    args = parser.parse_args()
    tokenizer = tokenizer_for(args.model, args.src_lang)
    model = load(args.model, args.suffix)
    options = {**({"num_beams": args.beams} if args.beams else {}),
               **({"length_penalty": args.length_penalty} if args.length_penalty is not None else {}),
               **({"forced_bos_token_id": tokenizer.convert_tokens_to_ids(args.tgt_lang)} if args.tgt_lang else {})}
    for line in sys.stdin.read().splitlines():
        ids = model.generate(**tokenizer([line], return_tensors="pt"), **options)
        text = tokenizer.decode(ids[0], skip_special_tokens=True)
        print(" ".join(map(str, ids[0, 1:].tolist())) if args.ids else text)


if __name__ == "__main__":
    main()
