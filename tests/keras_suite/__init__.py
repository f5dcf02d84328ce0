"""Keras's own MultiHeadAttention tests against ours (run.py). A package, so that
its conftest imports as keras_suite.conftest and does not shadow tests/conftest.py
(`from conftest import REPO` in a test module)."""
