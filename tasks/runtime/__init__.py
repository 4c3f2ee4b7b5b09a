"""The runtime floor under the task definitions: what runs a model and knows no task.

Bundle loading and verification (`bundle.py`), ONNX Runtime sessions and the weights they share (`onnx_session.py`,
`onnx_weights.py`, over the protobuf reader `protobuf_wire.py`), the one inference path (`inference.py`: batches by
length, padding with `batching.py`), the tokenizer wrapper (`tokenizer.py`), grapheme-safe span ends
(`graphemes.py`), the usable-core count (`cpu.py`), the task spec record (`spec.py`), the progress reporter
(`progress.py`) and the version (`version.py`). Nothing here imports a task definition (an import-linter contract in
pyproject.toml says so).
"""
