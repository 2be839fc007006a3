"""Tokenizers: the seed's special ids, plain vocabularies, exact round trips, clear errors."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from tfm_export.core.errors import VocabularyError
from tfm_export.core.tokenizer import SPECIAL_TOKENS, load_tokenizer, train_word_tokenizer
from tfm_export.demo.numbers import corpus_for_vocabulary, english, french


@pytest.fixture(scope="module")
def demo_tok():
    return train_word_tokenizer(corpus_for_vocabulary())


def test_special_tokens_have_seed_ids(demo_tok):
    assert [demo_tok.tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]


@pytest.mark.parametrize("text", ["forty-two", "quatre-vingt-dix", "  Forty-Two ", "unknown words", ""])
def test_seed_sources_are_framed_by_bos_2_and_eos_3(demo_tok, tmp_path, text):
    """<s> = 2 and </s> = 3 (the seed's vocabularies) around the text's ids: as framed by this class, by a saved and
    reloaded tokenizer, by a plain vocabulary's, and by the `tokenizers` library reading the saved JSON alone
    (what other languages' bindings do)."""
    demo_tok.save(tmp_path / "tokenizer.json")
    (tmp_path / "vocab.txt").write_text("\n".join(["<unk>", "<blank>", "<s>", "</s>", "forty-two"]))
    for tok in (demo_tok, load_tokenizer(tmp_path / "tokenizer.json"), load_tokenizer(tmp_path / "vocab.txt")):
        plain = tok.encode(text)
        assert plain or not text.strip()
        assert tok.encode(text, framed=True) == [2, *plain, 3], tok.origin
    assert Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode(text).ids == [2, *demo_tok.encode(text), 3]


@pytest.mark.parametrize("n", [0, 21, 71, 80, 200, 1001, 1100, 80000, 371080, 999999])
def test_number_words_round_trip_exactly(demo_tok, n):
    for text in (english(n), french(n)):
        ids = demo_tok.encode(text)
        assert 0 not in ids  # no <unk>
        assert demo_tok.decode(ids) == text


def test_whitespace_and_case_are_normalised(demo_tok):
    assert demo_tok.encode("  Forty-Two ") == demo_tok.encode("forty-two")


def test_saved_tokenizer_reloads_identically(demo_tok, tmp_path):
    demo_tok.save(tmp_path / "tokenizer.json")
    again = load_tokenizer(tmp_path / "tokenizer.json")
    assert again.encode(english(123456)) == demo_tok.encode(english(123456))


def test_plain_vocab_splits_on_whitespace_and_maps_unknowns(tmp_path):
    f = tmp_path / "vocab.json"
    f.write_text(json.dumps(["<unk>", "<blank>", "<s>", "</s>", "ein", "Haus"]))
    tok = load_tokenizer(f)
    assert tok.encode("ein  Haus mehr") == [4, 5, 0]
    assert tok.decode([4, 5, 3]) == "ein Haus"
    assert tok.encode("ein fremdes Wort") == [4, 0, 0]  # unknown words are <unk>


@pytest.mark.parametrize("content, message", [
    ("", "vocabulary file is empty"),
    ('["<s>", "<unk>", "<blank>", "</s>"]', r"special token <unk> has id 1, expected 0"),
    ('["<unk>", "<blank>", "<s>", "x", "</s>"]', r"special token </s> has id 4, expected 3"),
    ('{"<unk>": 0, "<blank>": 1, "<s>": 2, "</s>": 5}', "without gaps"),
    ("<unk>\n<blank>\n<s>\n</s>\nx\nx\n", "token 'x' appears twice"),
    ('{"model": {"type": "Nope"}}', "not a valid tokenizers JSON file"),
    ("[1, 2, 3]", "expected a JSON list of tokens"),
])
def test_bad_vocabularies_are_explained(tmp_path, content, message):
    f = tmp_path / "v.txt"
    f.write_text(content)
    with pytest.raises(VocabularyError, match=message):
        load_tokenizer(f)


def test_missing_vocab_file(tmp_path):
    with pytest.raises(VocabularyError, match="nope.txt: vocabulary file not found; pass --vocab"):
        load_tokenizer(tmp_path / "nope.txt")


def test_a_signal_during_encoding_leaves_stderr_where_it_was(demo_tok):
    """Encoding holds file descriptor 2 for a moment (to catch a Rust panic's message); a Ctrl-C or SIGTERM that
    unwinds at any point of that must leave it pointing at the terminal, or the "interrupted" line is lost. A
    signal at a random moment of a loop of encodes, many times over, lands in every part of it."""
    import os
    import random
    import signal
    import threading

    def unwind(signum, frame):
        raise KeyboardInterrupt  # as the command line's handler does (on SIGUSR1, to leave pytest's SIGINT alone)

    terminal, kept = os.fstat(2), os.dup(2)
    previous = signal.signal(signal.SIGUSR1, unwind)
    moved = 0
    try:
        for _ in range(400):
            timer = threading.Timer(random.uniform(0, 0.002), os.kill, (os.getpid(), signal.SIGUSR1))
            try:
                timer.start()
                while True:
                    demo_tok.encode(english(random.randrange(1000)), framed=True)
            except KeyboardInterrupt:
                pass
            timer.join()
            after = os.fstat(2)
            if (after.st_dev, after.st_ino) != (terminal.st_dev, terminal.st_ino):
                moved += 1
                os.dup2(kept, 2)
    finally:
        signal.signal(signal.SIGUSR1, previous)
        os.close(kept)
    assert moved == 0, f"{moved} of 400 interrupted encodes left stderr redirected"
