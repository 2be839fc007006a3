"""transformers' own generate() as the decoding oracle for models exported from a Hugging Face directory.

The reference decoders follow the seed's ids and beam rule; a pretrained model's users expect what generate()
gives, so `verify` compares the exported graphs' decoding (under the model's token_rules) with generate() itself,
run on the same source ids with the same rules spelled out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..core.extras import require_extra
from ..core.token_rules import TokenRules


class HfGenerate:
    """generate() of the model in `directory`, loaded once; nothing is downloaded."""

    def __init__(self, directory: Path) -> None:
        require_extra("hf", f"verifying {directory} against transformers' generate()")
        from transformers import AutoModelForSeq2SeqLM
        self.model = AutoModelForSeq2SeqLM.from_pretrained(str(directory), local_files_only=True).eval()

    def __call__(self, src: np.ndarray, rules: TokenRules, beam_size: int, max_length: int,
                 length_penalty: float) -> list[tuple[int, ...]]:
        """Generated ids per row (without the decoder start, cut before the first </s>)."""
        ids = torch.from_numpy(src)
        options = dict(num_beams=beam_size, do_sample=False, max_length=max_length + 1, length_penalty=length_penalty,
                       early_stopping=rules.early_stopping, decoder_start_token_id=rules.start,
                       eos_token_id=rules.eos, pad_token_id=rules.pad, forced_bos_token_id=rules.forced_bos,
                       forced_eos_token_id=rules.forced_eos, bad_words_ids=[[t] for t in rules.banned] or None,
                       min_length=0, no_repeat_ngram_size=0, repetition_penalty=1.0)
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=(ids != rules.pad).long(), **options)
        rows = out[:, 1:].tolist()
        return [tuple(row[:row.index(rules.eos)] if rules.eos in row else row) for row in rows]
