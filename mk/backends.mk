# backends: the layer on every Keras backend (docs/layer.md).
#   .venv-jax    jax + keras + numpy + pytest + this package (`pip install -e .`,
#                no extras: proves `import keras_mha` needs no TensorFlow)
#   .venv-torch  the same with PyTorch's CPU build (torch==2.13.0 is on local
#                disk; plain `torch` would pull a multi-GB CUDA build)
# `make test` runs the layer tests and Keras's own MultiHeadAttention test
# file against our layer on TensorFlow (.venv), JAX and PyTorch
# (tests/keras_suite/run.py prints "backend: N passed, M failed, K excluded").
# A backend venv that cannot be installed is reported as SKIPPED with the
# reason (its .failed file), never silently.
JAX_VENV := .venv-jax
TORCH_VENV := .venv-torch
BACKEND_DEPS := setup.cfg pyproject.toml

.PHONY: backend-venvs test-backends bench-backends

backend-venvs:
	-@$(MAKE) --no-print-directory $(JAX_VENV)/.installed
	-@$(MAKE) --no-print-directory $(TORCH_VENV)/.installed

# $(call backend_venv,DIR,PACKAGES): create DIR, install PACKAGES and the layer.
# On failure the reason goes to DIR/.failed and the stamp is not written.
define backend_venv
	@rm -f $(1)/.failed
	@{ test -x $(1)/bin/python || $(PYTHON) -m venv $(1); } \
	 && $(1)/bin/python -m pip install -q --upgrade pip \
	 && $(1)/bin/python -m pip install -q $(2) keras numpy pytest absl-py \
	 && $(1)/bin/python -m pip install -q -e . \
	 && touch $(1)/.installed \
	 || { mkdir -p $(1); echo "pip install $(2) failed in $(1) (see the output above)" > $(1)/.failed; \
	      echo "$(1): install FAILED, its tests will be reported as SKIPPED" >&2; exit 1; }
endef

$(JAX_VENV)/.installed: $(BACKEND_DEPS)
	$(call backend_venv,$(JAX_VENV),jax jaxlib)

$(TORCH_VENV)/.installed: $(BACKEND_DEPS)
	$(call backend_venv,$(TORCH_VENV),torch==2.13.0)

# Layer tests + Keras's suite on the three backends; one summary line each.
test-backends: install
	$(PY) tests/keras_suite/run.py

bench-backends: install backend-venvs
	nice -n 10 $(PY) tests/keras_suite/run.py --bench --json benchmarks/results/attention_backends.json

TEST_PREREQS += backend-venvs
TEST_AFTER += test-backends
