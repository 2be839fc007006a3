#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and TensorRT (10.x or 11.x): build the demo model's fp16 and int8 engines,
# compare them with ONNX Runtime (Polygraphy) and with fp32 PyTorch on the 1,000 held-out numbers, then time
# them beside the other backends. Exits non-zero when a check fails.
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
"$BIN/python" - "$OUT" <<'EOF'
import sys
from pathlib import Path
out = Path(sys.argv[1])
want = (out / "torch.txt").read_text(encoding="utf-8").splitlines()
from tfm_export.graphs.parity import MIN_AGREEMENT as floors  # the floors `tfm-export verify` holds
failed = []
for precision, floor in floors.items():
    got = (out / f"trt-{precision}.txt").read_text(encoding="utf-8").splitlines()
    same = sum(g == w for g, w in zip(got, want, strict=True))
    verdict = "ok" if same / len(want) >= floor else "FAILED"
    print(f"TensorRT {precision}: {same}/{len(want)} greedy outputs identical to fp32 PyTorch "
          f"({100 * same / len(want):.1f}%, floor {100 * floor:.1f}%) {verdict}")
    if verdict != "ok":
        failed.append(precision)
sys.exit(1 if failed else 0)
EOF
for precision in fp32 fp16 int8; do
    "$BIN/tfm-export" eval-demo --model "$OUT/engines-$precision"
done

step "timing: every backend side by side (demo model, 64 forced tokens)"
"$BIN/tfm-run" bench --model models/demo/ckpt.pt --input models/demo/samples.en.txt \
    --calibration calibration/demo.en.txt --backends torch-cache,ort-fp32,ort-fp16,tensorrt,ct2-fp32 \
    --output-length 64 --json "$OUT/bench.json" --markdown "$OUT/bench.md"
