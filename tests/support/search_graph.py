"""What every model's decoder_step_search must be, checked on the graph file an export wrote."""

from __future__ import annotations

import onnx

from tfm_export.core.config import ModelConfig
from tfm_export.core.graph_spec import TOP_IDS, TOP_LOGPROBS, search_top_k


def assert_standard_search_step(proto: onnx.ModelProto, cfg: ModelConfig) -> None:
    """Standard ONNX operators only, no control flow, one ScatterND per cache tensor (the in-place write), two
    TopK (the rows' and the forced token's) whose K is a constant of the graph, and the forced token chosen among
    K candidates per row rather than through a second (rows, vocabulary) tensor, the decode's memory peak."""
    graph = proto.graph
    ops = [n.op_type for n in graph.node]
    assert {n.domain for n in graph.node} <= {"", "ai.onnx"} and not {"If", "Loop", "Scan"} & set(ops)
    assert ops.count("ScatterND") == 2 * cfg.n_layers and ops.count("TopK") == 2
    constant = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    for topk in (n for n in graph.node if n.op_type == "TopK"):
        assert constant[topk.input[1]].tolist() == [search_top_k(cfg)]
    producers = {out: n for n in graph.node for out in n.output}
    for name in (TOP_LOGPROBS, TOP_IDS):
        assert producers[name].op_type == "Where"
        assert [producers[i].op_type for i in producers[name].input[1:]] == ["TopK", "TopK"]
