"""Run in Optimum's venv (it imports neither tfm_export nor pytest): every job the Optimum tests ask for, in one
process, so that torch, transformers and Optimum are imported once. Reads a JSON list of jobs on stdin,
{"model", "suffix", "texts", "generate": {generate()'s keyword arguments}, and optionally "src_lang" and "tgt_lang"
(language codes as tokens)}, and prints, per job and text, its generated ids after the decoder's start token and
their text, as JSON. Tokenizer and model are loaded by examples/optimum/translate.py's own functions."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "optimum"))
from translate import load, tokenizer_for  # noqa: E402


def run(job: dict) -> list[tuple[list[int], str]]:
    tokenizer = tokenizer_for(job["model"], job.get("src_lang"))
    target = {"forced_bos_token_id": tokenizer.convert_tokens_to_ids(job["tgt_lang"])} if job.get("tgt_lang") else {}
    model = load(job["model"], job["suffix"])
    out = [model.generate(**tokenizer([text], return_tensors="pt"), **job["generate"], **target)[0]
           for text in job["texts"]]
    return [(ids[1:].tolist(), tokenizer.decode(ids, skip_special_tokens=True)) for ids in out]


if __name__ == "__main__":
    print(json.dumps([run(job) for job in json.load(sys.stdin)]))
