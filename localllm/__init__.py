"""localllm: run quantized GGUF language models locally.

Nothing happens at import: no environment changes, no threads, no compilation.
"""

__version__ = "0.1.0"
