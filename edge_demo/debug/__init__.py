"""The quantization debugger: where a mode loses accuracy, tensor by tensor.

`debugger` (the comparison, on LiteRT's builtin kernels) and `cli`
(`keras-mha-edge BUNDLE --debug MODE`). Imports `contract`, `runtimes`,
`tables` and `errors`.
"""
