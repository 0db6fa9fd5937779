"""localllm: run quantized GGUF language models locally.

    import localllm
    model = localllm.load()                      # the built-in Gemma 3 270M, or a path / name
    for event in model.generate("The capital of France is", max_tokens=16, temperature=0):
        print(event.text, end="")

Nothing happens at import: no environment changes, no threads, no compilation.
"""

__version__ = "0.1.0"


def load(*args, **kwargs):
    """See localllm.api.load."""
    from .api import load as _load

    return _load(*args, **kwargs)


def estimate_memory(*args, **kwargs):
    from .api import estimate_memory as _estimate

    return _estimate(*args, **kwargs)
