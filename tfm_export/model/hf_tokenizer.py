"""The tokenizers of a Hugging Face model directory as `tokenizers` JSON with the model's own ids and source framing.

A directory with a `tokenizer.json` (BART, mBART, NLLB, T5 saved by a fast tokenizer) already has one: it is read
as it is. Marian (opus-mt) directories have two SentencePiece models and a `vocab.json` that gives every piece its
model id; they become a source and a target Unigram model in vocab.json's order, with the SentencePiece model's
normalizer (its precompiled charsmap), whitespace rules, scores and unknown-piece handling, and the `$A </s>`
framing MarianTokenizer gives sources. M2M100 directories (a SentencePiece BPE model and a `vocab.json`; there is
no fast M2M100 tokenizer) become a BPE model with SentencePiece's merges. Other directories without
`tokenizer.json` go through transformers' own conversion (the `hf` extra).

A joint vocabulary lists the target language's pieces too. MarianTokenizer never produces them from source text,
except one way: SentencePiece gives a run of characters it lacks as one unknown piece, and MarianTokenizer looks
that run up in vocab.json. The source tokenizer reproduces both: target pieces get names no text reaches, and the
normalizer marks every run of characters the source model lacks, which only a piece named as that whole marked run
matches. Scores stay SentencePiece's. The target tokenizer, which only decodes, keeps every name.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import re
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from ..core.config import ModelConfig
from ..core.errors import VocabularyError, first_line
from ..core.extras import missing, require_extra
from ..core.files import contained_file, read_json
from ..core.token_rules import TokenRules
from ..core.tokenizer import TOKENIZER_FILE, SentencePieceModel, TextTokenizer, Vocabulary, load_tokenizer

log = logging.getLogger(__name__)

MARIAN_SOURCE_SPM, MARIAN_TARGET_SPM = "source.spm", "target.spm"
MARIAN_VOCAB, MARIAN_TARGET_VOCAB = "vocab.json", "target_vocab.json"  # the second only with separate_vocabs
METASPACE = "▁"
EOS = "</s>"
MARIAN_SPECIALS = (EOS, "<unk>", "<pad>")  # MarianTokenizer's eos, unk and pad: matched in text as they are
RUN_START, RUN_END = "\ufdd0", "\ufdd1"  # noncharacters: never in text, they mark runs the source model lacks
CODE_START = "\ufdd2"  # marks >> at the start of a text: only there is a language code one (MarianTokenizer)
NORMAL, UNKNOWN, CONTROL = 1, 2, 3  # SentencePiece piece types
UNIGRAM, BPE = 1, 2  # SentencePiece model types
M2M100_SPM = "sentencepiece.bpe.model"  # M2M100's SentencePiece BPE model, beside its vocab.json
MARIAN_CODES = r">>[^<>\s]+<<"  # multilingual opus-mt's target language tokens, which go before the source text
LINKED = "copy the model directory with its files, not links to elsewhere"
NO_TOKENIZER = (f"no tokenizer files ({TOKENIZER_FILE}, or {MARIAN_SOURCE_SPM}, {MARIAN_TARGET_SPM} and "
                f"{MARIAN_VOCAB} for Marian); copy the tokenizer files that came with the model into the directory")


def tokenizer_json(directory: Path, config: ModelConfig) -> Vocabulary | None:
    """The directory's own tokenizer.json (one tokenizer for both sides), or None where it has none."""
    if not (directory / TOKENIZER_FILE).exists():
        return None
    path = contained_file(directory, TOKENIZER_FILE, VocabularyError, "tokenizer", LINKED)
    tok = load_tokenizer(path, max(config.src_vocab_size, config.trg_vocab_size), seed_layout=False)
    tok.sentencepiece = unigram_sentencepiece(tok) or bpe_sentencepiece(directory, tok)
    return Vocabulary(tok, tok)


def marian_vocabulary(directory: Path, hf: dict[str, Any], config: ModelConfig) -> Vocabulary:
    return _marian(directory, hf, config)


def m2m100_vocabulary(directory: Path, config: ModelConfig) -> Vocabulary:
    """M2M100's SentencePiece BPE model where the directory has it, else transformers' conversion."""
    return _m2m100(directory, config) if (directory / M2M100_SPM).exists() else converted_vocabulary(directory, config)


