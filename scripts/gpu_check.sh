#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and TensorRT (10.x or 11.x): build the demo model's fp16 and int8 engines,
# compare them with ONNX Runtime (Polygraphy) and with fp32 PyTorch on the 1,000 held-out numbers, then time
# them beside the other backends; then the same parity for TensorRT-RTX engines where the GPU is one that
# TensorRT-RTX runs on. Exits non-zero when a check fails.
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
