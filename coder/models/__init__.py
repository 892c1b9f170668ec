"""The model layer: how coder talks to a language model.

    provider.py   the provider seam (a small Protocol) and its value types (messages, tool
                  calls, usage, model facts)
    ollama.py     the Ollama provider (the official `ollama` client)
    replay.py     record a run's model replies, or answer from a recording
    redacting.py  the one door every request passes: the run's redactor, right before the
                  provider (open_models and open_embedder put it there)

May import: the base modules and config. Never tools, agent, run or CLI.
"""
