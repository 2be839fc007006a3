"""The manifests as records: one piece of code writes them (to_dict) and reads them (from_dict), and every other
package reads fields by attribute, never a manifest's keys. The JSON keys stay as docs/graph-contract.md gives them.

from_dict takes a manifest that read_declared has checked: the keys its DirectoryKind requires are there. Sections
that only describe how a directory was made (fp16, int8's kept ops, calibration, a TensorRT build's settings) are
carried as their JSON objects; keys this version does not know are carried through copies unchanged.
"""

from __future__ import annotations

import copy
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

from .. import __version__
from ..core.generate_spec import GENERATE

TOKEN_RULES = "token_rules"  # a pretrained model's ids and generation defaults; absent: the seed's layout
SENTENCEPIECE = "sentencepiece"  # the source tokenizer's SentencePiece model, for the C++ command; absent: none
# A graph entry's list of initializers it shares with the encoder (same name and bytes), kept in its external
# weights file so that a runtime reads them once and gives both sessions the same memory: the tied embedding table.
SHARED = "shared_initializers"
# A graph entry's external weights file when it is not `<file>.data`: the one file every graph of a large model
# reads its weights from, each tensor stored once (graphs.saving)
DATA_KEY = "data"
TOOL = "tfm-export"
# Record field -> JSON key, where they differ
_KEYS = {"shared": SHARED, "data": DATA_KEY, "generate": GENERATE}

_Record = TypeVar("_Record", bound="Record")


class Record:
    """A dataclass written as one JSON object: its fields by key (None and empty optional sections left out), then
    `extra`, the keys it does not model."""

    _optional: tuple[str, ...] = ()  # fields left out of the JSON while None or empty

    @classmethod
    def from_dict(cls: type[_Record], data: dict[str, Any]) -> _Record:
        """A required key that is absent (one no DirectoryKind requires: generate.sha256, say) reads as None, for
        the reader that checks it to say so."""
        data = copy.deepcopy(data)
        values = {}
        for f in fields(cls):  # type: ignore[arg-type]
            key = _KEYS.get(f.name, f.name)
            if key in data and f.name != "extra":
                values[f.name] = cls._field_from(f.name, data.pop(key))
            elif f.default is MISSING and f.default_factory is MISSING:
                values[f.name] = None
        return cls(**values, extra=data)  # type: ignore[call-arg]

    @classmethod
    def _field_from(cls, name: str, value: Any) -> Any:
        return value

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name == "extra" or (f.name in self._optional and value in (None, [], {})):
                continue
            out[_KEYS.get(f.name, f.name)] = _json(value)
        return {**out, **copy.deepcopy(self.extra)}  # type: ignore[attr-defined]


def _json(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    return copy.deepcopy(value)


@dataclass
class GraphEntry(Record):
    """A graph's manifest entry: its file and sha256, its inputs and outputs (name, dtype, shape), and where its
    external weights are (DATA_KEY) and which of them it shares with the encoder (SHARED)."""

    file: str
    sha256: str
    inputs: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    data: str | None = None
    shared: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    _optional = ("data", "shared")

    @property
    def data_file(self) -> str:
        """The external weights file it reads, where it has one: its DATA_KEY, or the `<file>.data` beside it."""
        return self.data if self.data is not None else f"{self.file}.data"

    def tensor_types(self) -> dict[str, str]:
        """Its inputs and outputs, name -> dtype."""
        return {t["name"]: t["dtype"] for t in (*self.inputs, *self.outputs)}


@dataclass
class SourceCheckpoint(Record):
    """The checkpoint a model directory was exported from: its name (not its path: the directory is shipped), its
    sha256, its format and, for a Hugging Face model, its family."""

    sha256: str
    file: str | None = None
    format: str | None = None
    model_type: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    _optional = ("file", "format", "model_type")


@dataclass
class DirectoryManifest(Record):
    """What model and engine manifests share: the model, its tokens and tokenizers, the limits, the precision, and
    the sha256 of the files besides graphs and plans."""

    format: str
    format_version: int
    model: dict[str, Any]
    precision: str
    special_tokens: dict[str, int]
    tokenizer: dict[str, str]  # side ("source", "target") -> file name
    limits: dict[str, Any]
    files: dict[str, str] = field(default_factory=dict)
    token_rules: dict[str, Any] | None = None
    sentencepiece: dict[str, Any] | None = None
    int8: dict[str, Any] | None = None
    tool: str = TOOL
    tool_version: str = __version__
    extra: dict[str, Any] = field(default_factory=dict)
    _optional = ("token_rules", "sentencepiece", "int8")

    @property
    def int8_mode(self) -> str | None:
        return (self.int8 or {}).get("mode") if self.precision == "int8" else None

    def tokenizer_names(self) -> list[str]:
        """Every tokenizer file it names, each once: the source's and target's, and the SentencePiece model."""
        spm = [self.sentencepiece["file"]] if self.sentencepiece else []
        return list(dict.fromkeys([*self.tokenizer.values(), *spm]))

    def tokens_of(self) -> dict[str, Any]:
        """The fields a directory made from this one copies as they are: model, tokens, tokenizers."""
        return {"model": copy.deepcopy(self.model), "special_tokens": dict(self.special_tokens),
                "tokenizer": dict(self.tokenizer), "token_rules": copy.deepcopy(self.token_rules),
                "sentencepiece": copy.deepcopy(self.sentencepiece)}


@dataclass
class ModelManifest(DirectoryManifest):
    """A model directory's manifest (ONNX graphs)."""

    opset: int = 0
    graphs: dict[str, GraphEntry] = field(default_factory=dict)
    source_checkpoint: SourceCheckpoint | None = None
    optimizations: list[str] = field(default_factory=list)
    optimizations_not_applied: dict[str, str] = field(default_factory=dict)
    parent: dict[str, Any] | None = None  # an fp16/int8 directory's fp32 parent: path, precision, graphs' sha256
    fp16: dict[str, Any] | None = None
    generate: GraphEntry | None = None  # generate.onnx, with what the BeamSearch op was built with (extra)
    _optional = (*DirectoryManifest._optional, "optimizations_not_applied", "parent", "fp16", "generate")

    @classmethod
    def _field_from(cls, name: str, value: Any) -> Any:
        if name == "graphs":
            return {graph: GraphEntry.from_dict(entry) for graph, entry in value.items()}
        if name == "generate":
            return GraphEntry.from_dict(value) if isinstance(value, dict) else None
        if name == "source_checkpoint":
            return SourceCheckpoint.from_dict(value)
        return value

    @property
    def external(self) -> bool:
        """The graphs read their weights from one shared file (graphs.saving's external layout)."""
        return any(entry.data is not None for entry in self.graphs.values())

    @property
    def parent_path(self) -> str | None:
        path = self.parent.get("path") if isinstance(self.parent, dict) else None
        return path if isinstance(path, str) else None

    def note(self, optimization: str) -> None:
        """Says in `optimizations` what was done to the graphs."""
        self.optimizations.append(optimization)


@dataclass
class EngineManifest(DirectoryManifest):
    """An engine directory's manifest (TensorRT plans): what they were built by, for and from."""

    tensorrt: dict[str, Any] = field(default_factory=dict)  # target, library version, GPU, build settings
    engines: dict[str, dict[str, Any]] = field(default_factory=dict)  # graph -> plan file, sha256, profiles
    source: dict[str, Any] = field(default_factory=dict)  # the model directory: path, precision, graphs' sha256
