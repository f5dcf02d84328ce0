# micro: see the Makefile. Fragments append to TEST_PREREQS (made before the
# main pytest run) and TEST_AFTER (targets run after it, still part of make test).
#
# TensorFlow Lite Micro's Python interpreter in its own TensorFlow-free venv,
# for edge_demo/runtimes/micro.py and tests/test_micro.py (KERAS_MHA_MICRO_PYTHON).
MICRO_VENV := .venv-edge-micro
MICRO_PY := $(MICRO_VENV)/bin/python

.PHONY: micro-venv
micro-venv: $(MICRO_VENV)/.installed
ifneq ($(MICRO_WHEEL),)
$(MICRO_VENV)/.installed: edge_demo/requirements-tflite-micro.txt | $(UV)
	test -x $(MICRO_PY) || $(PYTHON) -m venv $(MICRO_VENV)
	$(UV_INSTALL) $(MICRO_PY) $(EDGE_BYTECODE) -r edge_demo/requirements-tflite-micro.txt
	rm -f $(MICRO_VENV)/.skipped
	touch $@
else
.PHONY: $(MICRO_VENV)/.installed
$(MICRO_VENV)/.installed:
	$(call no_wheel,$(MICRO_VENV),TensorFlow Lite Micro,CPython 3.11 on x86_64 only)
endif

TEST_PREREQS += micro-venv
