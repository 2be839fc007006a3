#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: first ONNX Runtime CUDA (onnxruntime-gpu), decoder_step_search with its
# whole cache on the device and no PyTorch, against the CPU on the 1,000 held-out numbers, and `tfm-run bench
# --device cuda` beside transformers' generate() (fp32 and fp16, same weights, GPU step floor); then, where TensorRT
# (10.x or 11.x) is installed, build the demo model's fp16 and int8 engines, compare them with ONNX Runtime
# (Polygraphy) and with fp32 PyTorch, time them beside the other backends, and the same parity for TensorRT-RTX
# engines where the GPU is one that TensorRT-RTX runs on. Exits non-zero when a check fails.
#
# What CPU machines prove without this script: TensorRT-RTX (the rtx extra, installed by `make setup`) parses
# every TensorRT-ready graph into a strongly typed network and builds it at `tfm-export trt`'s profiles
# (`tfm-export check`, `make test`), and `tfm-export trt --target rtx` writes engine directories. That is one
# real parser and builder of TensorRT's family, not the ones deployments use: TensorRT 8.6 (JetPack 6.0), 10.3
# (JetPack 6.1/6.2) and 11 have not built these graphs (their verdicts come from the parsers' op lists), and no
# engine has run or been compared with PyTorch. This script is where those happen (docs/tensorrt.md).
#
#   make setup && .venv/bin/pip install 'tensorrt>=10.3' ...   # TensorRT from NVIDIA's package index
#   scripts/gpu_check.sh [OUT_DIR]                              # default build/gpu-check
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-build/gpu-check}
BIN=${TFM_BIN:-.venv/bin}
HELDOUT=models/demo/heldout.en.txt
mkdir -p "$OUT"

step() { printf '\n== %s\n' "$*"; }

# parity PREFIX: $OUT/PREFIX-{fp32,fp16,int8}.txt against fp32 PyTorch, at the floors `tfm-export verify` holds.
parity() {
    "$BIN/python" - "$OUT" "$1" <<'PY'
import sys
from pathlib import Path
out, prefix = Path(sys.argv[1]), sys.argv[2]
want = (out / "torch.txt").read_text(encoding="utf-8").splitlines()
from tfm_export.graphs.parity import MIN_AGREEMENT as floors  # the floors `tfm-export verify` holds
failed = []
for precision, floor in floors.items():
    got = (out / f"{prefix}-{precision}.txt").read_text(encoding="utf-8").splitlines()
    same = sum(g == w for g, w in zip(got, want, strict=True))
    verdict = "ok" if same / len(want) >= floor else "FAILED"
    print(f"{prefix} {precision}: {same}/{len(want)} greedy outputs identical to fp32 PyTorch "
          f"({100 * same / len(want):.1f}%, floor {100 * floor:.1f}%) {verdict}")
    if verdict != "ok":
        failed.append(precision)
sys.exit(1 if failed else 0)
PY
}

step "graphs: fp32 export, fp16 and int8 static (calibrated) variants"
"$BIN/tfm-export" onnx --checkpoint models/demo/ckpt.pt --output "$OUT/onnx" --force
"$BIN/tfm-export" quantize --model "$OUT/onnx" --precision fp16 --output "$OUT/fp16" --force
"$BIN/tfm-export" quantize --model "$OUT/onnx" --precision int8 --calibration calibration/demo.en.txt \
    --output "$OUT/int8" --force

step "ONNX Runtime CUDA: the held-out numbers on the GPU against the CPU (fp32 greedy and beam 4, fp16 greedy)"
if [ "$("$BIN/python" -c "from tfm_export.runtime.session import has_cuda_provider; print(int(has_cuda_provider()))")" != 1 ]; then
    echo "this onnxruntime has no CUDAExecutionProvider: ONNX Runtime CUDA not checked"
else
    for beam in 1 4; do
        "$BIN/tfm-run" translate --model "$OUT/onnx" --beam-size $beam --input "$HELDOUT" --output "$OUT/cpu-b$beam.txt"
        TIMEFORMAT="cuda fp32 beam $beam: %R s for 1,000 numbers, process start included"
        time "$BIN/tfm-run" translate --model "$OUT/onnx" --device cuda --beam-size $beam --input "$HELDOUT" \
            --output "$OUT/cuda-b$beam.txt"
        cmp "$OUT/cpu-b$beam.txt" "$OUT/cuda-b$beam.txt" && echo "cuda fp32 beam $beam: identical to the CPU"
    done
    "$BIN/tfm-run" translate --model "$OUT/fp16" --device cuda --input "$HELDOUT" --output "$OUT/cuda-fp16.txt"
    "$BIN/python" - "$OUT" <<'PY'
