"""Translate stdin, one line per line, with Optimum's ORTModelForSeq2SeqLM on a directory written by `tfm-export hf`
(local files only). Usage: python translate.py DIR [--beams N] [--suffix _quantized] < lines"""

import argparse
import sys

from optimum.onnxruntime import ORTModelForSeq2SeqLM
from transformers import AutoTokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model")
    parser.add_argument("--beams", type=int, default=None, help="default: the directory's generation_config.json")
    parser.add_argument("--suffix", default="", help="the graphs' precision suffix: '' (fp32), _fp16, _quantized")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    model = ORTModelForSeq2SeqLM.from_pretrained(
        args.model, subfolder="onnx", local_files_only=True,
        encoder_file_name=f"encoder_model{args.suffix}.onnx",
        decoder_file_name=f"decoder_model_merged{args.suffix}.onnx")
    for line in sys.stdin.read().splitlines():
        ids = model.generate(**tokenizer([line], return_tensors="pt"),
                             **({"num_beams": args.beams} if args.beams else {}))
        print(tokenizer.decode(ids[0], skip_special_tokens=True))


if __name__ == "__main__":
    main()