def _marian(directory: Path, hf: dict[str, Any], config: ModelConfig) -> Vocabulary:
    inside = lambda name, what: contained_file(directory, name, VocabularyError, what, LINKED)  # noqa: E731
    for name in (MARIAN_SOURCE_SPM, MARIAN_TARGET_SPM, MARIAN_VOCAB):
        if not (directory / name).exists():
            raise VocabularyError(f"{directory}: {NO_TOKENIZER}")
    separate = hf.get("separate_vocabs") is True or (directory / MARIAN_TARGET_VOCAB).exists()
    source_ids = _vocab_json(inside(MARIAN_VOCAB, "Marian vocabulary"), config.src_vocab_size)
    target_ids = (_vocab_json(inside(MARIAN_TARGET_VOCAB, "Marian target vocabulary"), config.trg_vocab_size)
                  if separate else source_ids)
    source_spm = inside(MARIAN_SOURCE_SPM, "source SentencePiece model")
    source = _spm_tokenizer(source_spm, source_ids, encodes=True)
    source.sentencepiece = SentencePieceModel(source_spm.read_bytes(), whole_text=True)
    target = _spm_tokenizer(inside(MARIAN_TARGET_SPM, "target SentencePiece model"), target_ids, encodes=False)
    return Vocabulary(source, target)


def _vocab_json(path: Path, model_size: int) -> list[str]:
    """vocab.json's tokens by id; ids must be 0..n-1 and fit the model's embedding table."""
    data = read_json(path, VocabularyError, LINKED)
    if not isinstance(data, dict) or not all(isinstance(i, int) and not isinstance(i, bool) for i in data.values()):
        raise VocabularyError(f"{path}: expected a JSON object of piece -> id")
    by_id = sorted(data, key=data.__getitem__)
    if [data[t] for t in by_id] != list(range(len(by_id))):
        raise VocabularyError(f"{path}: ids must be 0..{len(by_id) - 1}, each once")
    if len(by_id) > model_size:
        raise VocabularyError(f"{path}: {len(by_id)} pieces, but the model's embedding table has {model_size} rows; "
                              "pass the vocabulary the model was trained with")
    return by_id


def _spm_proto(path: Path, model_type: int = UNIGRAM) -> Any:
    require_extra("hf", f"reading {path.name}")
    from transformers.utils import sentencepiece_model_pb2_new as sentencepiece_model  # protobuf-version neutral
    proto = sentencepiece_model.ModelProto()
    try:
        proto.ParseFromString(path.read_bytes())
    except Exception as exc:  # DecodeError, OSError
        raise VocabularyError(f"{path}: not a SentencePiece model ({first_line(exc)})") from None
    spec = proto.trainer_spec
    unsupported = [what for what, bad in (
        (f"a model type other than {'unigram' if model_type == UNIGRAM else 'BPE'}", spec.model_type != model_type),
        ("byte fallback", spec.byte_fallback),
        ("pieces across spaces", not spec.split_by_whitespace),
        ("whitespace as suffix", spec.treat_whitespace_as_suffix),
        ("user-defined pieces", any(p.type not in (NORMAL, UNKNOWN, CONTROL) for p in proto.pieces))) if bad]
    if not proto.pieces or unsupported:
        raise VocabularyError(f"{path}: SentencePiece model with {', '.join(unsupported) or 'no pieces'} cannot be "
                              "reproduced exactly; please report the model")
    return proto


def _spm_tokenizer(path: Path, tokens: list[str], encodes: bool) -> TextTokenizer:
    """A Unigram model over `tokens` (the model's ids) with the SentencePiece model's scores and normalization;
    encodes: the source side, whose text must give MarianTokenizer's ids exactly."""
    proto = _spm_proto(path)
    scores = {p.piece: p.score for p in proto.pieces if p.type == NORMAL}
    unk = next((p.piece for p in proto.pieces if p.type == UNKNOWN), None)
    ids = {t: i for i, t in enumerate(tokens)}
    missing = [t for t in (unk, EOS, *scores) if t not in ids]
    if missing:
        raise VocabularyError(f"{path}: piece {missing[0]!r} has no id in {MARIAN_VOCAB}; pass the vocabulary "
                              "that came with this SentencePiece model")
    specials = {p.piece for p in proto.pieces if p.type in (UNKNOWN, CONTROL)} | (set(MARIAN_SPECIALS) & ids.keys())
    codes = [t for t in tokens if re.fullmatch(MARIAN_CODES, t)]  # multilingual opus-mt target codes
    known = {c for piece in scores for c in piece.replace(METASPACE, " ")}
    vocab = _source_vocab(tokens, scores, specials | set(codes), known) if encodes else \
        [(t, scores.get(t, min(scores.values(), default=0.0))) for t in tokens]
    tok = _with_text_rules(Tokenizer(models.Unigram(vocab, unk_id=ids[unk], byte_fallback=False)), proto,
                           known if encodes else None)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokens if t in specials])
    tok.add_tokens([AddedToken(t, special=False, normalized=True) for t in codes])  # normalized: marked first
    tok.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, ids[EOS])])
    return TextTokenizer(tok, str(path), seed_layout=False)


