"""The agent: a model driven through one step with tools.

    loop.py      the bounded loop: ask the model, run its tool calls, check its claim
    prompts.py   the cache-stable prompt prefix and the per-step messages
    prefix.py    the run's prefix built once from the base commit, and each step's focus
    events.py    what the loop reports while it works: typed events, in order
    repair.py    tool calls recovered from JSON written as text
    summarize.py before the context folds, the model's summary of the older turns
    texttools.py how tool calls travel: natively, or described in the system prompt and
                 written as text (tool_protocol)
    session.py   the run's model side: the shared session, opening it (models checked,
                 warmed up, the prefix built and primed)
    fallback.py  which model each attempt of a step uses (its fallback_model after two)
    modelstep.py a model step's attempt: its tools, its first message, the conversation,
                 its claim checked against the real changes (coder.run.steps.model runs it)

May import: tools, models, policy and the base modules. Never run, plan, mcp or CLI.
"""
