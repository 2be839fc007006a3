"""Shared by the Hugging Face tests: ids that make a random model's decoding stop and ban where it matters."""

from __future__ import annotations

from collections import Counter


def retarget_stop(model, outputs: list[tuple[int, ...]], force_eos: bool) -> None:
    """Name as </s> a token the model generates mid-sentence for about half of `outputs` (a random model rarely
    chooses its configured </s>), and ban its most frequent other token (bad_words_ids, with pad as opus-mt's
    configs have it); force_eos: a configured forced </s> becomes that token too. Only ids change, no weight."""
    pad, start = model.config.pad_token_id, model.generation_config.decoder_start_token_id
    longest = max(map(len, outputs))
    early = {token: sum(0 < row.index(token) < longest - 1 for row in outputs if token in row)
             for token in {t for row in outputs for t in row} - {pad, start}}
    eos = max(sorted(early), key=lambda t: min(early[t], len(outputs) - early[t]))
    frequent = Counter(t for row in outputs for t in row if t not in (pad, start, eos)).most_common(1)[0][0]
    model.generation_config.bad_words_ids = [[pad], [frequent]]
    model.config.eos_token_id = model.generation_config.eos_token_id = eos
    if force_eos and model.generation_config.forced_eos_token_id is not None:
        model.config.forced_eos_token_id = model.generation_config.forced_eos_token_id = eos
