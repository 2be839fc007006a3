"""One exception type for every user-facing failure.

Library code raises it with a message that names the file, what is wrong and what to do;
the CLI prints that one line and exits non-zero, so users never see a traceback for bad input.
"""


class TfmExportError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class CheckpointError(TfmExportError):
    """A checkpoint that cannot be loaded as the reference Transformer."""


class VocabularyError(TfmExportError):
    """A tokenizer or vocabulary file that is missing, malformed or does not fit the model."""


class InputTextError(TfmExportError):
    """Text that the model cannot take (too long, not UTF-8, ...)."""


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message (or its type name), for quoting in a one-line error."""
    return (str(exc).splitlines() or [type(exc).__name__])[0][:limit]
