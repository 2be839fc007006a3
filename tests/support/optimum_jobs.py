"""Run in Optimum's venv (it imports neither tfm_export nor pytest): every job the Optimum tests ask for, in one
process, so that torch, transformers and Optimum are imported once. Reads a JSON list of jobs on stdin,
{"model", "suffix", "texts", "generate": {generate()'s keyword arguments}}, and prints, per job and text, its
generated ids after the decoder's start token and their text, as JSON. Loads as examples/optimum/translate.py does."""

import json
import sys

from optimum.onnxruntime import ORTModelForSeq2SeqLM
from transformers import AutoTokenizer


def run(job: dict) -> list[tuple[list[int], str]]:
    tokenizer = AutoTokenizer.from_pretrained(job["model"], local_files_only=True)
    model = ORTModelForSeq2SeqLM.from_pretrained(
        job["model"], subfolder="onnx", local_files_only=True,
        encoder_file_name=f"encoder_model{job['suffix']}.onnx",
        decoder_file_name=f"decoder_model_merged{job['suffix']}.onnx")
    out = [model.generate(**tokenizer([text], return_tensors="pt"), **job["generate"])[0] for text in job["texts"]]
    return [(ids[1:].tolist(), tokenizer.decode(ids, skip_special_tokens=True)) for ids in out]


if __name__ == "__main__":
    print(json.dumps([run(job) for job in json.load(sys.stdin)]))
