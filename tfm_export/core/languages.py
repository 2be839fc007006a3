"""Source and target languages of multilingual models, chosen by language code (`--source-lang`, `--target-lang`).

A code is a token of the model's vocabulary (eng_Latn, __fr__, en_XX, >>fra<<). The source language is the code
the source framing carries (NLLB, M2M100, mBART); the target language goes where the model's language_rule says:
the first generated token, the decoder's first input, or a code before the source text.
"""

from __future__ import annotations

from .errors import InputTextError
from .token_rules import TokenRules
from .tokenizer import Vocabulary

SHOWN_CODES = 8  # codes an error lists before "..."
CLI_NAMES = ("--source-lang", "--target-lang")  # how errors name the two choices (a server names its parameters)


def choose_languages(vocab: Vocabulary, rules: TokenRules, source: str | None = None, target: str | None = None,
                     names: tuple[str, str] = CLI_NAMES) -> tuple[Vocabulary, TokenRules]:
    """The tokenizers and rules that translate from `source` into `target` (None: as the model directory says).
    A model whose target language is its first generated token and which names none needs `target`."""
    source_name, target_name = names
    if source is None and target is None:
        if rules.language_rule == "forced_bos" and rules.forced_bos is None:
            raise InputTextError(f"this model translates into {len(rules.languages)} languages and its generation "
                                 f"config names none; pass {target_name} ({_sample(rules)})")
        return vocab, rules
    if not rules.languages:
        raise InputTextError(f"{source_name}/{target_name}: this model takes no language codes; drop them")
    for name, code in ((source_name, source), (target_name, target)):
        if code is not None and code not in rules.languages:
            raise InputTextError(f"{name} {code!r} is not one of the model's {len(rules.languages)} language "
                                 f"codes ({_sample(rules)})")
    tokenizer = vocab.source
    if source is not None:
        if not tokenizer.framing_codes(rules.languages):
            raise InputTextError(f"{source_name}: this model's sources carry no language code (it reads any "
                                 "language it knows); drop it")
        tokenizer = tokenizer.with_code(source, rules.languages)
    if target is not None:
        if rules.language_rule == "source_prefix":
            tokenizer = tokenizer.with_code(target, ())
        rules = rules.with_target(vocab.target.tokenizer.token_to_id(target))
    return Vocabulary(tokenizer, vocab.target), rules


def _sample(rules: TokenRules) -> str:
    codes = rules.languages
    return ", ".join(codes[:SHOWN_CODES]) + (", ..." if len(codes) > SHOWN_CODES else "")
