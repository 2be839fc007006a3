"""Source sentences as the model takes them, and the length limits every reader of text enforces.

A source is the text's tokens framed as the model takes them (`<s> ... </s>` in the seed layout, `... </s>` in
Marian and T5, a language code first in NLLB); its length (with the framing) and the decoded target's length must
stay within the model's positions (or an engine's profile). Every command checks here, so the
limit and its message are the same wherever text enters.
"""

from __future__ import annotations

import io
import logging
import os
import select
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from .errors import InputTextError
from .tokenizer import TextTokenizer

MODEL_LIMIT = "the model's positions"
# A stream is translated in chunks of what has arrived: a chunk closes when the input pauses PAUSE_S, when
# it has been arriving for FLUSH_S, or when it holds CHUNK_BATCHES batches' worth of lines (enough to bucket by
# length and batch well; a file is read in such full chunks).
PAUSE_S, FLUSH_S, CHUNK_BATCHES = 0.05, 0.5, 8
READ_BYTES = 1 << 16
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
                 truncate: bool = False, first: int = 1) -> dict[int, list[int]]:
    """Source ids of every non-blank line, by index. A line beyond `limit` is an error naming it (numbered from
    `first`: a chunk of a stream names the line in the whole input), or, with `truncate`, cut to fit with a
    warning. `name` prefixes the line number ("--input ")."""
    rows = {}
    for index, text in enumerate(texts):
        if not text.strip():
            continue
        ids = source_ids(tok, text)
        if len(ids) > limit:
            number = first + index
            if not truncate:
                raise InputTextError(f"{name}line {number}: {len(ids)} tokens with <s> and </s>, but the model "
                                     f"takes at most {limit}; shorten or split it" + ("" if name else
                                                                                      ", or pass --truncate"))
            log.warning("line %d: cut from %d to %d tokens to fit the model's positions", number, len(ids), limit)
            ids = cut_source(ids, limit)
        rows[index] = ids
    return rows


def read_text_lines(input_file: Path | None) -> list[str]:
    """Lines of a UTF-8 file, or of stdin when no file is given; bad bytes are a one-line error. A byte-order
    mark is not text: left in, it would become part of the first sentence."""
    return [line for chunk in read_line_chunks(input_file, sys.maxsize) for line in chunk]


def decode_text(data: bytes, name: str) -> list[str]:
    """The lines of UTF-8 bytes read from `name`, without a byte-order mark. Lines are split on \\n only
    (str.splitlines also splits on form feeds, U+2028, ..., which would make the output longer than the input);
    a final newline ends the last line, \\r\\n counts as one break."""
    return [line for chunk in _chunks(iter([data]), name, sys.maxsize) for line in chunk]


def read_line_chunks(input_file: Path | None, max_lines: int) -> Iterator[list[str]]:
    """The lines read_text_lines returns, in chunks of what has arrived (at most `max_lines` each): a pipe
    that pauses gets what it sent so far translated, a file is read in full chunks."""
    name = str(input_file) if input_file else "<stdin>"
    if input_file is None and sys.stdin is None:
        raise InputTextError("stdin is closed; give TEXT arguments or --input FILE")
    try:
        stream = open(input_file, "rb") if input_file else sys.stdin.buffer
    except OSError as exc:
        raise InputTextError(f"{name}: cannot read input ({exc.strerror})") from None
    try:
        yield from _chunks(_reads(stream, name), name, max_lines)
    finally:
        if input_file:
            stream.close()


def _reads(stream: io.BufferedIOBase, name: str) -> Iterator[bytes | None]:
    """Bytes as they arrive; None when nothing more arrived within PAUSE_S (or FLUSH_S of the first waiting
    byte) although more may come. A stream without a file descriptor (a test's) is read whole."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):
        yield _read(stream.read, name)
        return
    waiting_since = None
    while True:
        now = time.monotonic()
        timeout = None if waiting_since is None else max(0.0, min(PAUSE_S, waiting_since + FLUSH_S - now))
        if not select.select([fd], [], [], timeout)[0]:
            waiting_since = None
            yield None
            continue
        data = _read(lambda: os.read(fd, READ_BYTES), name)
        if not data:
            return
        waiting_since = waiting_since or now
        yield data


def _read(read: Callable[[], bytes], name: str) -> bytes:
    try:
        return read()
    except OSError as exc:
        raise InputTextError(f"{name}: cannot read input ({exc.strerror})") from None


def _chunks(reads: Iterator[bytes | None], name: str, max_lines: int) -> Iterator[list[str]]:
    """Whole lines (split as decode_text says) grouped by arrival; a last line without a newline at the end.
    The unfinished line is kept in pieces, so a line of many reads is joined once."""
    lines: list[str] = []
    unfinished: list[bytes] = []
    number = 0  # lines decoded so far
    for data in reads:
        if data:
            *complete, rest = data.split(b"\n")
            if complete:
                complete[0] = b"".join([*unfinished, complete[0]])
                unfinished = []
            for raw in complete:
                number += 1
                lines.append(_decoded(raw, name, number))
            unfinished.append(rest)
        while len(lines) >= max_lines or (data is None and lines):
            yield lines[:max_lines]
            lines = lines[max_lines:]
    last = b"".join(unfinished)
    if last:
        lines.append(_decoded(last, name, number + 1))
    while lines:
        yield lines[:max_lines]
        lines = lines[max_lines:]


def _decoded(raw: bytes, name: str, number: int) -> str:
    """One line's text: UTF-8, without the \\r of a \\r\\n break or (first line) a byte-order mark."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputTextError(f"{name}: line {number} is not valid UTF-8; convert the file to UTF-8") from None
    if number == 1:
        text = text.removeprefix("\ufeff")
    return text.removesuffix("\r")