def _source_vocab(tokens: list[str], scores: dict[str, float], added: set[str], known: set[str]) \
        -> list[tuple[str, float]]:
    """(name, score) by id for the source side. Its own pieces keep their names and scores; added tokens are
    matched before the model. A piece made only of characters this model lacks is what MarianTokenizer looks up
    when SentencePiece leaves such a run unknown: it is named between the run markers, so it matches a whole
    run and nothing else. Any other piece (the target language's) gets a name no text reaches."""
    floor = min(scores.values(), default=0.0)  # so the unknown-piece penalty (lowest score - 10) stays SentencePiece's
    def entry(token: str) -> tuple[str, float]:
        if token in scores or token in added:
            return token, scores.get(token, floor)
        if not known & set(token.replace(METASPACE, " ")):
            return RUN_START + token + RUN_END, 0.0  # beats the run as unknown characters
        return token[:1] + METASPACE + token[1:], floor  # the pre-tokenizer leaves '▁' only first
    return [entry(t) for t in tokens]


def _with_text_rules(tok: Tokenizer, proto: Any, known: set[str] | None) -> Tokenizer:
    """`tok` with the SentencePiece model's normalizer (see _normalizer) and its whitespace as "▁" pieces."""
    tok.normalizer = _normalizer(proto, known)
    scheme = "always" if proto.normalizer_spec.add_dummy_prefix else "never"
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme=scheme, split=True)
    tok.decoder = decoders.Metaspace(replacement=METASPACE, prepend_scheme=scheme, split=True)
    return tok


def _normalizer(proto: Any, known: set[str] | None) -> normalizers.Normalizer:
    """SentencePiece's normalization: its charsmap, then (remove_extra_whitespaces) no leading, trailing or
    repeated spaces; with `known` (the source side), a text's leading >> is marked (a language code's content
    is normalized too, so it matches only there, as MarianTokenizer reads codes) and every run of other
    characters is marked at both ends."""
    spec = proto.normalizer_spec
    steps = [normalizers.Replace(Regex(r"\A>>"), CODE_START + ">>")] if known is not None else []
    steps += [normalizers.Precompiled(spec.precompiled_charsmap)] if spec.precompiled_charsmap else []
    if spec.remove_extra_whitespaces:
        steps += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Strip(left=True, right=True)]
    if known is not None:
        other = "[^" + "".join(f"\\x{{{ord(c):x}}}" for c in sorted(known)) + "]"
        steps += [normalizers.Replace(Regex(f"(?<!{other})(?={other})"), RUN_START),
                  normalizers.Replace(Regex(f"(?<={other})(?!{other})"), RUN_END)]
    return normalizers.Sequence(steps)


