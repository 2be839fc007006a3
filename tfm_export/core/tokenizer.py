"""Text <-> ids with the `tokenizers` library.

Two sources: a `tokenizers` JSON file (what the project saves and ships), or a plain vocabulary
(JSON list, JSON token->id dict, or one token per line) as the seed's users have; a plain
vocabulary becomes a WordLevel tokenizer that splits on whitespace and maps unknown words to <unk>.
Seed-layout tokenizers have their special tokens at fixed ids and frame a source as <s> ... </s>; a
pretrained model's tokenizer keeps its own ids and its own framing (its post-processor).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from .errors import InputTextError, VocabularyError, first_line
from .files import regular_file_size

UNK, PAD, BOS, EOS = "<unk>", "<blank>", "<s>", "</s>"
SPECIAL_TOKENS = (UNK, PAD, BOS, EOS)  # ids 0, 1, 2, 3 as in the seed's vocabularies
UNK_ID, PAD_ID, BOS_ID, EOS_ID = range(4)
SPECIAL_IDS = {"unk": UNK_ID, "pad": PAD_ID, "bos": BOS_ID, "eos": EOS_ID}  # as manifests record them
MAX_VOCABULARY_BYTES = 512 << 20  # the largest real tokenizers JSON files are tens of megabytes
FIRST_TOKEN_ID = len(SPECIAL_TOKENS)  # the first ordinary (non-special) token id
TOKENIZER_FILE = "tokenizer.json"
SENTENCEPIECE_FILE = "sentencepiece.model"  # the source tokenizer's SentencePiece model (manifest key "sentencepiece")
SENTENCEPIECE_INPUTS = ("text", "words")  # what it is given: each text whole, or each word of the tokenizer's rules
REMAKE_TOKENIZER = "export the model again"


@dataclass(frozen=True)
class SentencePieceModel:
    """The SentencePiece model whose segmentation a source tokenizer reproduces, kept for tokenizers outside Python
    (the C++ command reads it with libsentencepiece and maps its pieces to ids through the tokenizer's table).
    whole_text: it takes each text as it comes, with its own normalizer and whitespace rules (the model
    directory's own file); otherwise it segments each word the tokenizer's normalizer and pre-tokenizer give (a
    model written from the tokenizer's Unigram table)."""

    proto: bytes
    whole_text: bool

    def manifest_entry(self) -> dict[str, str]:
        return {"file": SENTENCEPIECE_FILE, "input": SENTENCEPIECE_INPUTS[0 if self.whole_text else 1]}


def tokenizer_files(shared: bool) -> dict[str, str]:
    """File names of the source and target tokenizers in a checkpoint folder or model directory."""
    if shared:
        return {"source": TOKENIZER_FILE, "target": TOKENIZER_FILE}
    return {"source": "source_" + TOKENIZER_FILE, "target": "target_" + TOKENIZER_FILE}


_SINK: list = []  # one temporary file per process, reused


@contextlib.contextmanager
def _native_stderr_held() -> Iterator[None]:
    """Hold what native code writes to file descriptor 2 while it runs: a Rust panic prints its message (and,
    with RUST_BACKTRACE set, a backtrace) there before Python sees the exception. Without an exception the held
    bytes are passed on to stderr; with one they are dropped, the exception says what happened. The swap is
    inside the try that undoes it: a Ctrl-C or SIGTERM unwinding from any line here still leaves stderr where it
    was, so the "interrupted" line that follows reaches the user."""
    if not _SINK:
        _SINK.append(tempfile.TemporaryFile())
    sink = _SINK[0]
    sink.seek(0)
    sink.truncate()
    saved = os.dup(2)
    try:
        os.dup2(sink.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    if sink.tell():
        sink.seek(0)
        os.write(2, sink.read())


SEED_FRAMING = processors.TemplateProcessing(single=f"{BOS} $A {EOS}", special_tokens=[(BOS, BOS_ID), (EOS, EOS_ID)])


def template_codes(post_processor: dict, codes: Collection[str]) -> list[str]:
    """Which of `codes` a post-processor's JSON puts around a single text, in order (none unless a template)."""
    return [piece["SpecialToken"]["id"] for piece in post_processor.get("single", [])
            if piece.get("SpecialToken", {}).get("id") in codes]


class TextTokenizer:
    """A `tokenizers.Tokenizer`: in the seed layout (special tokens at the seed's ids, sources framed <s> ... </s>),
    or, with seed_layout=False, a pretrained model's own (its ids, its post-processor's framing)."""

    def __init__(self, tokenizer: Tokenizer, origin: str = "<memory>", seed_layout: bool = True,
                 sentencepiece: SentencePieceModel | None = None) -> None:
        self.tokenizer, self.origin, self.seed_layout = tokenizer, origin, seed_layout
        self.sentencepiece = sentencepiece
        if not seed_layout:
            return
        for expected_id, token in enumerate(SPECIAL_TOKENS):
            actual = tokenizer.token_to_id(token)
            if actual != expected_id:
                raise VocabularyError(
                    f"{origin}: special token {token} has id {actual}, expected {expected_id} "
                    f"(the seed layout is {', '.join(f'{t}={i}' for i, t in enumerate(SPECIAL_TOKENS))})")
        tokenizer.post_processor = SEED_FRAMING

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, framed: bool = False) -> list[int]:
        """Token ids of `text`; framed: as the model takes a source (<s> ... </s> in the seed layout, the
        post-processor's framing otherwise). A tokenizer whose rules fail on the text (the Rust side panics, e.g.
        a regex past its backtracking limit) is one line about the text, not a crash with a Rust backtrace."""
        try:
            with _native_stderr_held():
                return self.tokenizer.encode(text, add_special_tokens=framed).ids
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 (pyo3's PanicException derives from BaseException)
            raise InputTextError(f"{self.origin}: the tokenizer failed on a {len(text):,}-character text "
                                 f"({first_line(exc, 120)}); shorten or split the text, or fix the tokenizer") \
                from None

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def tokens(self) -> list[str]:
        """Every token, by id (the string interface other toolkits, CTranslate2 among them, take)."""
        return [self.tokenizer.id_to_token(i) for i in range(self.vocab_size)]

    def framing_codes(self, codes: Collection[str]) -> list[str]:
        """Which of `codes` the source framing puts around the text (NLLB's eng_Latn, mBART's en_XX)."""
        return template_codes(self._template(), codes)

    def with_code(self, code: str, codes: Collection[str]) -> TextTokenizer:
        """A copy whose sources are framed with `code`: in place of the framing's code among `codes` if it has
        one, before the text otherwise (>>fra<<). Framing lives in the post-processor, so every library that
        reads the saved JSON frames the same way."""
        code_id = self.tokenizer.token_to_id(code)
        if code_id is None:
            raise VocabularyError(f"{self.origin}: language code {code} is not a token of this tokenizer")
        data = json.loads(self.tokenizer.to_str())
        post = self._template(data)
        entry = {"SpecialToken": {"id": code, "type_id": 0}}
        for side in ("single", "pair"):
            template = post.get(side, [])
            slots = [i for i, p in enumerate(template) if p.get("SpecialToken", {}).get("id") in codes]
            for i in slots:
                template[i] = entry
            if not slots:
                template.insert(0, entry)
        post.setdefault("special_tokens", {})[code] = {"id": code, "ids": [code_id], "tokens": [code]}
        return TextTokenizer(Tokenizer.from_str(json.dumps(data)), self.origin, self.seed_layout)

    def _template(self, data: dict | None = None) -> dict:
        """The post-processor's JSON (of `data`, a whole tokenizer's, in place), which must be a template."""
        post = (data if data is not None else json.loads(self.tokenizer.to_str())).get("post_processor") or {}
        if post.get("type") != "TemplateProcessing":
            raise VocabularyError(f"{self.origin}: the source framing is a {post.get('type', 'missing')} "
                                  "post-processor, not a template; language codes cannot be placed")
        return post

    def save(self, path: Path) -> None:
        """The `tokenizers` JSON with its source framing, so `encode(text)` in other languages' tokenizer
        libraries gives the source ids as they are."""
        self.tokenizer.save(str(path))


@dataclass(frozen=True)
class Vocabulary:
    """Source and target tokenizers; the same object twice when the vocabulary is shared."""

    source: TextTokenizer
    target: TextTokenizer

    @property
    def shared(self) -> bool:
        return self.source is self.target

    @property
    def files(self) -> list[Path]:
        """The files the tokenizers were read from (an output must never replace one)."""
        return [Path(t.origin) for t in (self.source, self.target) if Path(t.origin).is_file()]


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


def load_tokenizer(path: str | Path, expected_size: int | None = None, side: str = "",
                   seed_layout: bool = True) -> TextTokenizer:
    """Read a `tokenizers` JSON file or a plain vocabulary file; with `expected_size`, a vocabulary of another
    size is refused before a tokenizer is built from it (a pretrained model's may be smaller than its embedding
    table: T5 pads its table past the tokenizer)."""
    path = Path(path)
    text = _read_vocabulary(path)
    if text.lstrip().startswith("{") and '"model"' in text:  # most likely a `tokenizers` file: no json.loads copy
        try:
            tokenizer = Tokenizer.from_str(text)
        except Exception:  # the Rust side raises plain Exception; the checks below say what the file is
            tokenizer = None
        if tokenizer is not None:
            return _size_checked(TextTokenizer(tokenizer, str(path), seed_layout), path, expected_size, side)
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        tokens = [line.strip() for line in text.split("\n") if line.strip()]
        _check_size(path, len(tokens), expected_size, side)
        return plain_word_tokenizer(tokens, str(path))
    except RecursionError:
        raise VocabularyError(f"{path}: JSON nested too deeply to be a vocabulary") from None
    if isinstance(data, dict) and "model" in data:  # a `tokenizers` JSON file
        try:
            tok = TextTokenizer(Tokenizer.from_str(text), str(path), seed_layout)
        except VocabularyError:
            raise
        except Exception as exc:  # the Rust side raises plain Exception
            raise VocabularyError(f"{path}: not a valid tokenizers JSON file ({first_line(exc, 200)})") from None
        return _size_checked(tok, path, expected_size, side)
    if not seed_layout:
        raise VocabularyError(f"{path}: not a tokenizers JSON file; {REMAKE_TOKENIZER}")
    tokens = _tokens_from_json(data, str(path))
    _check_size(path, len(tokens), expected_size, side)
    return plain_word_tokenizer(tokens, str(path))


def _read_vocabulary(path: Path) -> str:
    try:
        size = regular_file_size(path, VocabularyError, "pass the model's tokenizer.json or vocabulary list")
        if size > MAX_VOCABULARY_BYTES:
            raise VocabularyError(f"{path}: {size:,} bytes is more than a vocabulary file may have "
                                  f"({MAX_VOCABULARY_BYTES:,}); pass the model's tokenizer.json or vocabulary list")
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise VocabularyError(f"{path}: vocabulary file not found; pass --vocab with the "
                              "model's tokenizer.json or vocabulary list") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise VocabularyError(f"{path}: cannot read vocabulary ({first_line(exc, 200)})") from None
    if not text.strip():
        raise VocabularyError(f"{path}: vocabulary file is empty")
    return text


def _size_checked(tok: TextTokenizer, path: Path, expected: int | None, side: str) -> TextTokenizer:
    """A tokenizers file's size check: exact in the seed layout, at most the table's otherwise."""
    _check_size(path, tok.vocab_size, expected, side, exact=tok.seed_layout)
    return tok


def _check_size(path: Path, size: int, expected: int | None, side: str, exact: bool = True) -> None:
    if expected is not None and (size != expected if exact else size > expected):
        raise VocabularyError(f"{path}: has {size} tokens but the model's {side + ' ' if side else ''}vocabulary "
                              f"has {expected}; pass the vocabulary the model was trained with")
