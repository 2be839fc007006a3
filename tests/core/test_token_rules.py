"""A manifest's token_rules: what decoding follows for a pretrained model, read back exactly or refused by name."""

from __future__ import annotations

import pytest

from tfm_export.core.errors import TfmExportError
from tfm_export.core.token_rules import OPTIONAL_FIELDS, TokenRules

RULES = TokenRules(pad=1, start=2, eos=2, banned=(1, 7), forced_bos=None, forced_eos=2, max_new_tokens=199,
                   beam_rule="transformers", early_stopping="never", num_beams=5, length_penalty=0.6,
                   languages=("eng_Latn", "fra_Latn"), language_rule="forced_bos")


def test_rules_read_back_as_written() -> None:
    assert TokenRules.from_dict(RULES.to_dict(), 100) == RULES


def test_rules_written_before_languages_and_defaults_still_read() -> None:
    old = {k: v for k, v in RULES.to_dict().items() if k not in OPTIONAL_FIELDS}
    read = TokenRules.from_dict(old, 100)
    assert (read.languages, read.language_rule, read.num_beams, read.early_stopping) == ((), None, 1, False)


@pytest.mark.parametrize("change, field", [
    ({"early_stopping": "sometimes"}, "early_stopping"), ({"early_stopping": 1}, "early_stopping"),
    ({"num_beams": 0}, "num_beams"), ({"length_penalty": float("nan")}, "length_penalty"),
    ({"length_penalty": True}, "length_penalty"), ({"languages": ["ok", ""]}, "languages"),
    ({"language_rule": "somewhere"}, "language_rule"), ({"languages": [], "language_rule": "forced_bos"},
                                                        "language_rule"),
    ({"max_new_tokens": 0}, "max_new_tokens"), ({"forced_bos": -1}, "forced_bos"), ({"banned": [1, "x"]}, "banned"),
    ({"beam_rule": "fastest"}, "beam_rule"),
])
def test_bad_rules_name_the_field(change, field) -> None:
    with pytest.raises(TfmExportError, match=f"token_rules.{field} must be"):
        TokenRules.from_dict({**RULES.to_dict(), **change}, 100)


@pytest.mark.parametrize("field", ["pad", "start", "eos", "forced_bos", "forced_eos", "banned"])
def test_each_id_outside_the_vocabulary_is_refused_by_name(field) -> None:
    def with_id(token: int) -> dict:
        return {**RULES.to_dict(), field: [1, token] if field == "banned" else token}
    assert TokenRules.from_dict(with_id(99), 100)  # the last id is in
    with pytest.raises(TfmExportError, match=f"token_rules.{field} names id 100, outside the target vocabulary "
                                             "of 100"):
        TokenRules.from_dict(with_id(100), 100)


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(TfmExportError, match="exactly the fields"):
        TokenRules.from_dict({**RULES.to_dict(), "temperature": 0.7}, 100)