def _m2m100(directory: Path, config: ModelConfig) -> Vocabulary:
    """M2M100Tokenizer as a BPE model: SentencePiece's pieces with its merges (a piece's splits into two pieces,
    earlier for a higher score), runs of unknown characters fused into one <unk> as SentencePiece does,
    vocab.json's ids, the language codes after them, and the source framing `__xx__ $A </s>` for the saved
    source language. A code in the text is text to M2M100Tokenizer, so only the target side (which decodes)
    marks codes special. transformers (the `hf` extra) reads the tokenizer's files, which name the language list
    and the source language."""
    require_extra("hf", f"reading the M2M100 tokenizer of {directory}")
    from transformers import AutoTokenizer
    _no_links_out(directory)
    try:
        hf_tok = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        codes = dict(hf_tok.lang_token_to_id)
        source_code = hf_tok.get_lang_token(hf_tok.src_lang)
    except Exception as exc:  # OSError, KeyError, AttributeError of a tokenizer that is not M2M100's
        raise VocabularyError(f"{directory}: not an M2M100 tokenizer ({first_line(exc, 120)})") from None
    path = contained_file(directory, M2M100_SPM, VocabularyError, "SentencePiece model", LINKED)
    proto = _spm_proto(path, BPE)
    pieces = [p.piece for p in proto.pieces if p.type == NORMAL]
    ids = {**hf_tok.encoder, **codes}
    missing = [p for p in pieces if p not in ids]
    if missing or max(ids.values()) >= max(config.src_vocab_size, config.trg_vocab_size):
        raise VocabularyError(f"{directory}: " + (f"piece {missing[0]!r} has no id in vocab.json" if missing else
                                                  "the tokenizer's ids run past the model's embedding table"))
    tok = _with_text_rules(Tokenizer(models.BPE(vocab=ids, merges=_bpe_merges(proto), unk_token=hf_tok.unk_token,
                                                fuse_unk=True, byte_fallback=False)), proto, None)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in hf_tok.all_special_tokens
                            if t in ids and t not in codes])
    eos = hf_tok.eos_token
    tok.post_processor = processors.TemplateProcessing(single=f"{source_code} $A {eos}", special_tokens=[
        (source_code, ids[source_code]), (eos, ids[eos])])
    source = TextTokenizer(tok, str(path), seed_layout=False, sentencepiece=SentencePieceModel(path.read_bytes(), True))
    target = Tokenizer.from_str(tok.to_str())  # decodes: a generated language code is skipped, as special
    target.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in codes])
    return Vocabulary(source, TextTokenizer(target, str(path), seed_layout=False))


def _bpe_merges(proto: Any) -> list[tuple[str, str]]:
    """A SentencePiece BPE model's merges in the order it applies them: every split of a piece into two
    pieces, pieces by falling score, splits of one piece by the ids of their halves."""
    order = {p.piece: i for i, p in enumerate(proto.pieces) if p.type == NORMAL}
    merges = []
    for piece in sorted(order, key=lambda name: -proto.pieces[order[name]].score):  # stable: ties keep file order
        splits = [(piece[:i], piece[i:]) for i in range(1, len(piece)) if piece[:i] in order and piece[i:] in order]
        merges += sorted(splits, key=lambda pair: (order[pair[0]], order[pair[1]]))
    return merges


def _no_links_out(directory: Path) -> None:
    """transformers reads a directory's tokenizer files by name and follows links: none may lead outside it."""
    for entry in sorted(directory.iterdir()):
        if entry.is_symlink():
            contained_file(directory, entry.name, VocabularyError, "tokenizer file", LINKED)


def converted_vocabulary(directory: Path, config: ModelConfig) -> Vocabulary:
    """transformers' own conversion of a directory with tokenizer files but no tokenizer.json."""
    require_extra("hf", f"reading the tokenizer files of {directory} (it has no {TOKENIZER_FILE})")
    from transformers import AutoTokenizer
    _no_links_out(directory)
    try:
        hf_tok = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except Exception as exc:  # OSError for missing files, ValueError, ...
        raise VocabularyError(f"{directory}: {NO_TOKENIZER} ({first_line(exc, 120)})") from None
    backend = getattr(hf_tok, "backend_tokenizer", None)
    if backend is None:
        raise VocabularyError(f"{directory}: transformers has no fast version of {type(hf_tok).__name__} (it reads "
                              f"it only in Python), so tfm-export cannot write a {TOKENIZER_FILE} that reproduces it; "
                              "please report the model")
    tok = TextTokenizer(Tokenizer.from_str(backend.to_str()), str(directory), seed_layout=False)
    tok.sentencepiece = unigram_sentencepiece(tok)
    if tok.vocab_size > max(config.src_vocab_size, config.trg_vocab_size):
        raise VocabularyError(f"{directory}: the tokenizer has {tok.vocab_size} tokens, more than the model's "
                              "embedding table; pass the tokenizer the model was trained with")
    return Vocabulary(tok, tok)


