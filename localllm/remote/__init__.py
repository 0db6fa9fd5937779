"""Remote engines: the same `chat`, `run`, `bench` and `localllm.load(...)` on a model that another engine
serves over an OpenAI-compatible API (vLLM, llama.cpp's llama-server, TGI, another `localllm serve`).

    config.py        the config file's remotes and routes; `remote:` references
    client.py        HTTP to one remote: requests, server-sent events, errors as one line each
    model.py         RemoteModel: `generate` yields the events a local Model's does
    conversation.py  `localllm chat` on a remote model
    routing.py       a model name -> a local file or a remote, with fallbacks
    bench.py         `localllm bench` on a remote model

docs/remote.md says what is forwarded and what is refused. Nothing here runs at import.
"""
