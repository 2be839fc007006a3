# Every install step lives here: a fresh clone needs only `make demo` or `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
TORCH  := torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: setup demo test test-slow hostile lint cpp bench bench-anchor bench-hf bench-scale demo-model demo-model-modern clean serving-env optimum-env bench-serving browser

setup: $(STAMP)

# torch first (the CPU build), so the package's `torch>=2.6` is already met and no CUDA wheels are pulled.
# dev includes the rtx extra: TensorRT-RTX (~90 MB of wheels), a TensorRT builder that needs no GPU, which
# `tfm-export check` and the tests build every graph with.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

DEMO_ONNX := build/demo-onnx
DEMO_LOG  := build/demo.log

# The main job on the shipped model: export to ONNX, translate, and prove parity with PyTorch. Each step's output
# is shown and logged; the last line is the verdict of the four checks (scripts/demo_verdict.py).
demo: SHELL := /bin/bash
demo: .SHELLFLAGS := -o pipefail -c
demo: setup
	mkdir -p build && : > $(DEMO_LOG)
	$(VENV)/bin/tfm-export onnx --checkpoint models/demo/ckpt.pt --output $(DEMO_ONNX) --force
	$(VENV)/bin/tfm-export inspect --model $(DEMO_ONNX)
	$(VENV)/bin/tfm-run translate --model $(DEMO_ONNX) \
		"forty-two" "one thousand, two hundred and thirty-four" "nine hundred and ninety-nine thousand, nine hundred and ninety-nine"
	$(VENV)/bin/tfm-run translate --model $(DEMO_ONNX) --beam-size 4 --format jsonl "seventy-one thousand and eighty"
	$(VENV)/bin/tfm-export verify --model $(DEMO_ONNX) --checkpoint models/demo/ckpt.pt \
		--input models/demo/samples.en.txt | tee -a $(DEMO_LOG)
	$(VENV)/bin/tfm-export eval-demo --model $(DEMO_ONNX) | tee -a $(DEMO_LOG)
	$(VENV)/bin/tfm-export quantize --model $(DEMO_ONNX) --precision int8 --calibration calibration/demo.en.txt \
		--output build/demo-int8 --force
	$(VENV)/bin/tfm-export verify --model build/demo-int8 --input models/demo/samples.en.txt | tee -a $(DEMO_LOG)
	$(VENV)/bin/tfm-export check --model build/demo-int8 | tee -a $(DEMO_LOG)
	@$(PY) scripts/demo_verdict.py $(DEMO_LOG)

# The serving tests' tritonserver: nvidia-pytriton's bundled server, with tfm-export's runtime alone (no torch)
# for its Python backend. A venv of its own, since pytriton pins numpy<2. If it cannot be built, those tests skip.
SERVING_VENV  := .venv-serving
SERVING_STAMP := $(SERVING_VENV)/.installed
PYTRITON      := nvidia-pytriton==0.7.0

serving-env: $(SERVING_STAMP)

$(SERVING_STAMP): pyproject.toml
	$(PYTHON) -m venv $(SERVING_VENV)
	$(SERVING_VENV)/bin/python -m pip install --quiet $(PYTRITON) -e .
	touch $@

# Optimum (optimum-onnx, which needs transformers < 4.58) for the tests that load `tfm-export hf` directories with
# ORTModelForSeq2SeqLM: a venv of its own, with the onnxruntime the main venv runs. If it cannot be built, they skip.
OPTIMUM_VENV  := .venv-optimum
OPTIMUM_STAMP := $(OPTIMUM_VENV)/.installed
OPTIMUM       := optimum-onnx==0.1.0 onnxruntime==1.32.0

optimum-env: $(OPTIMUM_STAMP)

