"""The bundle contract: the files a bundle holds and what each must be (docs/artifacts.md).

What the exporter writes and the device reads, one definition each: `tasks`
(what a bundle is for, one module a task: its eval arrays, its own files,
how a mode is judged and described; everyone asks the task), `manifest`
and `entries` (manifest.json as dataclasses), `deploy` (a mode's deploy file),
`tensors` (TensorSpec, the one quantize / dequantize), `parity` and
`attention_parity` (figures, thresholds, the one threshold check), `attention`
(attention.npz, the attention output names), `vocab` (vocab.json, the one
Vocab), `arrays` (eval.npz and calibration checks), `lists` (labels.json,
texts.json), `files` (atomic writes,
in-bundle reads, `check_writable`), `fields` (typed JSON access) and `bundle`
(`open_bundle`: a bundle's files opened and checked).

Also `errors`: the error policy of every keras-mha command (UsageError,
`run_main`: one line, exit 2).

numpy and the standard library only (`subwords`: Hugging Face `tokenizers`,
imported when a WordPiece bundle is read). Imports nothing of keras_mha,
the exporter or the device app: they all import it (tests/test_import_graph.py).
"""
