"""Translate stdin, one line per line, with Optimum's ORTModelForSeq2SeqLM on a directory written by `tfm-export hf`
(local files only).
Usage: python translate.py DIR [--beams N] [--length-penalty X] [--suffix _quantized] [--ids] < lines
--ids prints each translation's generated token ids (after the decoder's start token, </s> included) instead."""

import argparse
import sys

from optimum.onnxruntime import ORTModelForSeq2SeqLM
from transformers import AutoTokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model")
    parser.add_argument("--beams", type=int, default=None, help="default: the directory's generation_config.json")
    parser.add_argument("--suffix", default="", help="the graphs' precision suffix: '' (fp32), _fp16, _quantized")
    parser.add_argument("--length-penalty", type=float, default=None,
                        help="default: the directory's generation_config.json")
    parser.add_argument("--ids", action="store_true", help="print generated token ids instead of text")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    model = ORTModelForSeq2SeqLM.from_pretrained(
        args.model, subfolder="onnx", local_files_only=True,
        encoder_file_name=f"encoder_model{args.suffix}.onnx",
        decoder_file_name=f"decoder_model_merged{args.suffix}.onnx")
    for line in sys.stdin.read().splitlines():
        ids = model.generate(**tokenizer([line], return_tensors="pt"),
                             **({"num_beams": args.beams} if args.beams else {}),
                             **({"length_penalty": args.length_penalty} if args.length_penalty is not None else {}))
        text = tokenizer.decode(ids[0], skip_special_tokens=True)
        print(" ".join(map(str, ids[0, 1:].tolist())) if args.ids else text)


if __name__ == "__main__":
    main()
