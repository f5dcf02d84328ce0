# arm64: see the Makefile. Fragments append to TEST_PREREQS (made before the
# main pytest run) and TEST_AFTER (targets run after it, still part of make test).
#
# make test-arm64 (root; not part of make test): the edge demo inside an
# emulated Debian bookworm arm64 userland, as a Raspberry Pi 4 (cortex-a72)
# and a Pi 5 (cortex-a76) CPU, both at once (each float mode on one of them,
# every integer mode on both: summary.py's float_cpu), on a digits bundle, a
# pronouns bundle in every mode (+ one --text call), all-MiniLM-L6-v2's encoder bundle in dynamic-range
# mode (+ one --text search) and a small cross-encoder in every mode but
# int16x8 (+ one --pair and one --rerank; .ci/arm64/reranker.py writes the
# checkpoint with numpy), each trained or imported and exported here first (the
# app's other commands, --text, --embed, --pair, --rerank, run once each, on the CPUs
# in turn: test.sh's extra_cpu). Gates on
# the edge demo's exit codes (the manifest's thresholds) and on the raw
# outputs against x86-64 (.ci/arm64/summary.py's RAW_BOUNDS: int16x8
# bit-identical, float32/float16 within 4e-6, dynamic within 1/256, int8
# within measured bounds),
# never on timings. Writes $(ARM64_RESULTS)/tables.md (the README's tables)
# and $(ARM64_RESULTS)/summary.json ({"suite": "arm64", "passed": N,
# "failed": N, "skipped": 0}), also when a run fails.
# The root file system is cached in ARM64_CACHE, keyed on
# .ci/arm64/build-rootfs.sh's sha256 (first build about a minute).
ARM64_WORK ?= .cache/arm64
ARM64_CPUS ?= cortex-a72 cortex-a76
ARM64_CACHE ?= /var/cache/keras-mha
ARM64_SENTENCE ?= the model didn't work with the laptop because it was too complex
ARM64_QUERY ?= Will it rain in the hills tomorrow?
ARM64_RESULTS := $(ARM64_WORK)/results
# The emulated run (tests/test_arm64_scripts.py puts a stand-in here).
ARM64_TEST_SH ?= .ci/arm64/test.sh
# digits: a small run (one encoder block, d_model 16, 2 heads, 20 epochs, ~1 min).
# pronouns: the default model (2 blocks, d_model 32, ~3 min): smaller ones stay
# near chance (0.40-0.53 measured), and an undecided model's int8 top-1 flips
# (agreement 0.97), so export refuses it.
# The pronouns bundle also in int16x8 (ai-edge-quantizer, export/aeq.py: int16
# activations, int8 weights; what an Ethos-U85 runs whole), gated bit-identical.
ARM64_TEXT_MODES := float32,dynamic,float16,int8
ARM64_PRONOUNS_MODES := $(ARM64_TEXT_MODES),int16x8
ARM64_TEXT_ROWS := 300
ARM64_RERANKER_ROWS := 200
ARM64_DIGITS_TRAIN := --epochs 20 --no-augment --d-model 16 --num-heads 2 --num-layers 1 --ff-dim 32

.PHONY: test-arm64 arm64-bundles arm64-rootfs arm64-prepare
arm64-bundles: $(ARM64_WORK)/digits/bundle/manifest.json $(ARM64_WORK)/pronouns/bundle/manifest.json $(ARM64_WORK)/encoder/bundle/manifest.json $(ARM64_WORK)/reranker/bundle/manifest.json

# The root file system alone (root; cached in ARM64_CACHE), and everything
# test-arm64 needs before its emulated run: .ci/run starts arm64-prepare in the
# background beside make test, so the root file system and the four
# bundles overlap the main test run instead of following it.
arm64-rootfs: $(VENV)/.installed
	ARM64_CACHE="$(ARM64_CACHE)" HOST_PYTHON="$(abspath $(PY))" bash .ci/arm64/rootfs.sh >/dev/null
arm64-prepare: arm64-rootfs arm64-bundles

# encoder: all-MiniLM-L6-v2 (keras-mha-import), dynamic range only (the float
# modes take minutes per CPU under emulation; they are gated on x86-64 by make test).
# 32 eval sentences, not the default 389 of the corpus's 489 (--calibration 457 keeps the rest for
# calibration, which dynamic range does not use): each takes about 1.5 s on an
# emulated core with its view, and what ARM can show (its kernels' outputs against
# x86-64's, the manifest's thresholds) 32 sentences show as 389 do: 12,288 values
# compared, at word pieces from a few to over fifty.
$(ARM64_WORK)/encoder/bundle/manifest.json: | $(VENV)/.installed
	nice -n 10 $(PY) -m keras_mha.pretrained all-MiniLM-L6-v2 --out $(ARM64_WORK)/encoder --calibration 457 --overwrite
	nice -n 10 $(PY) -m keras_mha_export $(ARM64_WORK)/encoder --out $(ARM64_WORK)/encoder/bundle --quant dynamic --overwrite