import sys
from pathlib import Path
out = Path(sys.argv[1])
from tfm_export.graphs.parity import MIN_AGREEMENT
got, want = ((out / n).read_text(encoding="utf-8").splitlines() for n in ("cuda-fp16.txt", "cpu-b1.txt"))
same = sum(g == w for g, w in zip(got, want, strict=True))
print(f"cuda fp16: {same}/{len(want)} identical to fp32 on the CPU (floor {100 * MIN_AGREEMENT['fp16']:.1f}%)")
sys.exit(same / len(want) < MIN_AGREEMENT["fp16"])
PY
    step "GPU timing: tfm-run on the device against transformers' generate(), same weights (opus-mt-shaped Marian)"
    "$BIN/python" scripts/opus_like_marian.py --output "$OUT/opus-like"
    "$BIN/tfm-run" bench --device cuda --model "$OUT/opus-like" --work-dir "$OUT/bench-gpu" \
        --backends ort-fp32,ort-fp16,hf-generate,hf-generate-fp16 --batch-sizes 1,32,128 --beam-sizes 1,4 \
        --output-length 64 --repeats 3 --min-time 1 --json "$OUT/bench-gpu.json" --markdown "$OUT/bench-gpu.md"
fi

missing=$("$BIN/python" -c "from tfm_export.runtime.tensorrt_platform import missing_reason; print(missing_reason() or '')")
if [ -n "$missing" ]; then
    echo "TensorRT not checked: $missing"
    exit 0
fi

step "Polygraphy: TensorRT against ONNX Runtime on generated inputs, per graph and precision"
for dir in onnx fp16 int8; do
    "$BIN/tfm-export" check --model "$OUT/$dir" --trt
done

step "engines (one shared timing cache)"
"$BIN/tfm-export" trt --model "$OUT/onnx" --output "$OUT/engines-fp32" --timing-cache "$OUT/timing.cache" --force
"$BIN/tfm-export" trt --model "$OUT/onnx" --fp16 --output "$OUT/engines-fp16" --timing-cache "$OUT/timing.cache" --force
"$BIN/tfm-export" trt --model "$OUT/int8" --int8 --output "$OUT/engines-int8" --timing-cache "$OUT/timing.cache" --force

step "parity: greedy translations of the held-out numbers against fp32 PyTorch"
"$BIN/tfm-run" translate --model models/demo/ckpt.pt --backend torch --input "$HELDOUT" --output "$OUT/torch.txt"
for precision in fp32 fp16 int8; do
    "$BIN/tfm-run" translate --model "$OUT/engines-$precision" --input "$HELDOUT" --output "$OUT/trt-$precision.txt"
done
parity trt
for precision in fp32 fp16 int8; do
    "$BIN/tfm-export" eval-demo --model "$OUT/engines-$precision"
done

step "timing: every backend side by side (demo model, 64 forced tokens)"
"$BIN/tfm-run" bench --model models/demo/ckpt.pt --input models/demo/samples.en.txt \
    --calibration calibration/demo.en.txt --backends torch-cache,ort-fp32,ort-fp16,tensorrt,ct2-fp32 \
    --output-length 64 --json "$OUT/bench.json" --markdown "$OUT/bench.md"

step "TensorRT-RTX engines, built without the GPU (they run on compute capability 8.0, 8.6, 8.9, 12.0+)"
"$BIN/tfm-export" trt --model "$OUT/onnx" --target rtx --output "$OUT/rtx-engines-fp32" --force
"$BIN/tfm-export" trt --model "$OUT/onnx" --target rtx --fp16 --output "$OUT/rtx-engines-fp16" --force
"$BIN/tfm-export" trt --model "$OUT/int8" --target rtx --int8 --output "$OUT/rtx-engines-int8" --force
reason=$("$BIN/python" -c "from tfm_export.runtime.tensorrt_platform import missing_reason; print(missing_reason('rtx') or '')")
if [ -n "$reason" ]; then
    echo "TensorRT-RTX engines not run here: $reason"  # Hopper (9.0), for one: TensorRT-RTX refuses it
else
    for precision in fp32 fp16 int8; do
        "$BIN/tfm-run" translate --model "$OUT/rtx-engines-$precision" --input "$HELDOUT" \
            --output "$OUT/rtx-$precision.txt"
    done
    parity rtx
fi
