"""Text <-> ids with the `tokenizers` library, in the seed's special-token layout.

Two sources: a `tokenizers` JSON file (what the project saves and ships), or a plain vocabulary
(JSON list, JSON token->id dict, or one token per line) as the seed's users have; a plain
vocabulary becomes a WordLevel tokenizer that splits on whitespace and maps unknown words to <unk>.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from .errors import VocabularyError

UNK, PAD, BOS, EOS = "<unk>", "<blank>", "<s>", "</s>"
SPECIAL_TOKENS = (UNK, PAD, BOS, EOS)  # ids 0, 1, 2, 3 as in the seed's vocabularies
UNK_ID, PAD_ID, BOS_ID, EOS_ID = range(4)
FIRST_TOKEN_ID = len(SPECIAL_TOKENS)  # the first ordinary (non-special) token id
TOKENIZER_FILE = "tokenizer.json"


def tokenizer_files(shared: bool) -> dict[str, str]:
    """File names of the source and target tokenizers in a checkpoint folder or model directory."""
    if shared:
        return {"source": TOKENIZER_FILE, "target": TOKENIZER_FILE}
    return {"source": "source_" + TOKENIZER_FILE, "target": "target_" + TOKENIZER_FILE}


class TextTokenizer:
    """A `tokenizers.Tokenizer` whose special tokens sit at the seed's ids."""

    def __init__(self, tokenizer: Tokenizer, origin: str = "<memory>") -> None:
        self.tokenizer, self.origin = tokenizer, origin
        for expected_id, token in enumerate(SPECIAL_TOKENS):
            actual = tokenizer.token_to_id(token)
            if actual != expected_id:
                raise VocabularyError(
                    f"{origin}: special token {token} has id {actual}, expected {expected_id} "
                    f"(the seed layout is {', '.join(f'{t}={i}' for i, t in enumerate(SPECIAL_TOKENS))})")

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without <s>/</s>."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def tokens(self) -> list[str]:
        """Every token, by id (the string interface other toolkits, CTranslate2 among them, take)."""
        return [self.tokenizer.id_to_token(i) for i in range(self.vocab_size)]

    def save(self, path: Path) -> None:
        """The `tokenizers` JSON, with a post-processor that wraps a text in <s> ... </s> as the model's sources
        are, so `encode(text)` in other languages' tokenizer libraries gives the source ids as they are."""
        tok = Tokenizer.from_str(self.tokenizer.to_str())
        tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A {EOS}",
                                                           special_tokens=[(BOS, BOS_ID), (EOS, EOS_ID)])
        tok.save(str(path))


@dataclass(frozen=True)
class Vocabulary:
    """Source and target tokenizers; the same object twice when the vocabulary is shared."""

    source: TextTokenizer
    target: TextTokenizer

    @property
    def shared(self) -> bool:
        return self.source is self.target


def _normalizer(lowercase: bool = False) -> normalizers.Normalizer:
    steps = [normalizers.NFKC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()]
    return normalizers.Sequence(steps + ([normalizers.Lowercase()] if lowercase else []))


def plain_word_tokenizer(tokens: list[str], origin: str) -> TextTokenizer:
    """WordLevel over a given token list: whitespace split, unknown words -> <unk>."""
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        if token in vocab:
            raise VocabularyError(f"{origin}: token {token!r} appears twice (ids {vocab[token]} and {index})")
        vocab[token] = index
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.normalizer = _normalizer()
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return TextTokenizer(tok, origin)


def train_word_tokenizer(corpus: Iterable[str], lowercase: bool = True) -> TextTokenizer:
    """A WordLevel tokenizer that round-trips text exactly: words keep a leading '▁' and
    '-' and ',' are tokens of their own, so 'quatre-vingt-dix' shares pieces with 'dix'."""
    tok = Tokenizer(models.WordLevel(unk_token=UNK))
    tok.normalizer = _normalizer(lowercase)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
        pre_tokenizers.Split(Regex("[-,]"), behavior="isolated"),
    ])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=list(SPECIAL_TOKENS)))
    return TextTokenizer(tok, "<trained>")


def _tokens_from_json(data: object, origin: str) -> list[str]:
    if isinstance(data, list) and all(isinstance(t, str) for t in data):
        return data
    if isinstance(data, dict) and all(isinstance(i, int) for i in data.values()):
        by_id = sorted(data.items(), key=lambda item: item[1])
        if [i for _, i in by_id] != list(range(len(by_id))):
            raise VocabularyError(f"{origin}: token ids must be 0..{len(by_id) - 1} without gaps")
        return [token for token, _ in by_id]
    raise VocabularyError(f"{origin}: expected a JSON list of tokens or a token->id object")


def load_tokenizer(path: str | Path) -> TextTokenizer:
    """Read a `tokenizers` JSON file or a plain vocabulary file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise VocabularyError(f"{path}: vocabulary file not found; pass --vocab with the "
                              "model's tokenizer.json or vocabulary list") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise VocabularyError(f"{path}: cannot read vocabulary ({exc})") from None
    if not text.strip():
        raise VocabularyError(f"{path}: vocabulary file is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return plain_word_tokenizer([line.strip() for line in text.split("\n") if line.strip()], str(path))
    if isinstance(data, dict) and "model" in data:  # a `tokenizers` JSON file
        try:
            return TextTokenizer(Tokenizer.from_str(text), str(path))
        except Exception as exc:  # the Rust side raises plain Exception
            raise VocabularyError(f"{path}: not a valid tokenizers JSON file ({exc})") from None
    return plain_word_tokenizer(_tokens_from_json(data, str(path)), str(path))