# reranker: a random BERT cross-encoder (2 layers x 4 heads, d_model 64) with
# MiniLM's tokenizer: pairs with token types, a score each, ranking parity. Its
# first 10 queries of 20 passages (200 pairs, ARM64_RERANKER_ROWS) of the 30 the
# import makes: every pair is a whole forward pass of up to 115 tokens in each
# mode, about 0.2 s emulated, and 200 scores a mode compare the kernels as 600 do.
$(ARM64_WORK)/reranker/bundle/manifest.json: | $(VENV)/.installed
	PYTHONPATH=. nice -n 10 $(PY) .ci/arm64/reranker.py $(ARM64_WORK)/reranker-checkpoint
	nice -n 10 $(PY) -m keras_mha.pretrained $(ARM64_WORK)/reranker-checkpoint --out $(ARM64_WORK)/reranker-run --overwrite
	rm -rf $(ARM64_WORK)/reranker && PYTHONPATH=. $(PY) .ci/arm64/first_rows.py $(ARM64_WORK)/reranker-run $(ARM64_WORK)/reranker $(ARM64_RERANKER_ROWS)
	nice -n 10 $(PY) -m keras_mha_export $(ARM64_WORK)/reranker --out $(ARM64_WORK)/reranker/bundle --quant $(ARM64_TEXT_MODES) --overwrite

$(ARM64_WORK)/digits/bundle/manifest.json: | $(VENV)/.installed
	nice -n 10 $(PY) -m keras_mha.train --dataset digits --out $(ARM64_WORK)/digits $(ARM64_DIGITS_TRAIN) --overwrite --quiet
	nice -n 10 $(PY) -m keras_mha_export $(ARM64_WORK)/digits --out $(ARM64_WORK)/digits/bundle --overwrite

# pronouns: its first 300 eval sentences (ARM64_TEXT_ROWS) of 1,500, each at
# 16 tokens in five modes with the view: 4,800 tokens' outputs per mode show
# the kernels against x86-64's as 24,000 do, in a fifth of the emulated time.
$(ARM64_WORK)/pronouns/bundle/manifest.json: | $(VENV)/.installed
	nice -n 10 $(PY) -m keras_mha.train --dataset pronouns --out $(ARM64_WORK)/pronouns-run --overwrite --quiet
	rm -rf $(ARM64_WORK)/pronouns && PYTHONPATH=. $(PY) .ci/arm64/first_rows.py $(ARM64_WORK)/pronouns-run $(ARM64_WORK)/pronouns $(ARM64_TEXT_ROWS)
	nice -n 10 $(PY) -m keras_mha_export $(ARM64_WORK)/pronouns --out $(ARM64_WORK)/pronouns/bundle --quant $(ARM64_PRONOUNS_MODES) --overwrite

test-arm64: $(VENV)/.installed $(EDGE_VENV)/.installed arm64-bundles
	@test "$$(id -u)" = 0 || { echo "make test-arm64: needs root (chroot, mount); make test does not" >&2; exit 2; }
	rm -rf $(ARM64_RESULTS) && mkdir -p $(ARM64_RESULTS)
	@# x86-64 reference: the same bundles in this machine's LiteRT; then the emulated
	@# run (on a good reference only); then the gate, which runs even when a step before
	@# it failed, so that summary.json always says how the run went.
	status=0; start=$$(date +%s); \
	for b in digits pronouns encoder reranker; do \
	  n=$$([ $$b = pronouns ] && echo text || echo $$b); \
	  $(EDGE_PY) -m edge_demo $(ARM64_WORK)/$$b/bundle --json $(ARM64_RESULTS)/x86-64-$$n.json --raw $(ARM64_RESULTS)/x86-64-$$n-raw.npz >/dev/null || status=1; \
	done; \
	if [ $$status = 0 ]; then \
	  ARM64_CPUS="$(ARM64_CPUS)" ARM64_CACHE="$(ARM64_CACHE)" HOST_PYTHON="$(abspath $(PY))" \
	    nice -n 10 bash $(ARM64_TEST_SH) $(ARM64_RESULTS) $(ARM64_WORK)/digits/bundle $(ARM64_WORK)/pronouns/bundle $(ARM64_WORK)/encoder/bundle $(ARM64_WORK)/reranker/bundle "$(ARM64_SENTENCE)" "$(ARM64_QUERY)" || status=$$?; \
	fi; \
	$(EDGE_PY) .ci/arm64/summary.py $(ARM64_RESULTS) $(ARM64_CPUS) --run-status $$status \
	  --seconds $$(( $$(date +%s) - start )) \
	  --tables $(ARM64_RESULTS)/tables.md --json $(ARM64_RESULTS)/summary.json || [ $$status != 0 ] || status=1; \
	exit $$status