def unigram_sentencepiece(tok: TextTokenizer) -> SentencePieceModel | None:
    """A SentencePiece model of a Unigram tokenizer's table (its pieces, scores and unknown piece; the normalizer's
    precompiled charsmap where it has one), for tokenizers outside Python, which give it each word the tokenizer's
    own normalizer and pre-tokenizer make; SentencePiece's Viterbi search is the one `tokenizers` reproduces.
    None for other models, and without the hf extra (its protobuf classes write the file)."""
    data = json.loads(tok.tokenizer.to_str())
    model = data["model"]
    if model["type"] != "Unigram" or model.get("unk_id") is None or model.get("byte_fallback"):
        return None
    if missing("hf"):
        log.info("no SentencePiece model for the C++ command: the hf extra writes it (pip install '.[hf]')")
        return None
    from transformers.utils import sentencepiece_model_pb2_new as sentencepiece_model
    proto = sentencepiece_model.ModelProto()
    for i, (piece, score) in enumerate(model["vocab"]):
        proto.pieces.add(piece=piece, score=score, type=UNKNOWN if i == model["unk_id"] else NORMAL)
    proto.trainer_spec.MergeFrom(sentencepiece_model.TrainerSpec(
        model_type=UNIGRAM, vocab_size=len(model["vocab"]), unk_id=model["unk_id"], bos_id=-1, eos_id=-1, pad_id=-1,
        unk_piece=model["vocab"][model["unk_id"]][0]))
    return _words_model(proto, data)


def bpe_sentencepiece(directory: Path, tok: TextTokenizer) -> SentencePieceModel | None:
    """The directory's own SentencePiece BPE model (sentencepiece.bpe.model, which NLLB and mBART repositories ship
    beside the tokenizer.json converted from it) as a words model: the tokenizer's normalizer and Metaspace words
    given to it one by one, its charsmap the JSON's, its merges its own. None where the directory has none, the
    JSON is no BPE, or a piece of the model has no id in the JSON's table (another vocabulary)."""
    data = json.loads(tok.tokenizer.to_str())
    model = data["model"]
    if model["type"] != "BPE" or not (directory / M2M100_SPM).exists() or missing("hf"):
        return None
    path = contained_file(directory, M2M100_SPM, VocabularyError, "SentencePiece model", LINKED)
    proto = _spm_proto(path, BPE)
    absent = [p.piece for p in proto.pieces if p.type == NORMAL and p.piece not in model["vocab"]]
    if absent:
        log.info("%s: not the model of %s (piece %r has no id there); the C++ command cannot read it", path,
                 tok.origin, absent[0])
        return None
    return _words_model(proto, data)


def _words_model(proto: Any, tokenizer_json: dict[str, Any]) -> SentencePieceModel:
    """`proto` as a words model: the tokenizer JSON's charsmap, and no whitespace rules of its own (each word comes
    with its '▁' from the pre-tokenizer; escaped, since the charsmap may make it a space)."""
    spec = proto.normalizer_spec
    spec.precompiled_charsmap = _precompiled(tokenizer_json.get("normalizer"))
    spec.name = "precompiled" if spec.precompiled_charsmap else "identity"
    spec.add_dummy_prefix = spec.remove_extra_whitespaces = False
    spec.escape_whitespaces = True
    return SentencePieceModel(proto.SerializeToString(), whole_text=False)


def _precompiled(normalizer: dict | None) -> bytes:
    """The charsmap of a Precompiled normalizer (alone or in a Sequence), b"" where there is none."""
    steps = (normalizer or {}).get("normalizers", [normalizer] if normalizer else [])
    found = [step["precompiled_charsmap"] for step in steps if step.get("type") == "Precompiled"]
    return base64.b64decode(found[0]) if found else b""


def with_languages(rules: TokenRules, pattern: str, tokenizer: TextTokenizer, rule: str | None = None) -> TokenRules:
    """The rules with the model's language codes (its added tokens matching `pattern`) and where a chosen target
    language goes: `rule` if given (Marian: before the source text); else the decoder start where the configured
    start is one (mBART-cc25), otherwise the first generated token."""
    added = tokenizer.tokenizer.get_added_tokens_decoder()
    codes = tuple(t.content for _, t in sorted(added.items()) if re.fullmatch(pattern, t.content))
    if not codes:
        return rules
    if rule is None:
        rule = "decoder_start" if tokenizer.tokenizer.id_to_token(rules.start) in codes else "forced_bos"
    return dataclasses.replace(rules, languages=codes, language_rule=rule)
