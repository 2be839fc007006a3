"""What TensorRT's ONNX parser accepts, per TensorRT release: operators, opsets, tensor types.

Taken from the onnx-tensorrt operator tables (docs/operators.md) and changelogs. TensorRT 8.6 (JetPack
6.0 ships 8.6.2): the release/8.6-GA table's supported rows, opsets up to 17, no INT64 or BFLOAT16 type
(the parser narrows INT64 inputs, outputs and weights to INT32). TensorRT 10.3 (JetPack 6.1/6.2): the
10.15 table's supported rows less the operators its changelog dates after 10.3 (equal to the 10.1
table, the 10.2/10.3 changelogs add none). TensorRT 11 adds Swish and DFT. TensorRT 8.5 (JetPack 5)
cannot parse LayerNormalization and is not a target. Restrictions that matter for these graphs
(symmetric Q/DQ, constant axes, boolean-only logic ops, float-only Pow before 10.8) are checked in compat.
"""

from __future__ import annotations

from dataclasses import dataclass

_TRT_10_3_OPS = frozenset("""
Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool BatchNormalization Cast CastLike Ceil
Celu Clip Concat Constant ConstantOfShape Conv ConvTranspose Cos Cosh CumSum DeformConv DepthToSpace
DequantizeLinear Div Dropout Einsum Elu Equal Erf Exp Expand EyeLike Flatten Floor Gather GatherElements
GatherND Gelu Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool Greater GreaterOrEqual GridSample
GroupNormalization GRU Hardmax HardSigmoid HardSwish Identity If ImageScaler InstanceNormalization IsInf IsNaN
LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax Loop LpNormalization LpPool LRN LSTM MatMul Max
MaxPool Mean MeanVarianceNormalization Min Mish Mod Mul Neg NonMaxSuppression NonZero Not OneHot Or Pad
ParametricSoftplus Pow PRelu QuantizeLinear RandomNormal RandomNormalLike RandomUniform RandomUniformLike Range
Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum
ReduceSumSquare Relu Reshape Resize ReverseSequence RNN RoiAlign Round ScaledTanh Scan Scatter ScatterElements
ScatterND Selu Shape Shrink Sigmoid Sign Sin Sinh Size Slice Softmax Softplus Softsign SpaceToDepth Split Sqrt
Squeeze Sub Sum Tan Tanh ThresholdedRelu Tile TopK Transpose Trilu Unsqueeze Upsample Where Xor
""".split())
# Supported in 10.3 but not in 8.6's table (Gelu is an opset-20 op; the others are new importers).
_ADDED_AFTER_8_6 = frozenset("CastLike DeformConv Gelu Hardmax Mish".split())
_ADDED_AFTER_10_3 = frozenset("""
Attention BlackmanWindow HammingWindow HannWindow STFT RotaryEmbedding RMSNormalization TensorScatter Swish DFT
""".split())
# Tensor types the parser maps to TensorRT types (DOUBLE is narrowed to FLOAT; UINT8 only at the boundary).
TENSOR_TYPES = frozenset({"FLOAT", "FLOAT16", "BFLOAT16", "INT8", "INT32", "INT64", "BOOL", "UINT8", "DOUBLE"})
_TENSOR_TYPES_8_6 = TENSOR_TYPES - {"BFLOAT16"}


@dataclass(frozen=True)
class ParserRelease:
    name: str
    ops: frozenset[str]
    opsets: tuple[int, int]  # inclusive range of the default domain's opset
    integer_pow: bool  # Pow on INT32/INT64 (10.8 and later)
    dynamic_unsqueeze_axes: bool  # Squeeze/Unsqueeze axes from a tensor (10.7 and later)
    tensor_types: frozenset[str] = TENSOR_TYPES
    narrows_int64: bool = False  # INT64 tensors become INT32 (8.x has no INT64 type)


RELEASES = (
    ParserRelease("TensorRT 8.6", _TRT_10_3_OPS - _ADDED_AFTER_8_6, (9, 17), integer_pow=False,
                  dynamic_unsqueeze_axes=False, tensor_types=_TENSOR_TYPES_8_6, narrows_int64=True),
    ParserRelease("TensorRT 10.3", _TRT_10_3_OPS, (9, 20), integer_pow=False, dynamic_unsqueeze_axes=False),
    ParserRelease("TensorRT 11", _TRT_10_3_OPS | _ADDED_AFTER_10_3, (9, 25), integer_pow=True,
                  dynamic_unsqueeze_axes=True),
)
