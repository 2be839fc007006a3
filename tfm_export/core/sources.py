"""Source sentences as the model takes them, and the length limits every reader of text enforces.

A source is the text's tokens framed as the model takes them (`<s> ... </s>` in the seed layout, `... </s>` in
Marian and T5, a language code first in NLLB); its length (with the framing) and the decoded target's length must
stay within the model's positions (or an engine's profile). Every command checks here, so the
limit and its message are the same wherever text enters.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from .errors import InputTextError
from .tokenizer import TextTokenizer

MODEL_LIMIT = "the model's positions"
log = logging.getLogger(__name__)


def source_ids(tok: TextTokenizer, text: str) -> list[int]:
    return tok.encode(text, framed=True)


def cut_source(ids: list[int], limit: int) -> list[int]:
    """Source ids cut to at most `limit`, keeping the last one (every seed, Marian and T5 framing ends with </s>)."""
    return ids if len(ids) <= limit else [*ids[:limit - 1], ids[-1]]


def check_source_length(length: int, limit: int, what: str = MODEL_LIMIT, remedy: str = "shorten it") -> None:
    """A source of `length` ids (with <s> and </s>) against `limit`, named by `what`."""
    if length > limit:
        raise InputTextError(f"source of {length} tokens (with <s> and </s>) is longer than {what} ({limit}); "
                             f"{remedy}")


def check_target_length(total: int, limit: int, what: str = MODEL_LIMIT) -> None:
    """Decoder positions in use after a step (past + new, <s> included) against `limit`."""
    if total > limit:
        raise InputTextError(f"decoding past {limit} target positions ({what}); lower --max-length")


def encode_lines(tok: TextTokenizer, texts: Sequence[str], limit: int, name: str = "",
                 truncate: bool = False) -> dict[int, list[int]]:
    """Source ids of every non-blank line, by index. A line beyond `limit` is an error naming it (1-based), or,
    with `truncate`, cut to fit with a warning. `name` prefixes the line number ("--input ")."""
    rows = {}
    for index, text in enumerate(texts):
        if not text.strip():
            continue
        ids = source_ids(tok, text)
        if len(ids) > limit:
            if not truncate:
                raise InputTextError(f"{name}line {index + 1}: {len(ids)} tokens with <s> and </s>, but the model "
                                     f"takes at most {limit}; shorten or split it" + ("" if name else
                                                                                      ", or pass --truncate"))
            log.warning("line %d: cut from %d to %d tokens to fit the model's positions", index + 1, len(ids), limit)
            ids = cut_source(ids, limit)
        rows[index] = ids
    return rows


def split_lines(text: str) -> list[str]:
    """Lines split on \n only (str.splitlines also splits on form feeds, U+2028, ..., which would make the output
    longer than the input); a final newline ends the last line, \r\n counts as one break."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_text_lines(input_file: Path | None) -> list[str]:
    """Lines of a UTF-8 file, or of stdin when no file is given; bad bytes are a one-line error. A byte-order
    mark is not text: left in, it would become part of the first sentence."""
    name = str(input_file) if input_file else "<stdin>"
    if input_file is None and sys.stdin is None:
        raise InputTextError("stdin is closed; give TEXT arguments or --input FILE")
    try:
        data = input_file.read_bytes() if input_file else sys.stdin.buffer.read()
    except OSError as exc:
        raise InputTextError(f"{name}: cannot read input ({exc.strerror})") from None
    return decode_text(data, name)


def decode_text(data: bytes, name: str) -> list[str]:
    """The lines of UTF-8 bytes read from `name`, without a byte-order mark."""
    try:
        return split_lines(data.decode("utf-8").removeprefix("\ufeff"))
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise InputTextError(f"{name}: line {line} is not valid UTF-8; convert the file to UTF-8") from None
