"""The backends' names, as `--backend`, the benchmarks and the door spell them: one concrete backend per file of
runtime/backends, and onnxruntime, which is not a backend of its own but ONNX Runtime's step backend picked for the
directory and device (backends.default_for). Apart from the door so that naming a backend imports no library."""

CONCAT = "onnxruntime-concat"  # the contract's decoder_step, its cache fed back as arrays (backends/concat.py)
INPLACE = "onnxruntime-inplace"  # decoder_step_search, its cache in host buffers written in place (inplace.py)
DEVICE = "onnxruntime-device"  # decoder_step_search, all decode memory on the device (device.py)
GENERATE = "onnxruntime-generate"  # generate.onnx: the whole search in one call (generate.py)
TENSORRT = "tensorrt"  # TensorRT engines (tensorrt.py)
TORCH = "torch"  # the PyTorch reference model (reference.py)
ONNXRUNTIME = "onnxruntime"
STEP_BACKENDS = (CONCAT, INPLACE, DEVICE)  # ONNX Runtime's step backends: the search loop over a step graph
DEFAULT_DEVICES = {TENSORRT: "cuda"}  # every other backend: the CPU