$(OPTIMUM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(OPTIMUM_VENV)
	$(OPTIMUM_VENV)/bin/python -m pip install --quiet $(TORCH)
	$(OPTIMUM_VENV)/bin/python -m pip install --quiet $(OPTIMUM)
	touch $@

# Two workers, each taking whole test files (module fixtures built once; the demo export and its precisions are
# shared by both). Left out: the hostile battery (tests/hostile, marked `hostile`: `make hostile`) and the cases
# marked `slow` (`make test-slow`): minutes of base-size exports or training, or cases make test covers otherwise.
test: setup browser
	-$(MAKE) serving-env
	-$(MAKE) optimum-env
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not hostile and not slow" --durations=20

# The cases make test leaves out for time (marked `slow`): the base-size exports and precisions (parity, the C++
# decode, int8 and fp16 sizes, TensorRT and Polygraphy checks of the base graphs), the constructed near-tie at base
# size, the modern variant at base size and as a trained demo, each variant option on its own (make test exports the
# combinations, which hold them all), the Hugging Face families whose exports make test decodes elsewhere (T5 v1.1
# beside mT5; M2M100's and mBART-cc25's language rules beside NLLB's and mBART-50's), two of the three seed
# checkpoint variants, opset 18 (of the seed model and of a variant), generate.onnx of the modern variant (the
# T5-like one stays), the export under a too-old onnxruntime, the README run on a fresh clone, the serving page run
# as written, the make bench script, a bench run of a modern model, and the Hugging Face bench timing and anchor.
test-slow: setup
	$(PY) -m pytest -q -n 2 --dist loadfile -m "slow and not hostile"

# The adversarial battery (docs/security.md, "How this was tried"): 879 cases that use the installed tfm-export and
# tfm-run the way a hostile or unlucky user would, each in a scratch tree watched for writes outside its outputs.
# Two workers, each building its own fixtures: 55 minutes on this 2-core machine beside other jobs (load 7-11).
# `pytest tests/hostile -k NAME` runs a part, `--collect-only -q` lists the cases; HOSTILE_TIMEOUT (seconds,
# default 300) is how long a command may run before it counts as a hang.
hostile: setup
	$(PY) -m pytest tests/hostile -q -m hostile -n 2

# Debian's headless Chromium for examples/web's test (as root, else with sudo -n); where it cannot be installed
# the test skips and says why.
browser:
	@command -v chromium >/dev/null || { command -v apt-get >/dev/null && \
		$$([ "$$(id -u)" = 0 ] || echo sudo -n) sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends chromium >/dev/null'; } || \
		echo "chromium could not be installed: tests/examples/test_web_example.py will skip"

lint: setup
	$(VENV)/bin/ruff check tfm_export tests

# The C++ example (examples/cpp, docs/embedding.md) against ONNX Runtime, nothing installed into the system: Debian's
# ONNX Runtime headers, nlohmann-json and OpenSSL fetched into build/ through private apt directories, the onnxruntime
# wheel's library beside them, CMake in build/cpp. Prints the binary's path. The C++ tests
# (tests/examples/test_cpp_*.py) run the same script.
cpp: setup
	@$(PY) scripts/build_cpp.py

BENCH := build/bench
# Speed and memory against CTranslate2 (the targets in docs/benchmarks.md): the shipped demo model and a random
# base-config model (d_model 512, 6+6 layers, vocab 32,000), each backend in a fresh process with both cores, and
# CTranslate2 with one as well (on some machines, or under other jobs' load, it is faster so: the targets take it at
# its faster setting in each cell and round), rounds interleaved; ends with the targets table and a plot
# (tfm_export/benchmarks/plot.py). 20-45 minutes on 2 cores. The demo model's steps are tiny, so its cells repeat for at
# least a second each.
# `tfm-run bench` is the same measurement for one model in one pass, with plots. On the demo model the C++
# example's loop (`make cpp`; left out, saying why, where it cannot be built) is timed too: its steps are where
# Python's per-step cost shows.
BENCH_CELLS := --lengths 64,128 --batch-sizes 1,8,32 --beam-sizes 1,4 --threads 2
# CTranslate2 also at one thread: on some machines it is faster so, and the targets take it at its best setting
BENCH_BACKENDS := ort-fp32,ct2-fp32,ct2-fp32+threads=1,ort-int8-dynamic,ct2-int8,ct2-int8+threads=1
bench: setup
	mkdir -p $(BENCH)
	-@$(PY) scripts/build_cpp.py
	$(VENV)/bin/tfm-export random-checkpoint --output $(BENCH)/base-model --force
	$(PY) -m tfm_export.benchmarks.interleaved --model models/demo/ckpt.pt --work-dir $(BENCH)/demo $(BENCH_CELLS) \
		--backends $(BENCH_BACKENDS),cpp --rounds 3 --repeats 3 --min-time 1 --json $(BENCH)/demo.json > $(BENCH)/demo.md
	$(PY) -m tfm_export.benchmarks.interleaved --model $(BENCH)/base-model/ckpt.pt --work-dir $(BENCH)/base $(BENCH_CELLS) \
		--backends $(BENCH_BACKENDS) --rounds 3 --repeats 1 --min-time 0 --json $(BENCH)/base.json > $(BENCH)/base.md
	$(PY) -m tfm_export.benchmarks.interleaved --targets demo=$(BENCH)/demo.json base=$(BENCH)/base.json > $(BENCH)/targets.md
	$(PY) -m tfm_export.benchmarks.fixed_shapes --model $(BENCH)/demo/onnx-fp32 > $(BENCH)/fixed-shapes.md
	rm -f $(BENCH)/startup.md
	for m in base demo; do for p in fp32:float32 int8-dynamic:int8; do \
		$(PY) -m tfm_export.benchmarks.startup --ort $(BENCH)/$$m/onnx-$${p%%:*} --ct2 $(BENCH)/$$m/ctranslate2 \
			--ct2-compute-type $${p##*:} --ct2-threads 2,1 --variant off:TFM_PREPACKED_GRAPHS=off --rounds 5 \
			>> $(BENCH)/startup.md || exit 1; \
	done; done
	for p in fp32 int8-dynamic; do \
		$(PY) -m tfm_export.benchmarks.prepacked_steps --model $(BENCH)/base/onnx-$$p --rounds 9 >> $(BENCH)/startup.md || exit 1; done
	$(PY) -m tfm_export.benchmarks.plot --output $(BENCH)/bench.png demo=$(BENCH)/demo.json base=$(BENCH)/base.json
	cat $(BENCH)/demo.md $(BENCH)/base.md $(BENCH)/targets.md $(BENCH)/fixed-shapes.md $(BENCH)/startup.md

# The contract's decoder_step (whole-cache Concat) beside decoder_step_search and CTranslate2, base config, 64 tokens.
bench-anchor: setup
	mkdir -p $(BENCH)
	$(VENV)/bin/tfm-export random-checkpoint --output $(BENCH)/base-model --force
	$(PY) -m tfm_export.benchmarks.interleaved --model $(BENCH)/base-model/ckpt.pt --work-dir $(BENCH)/il \
		--rounds 3 --lengths 64 --batch-sizes 1,8,32 --beam-sizes 1,4 --repeats 2 --min-time 0 --threads 1 \
		--backends ort-fp32,ct2-fp32,ort-int8-dynamic,ct2-int8,ort-fp32-contract --json $(BENCH)/il.json

# Large models beside CTranslate2 (docs/benchmarks.md, "Large models"): NLLB-200 600M's and 1.3B's shapes in the seed
# architecture and an M2M100 directory of 1.3B's shape in sharded safetensors (random weights, made once in
# build/scale: 20 GB of disk with the outputs), each through export, verify, int8 and a first translation, and
# CTranslate2's converter and translator on the same weights, interleaved, two rounds (the first on a cold page cache
# where this machine lets us drop it); then the decoding speed grid at 1.3B, on the 1.3B export just made (its own
# int8 and CTranslate2 conversion beside it: 8 GB more disk). 1.5-2 hours on 2 cores.
SCALE := build/scale
SCALE_MODELS ?= nllb-600m,nllb-1.3b,m2m100-1.3b
bench-scale: setup
	mkdir -p $(SCALE)
	$(PY) -m tfm_export.benchmarks.scale --work-dir $(SCALE) --models $(SCALE_MODELS) --rounds 2 --json $(SCALE)/scale.json \
		> $(SCALE)/scale.md
	$(PY) -m tfm_export.benchmarks.interleaved --model $(SCALE)/nllb-1.3b/ckpt.pt --fp32-dir $(SCALE)/nllb-1.3b-onnx \
		--work-dir $(SCALE)/il-1.3b \
		--lengths 64 --batch-sizes 1,32 --beam-sizes 1,4 --threads 2 --rounds 1 --repeats 1 --min-time 0 \
		--backends ort-fp32,ct2-fp32,ct2-fp32+threads=1,ort-int8-dynamic,ct2-int8,ct2-int8+threads=1 \
		--json $(SCALE)/speed-1.3b.json > $(SCALE)/speed-1.3b.md
	cat $(SCALE)/scale.md $(SCALE)/speed-1.3b.md

# ONNX Runtime against CTranslate2 on the same Hugging Face weights: a random opus-mt-en-de-shaped Marian directory
# (tfm_export/benchmarks/marian_shape.py), two interleaved rounds, one thread each (docs/benchmarks-history.md).
bench-hf: setup
	mkdir -p $(BENCH)
	$(PY) -m tfm_export.benchmarks.marian_shape --output $(BENCH)/opus-like
	$(PY) -m tfm_export.benchmarks.interleaved --model $(BENCH)/opus-like --work-dir $(BENCH)/il-opus \
		--rounds 2 --lengths 64 --batch-sizes 1,8 --beam-sizes 1,4 --repeats 2 --min-time 0 --threads 1 \
		--backends ort-fp32,ct2-fp32,ort-int8-dynamic,ct2-int8 --json $(BENCH)/il-opus.json

# The translator layout on a real tritonserver under concurrent load, beside in-process tfm-run; see docs/benchmarks.md.
bench-serving: setup serving-env
	mkdir -p $(BENCH)
	$(PY) -m tfm_export.benchmarks.serving_load --serving-python $(SERVING_VENV)/bin/python --work-dir $(BENCH)/serving \
		--markdown $(BENCH)/serving.md

# Retrain the shipped demo model (8-14 minutes on 2 CPU cores; bit-identical weights).
demo-model: setup
	$(VENV)/bin/tfm-export train-demo --output models/demo --force
	$(VENV)/bin/tfm-export eval-demo --model models/demo/ckpt.pt

# Retrain the "modern" demo model (pre-norm + RMSNorm + SwiGLU + RoPE), one thread so reruns give the same weights.
demo-model-modern: setup
	$(VENV)/bin/tfm-export train-demo --preset modern --threads 1 --output models/demo-modern --force
	$(VENV)/bin/tfm-export eval-demo --model models/demo-modern/ckpt.pt

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
