"""The model layer: how coder talks to a language model.

    provider.py   the provider seam (a small Protocol) and its value types (messages, tool
                  calls, usage, model facts)
    usage.py      what model calls cost (Usage), light enough for reading a run's state
    streaming.py  the base of the providers: a chat streamed, retried, its failures named,
                  its usage counted; a provider is three hooks (request, stream, read)
    ollama.py     the Ollama provider (the official `ollama` client)
    openai.py     the OpenAI-compatible provider (llama.cpp, vLLM, SGLang, LM Studio, ...)
    replay.py     record a run's model replies, or answer from a recording
    factory.py    the one place providers are built from the config (one entry per provider)
    router.py     several endpoints behind one model source: affinity, spreading, failover
    slots.py      an endpoint's slots: how many requests at once, and a step's own slot
    retry.py      bounded retries for model calls (the providers' base runs them)
    bounds.py     a step's time and the run's stop end its model requests (their connections
                  shut down), even one the server never answers
    sampling.py   a request's seed: a step's candidates each ask with their own
    served.py     before a run: is every model its steps can use on its server
    protocol.py   which tool protocol a model uses (native or text), decided from the config
                  or the server's evidence, and remembered
    redacting.py  the one door every request passes: the run's redactor, right before the
                  provider (open_models and open_embedder put it there)
    fake.py       an in-process fake model for unit tests

May import: the base modules and config. Never tools, agent, run or CLI.
"""
