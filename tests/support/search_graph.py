"""What every model's decoder_step_search must be, checked on the graph file an export wrote."""

from __future__ import annotations

import onnx

from tfm_export.core.config import ModelConfig
from tfm_export.core.graph_spec import TOKEN_BIAS, TOP_IDS, TOP_LOGPROBS, search_top_k


def assert_standard_search_step(proto: onnx.ModelProto, cfg: ModelConfig) -> None:
    """Standard ONNX operators only, no control flow, one ScatterND per cache tensor (the in-place write), two
    TopK (the rows' and the forced token's) whose K is a constant of the graph, the forced token chosen among
    K candidates per row, and one (rows, vocabulary) tensor at a time, the decode's memory peak: the bound
    logits read through a Squeeze, the log-softmax reduced to its maximum before the ranking Add (the order
    ONNX Runtime runs them in), and only the K best normalised."""
    graph = proto.graph
    ops = [n.op_type for n in graph.node]
    assert {n.domain for n in graph.node} <= {"", "ai.onnx"} and not {"If", "Loop", "Scan"} & set(ops)
    assert ops.count("ScatterND") == 2 * cfg.n_layers and ops.count("TopK") == 2 and ops.count("LogSoftmax") == 1
    constant = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    for topk in (n for n in graph.node if n.op_type == "TopK"):
        assert constant[topk.input[1]].tolist() == [search_top_k(cfg)]
    producers = {out: n for n in graph.node for out in n.output}

    def made_by(names) -> list[str]:
        return [producers[i].op_type for i in names]
    values, ids = producers[TOP_LOGPROBS], producers[TOP_IDS]
    assert values.op_type == ids.op_type == "Where"
    assert made_by(values.input[1:]) == ["TopK", "Add"] and made_by(ids.input[1:]) == ["TopK", "TopK"]
    normalised = producers[values.input[2]]
    centred, shift = (producers[i] for i in normalised.input)
    assert centred.op_type == "Sub" and made_by(centred.input) == ["TopK", "ReduceMax"]
    log_softmax = next(n for n in graph.node if n.op_type == "LogSoftmax")
    assert shift.op_type == "ReduceMax" and [n for n in graph.node if log_softmax.output[0] in n.input] == [shift]
    ranked = producers[producers[centred.input[0]].input[0]]
    rows = producers[log_softmax.input[0]]
    assert rows.op_type == "Squeeze" and rows.input[0] == "logits"
    assert ranked.op_type == "Add" and list(ranked.input) == [rows.output[0], TOKEN_BIAS]
    assert list(graph.node).index(shift) < list(graph.node).index(ranked)
