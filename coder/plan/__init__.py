"""`coder plan`: a spec or a prompt becomes a valid, runnable taskfile.

    planner.py   the service: ask the model for drafts until one is valid, write it
    spec.py      the spec, from a file or the prompt
    overview.py  what the model is told about the repository at HEAD
    prompts.py   the planner's system message (rules + project context), the spec, the repair
                 message (the agent's own prompts are coder.agent.prompts: each package its own)
    drafts.py    the JSON object in an answer, and the document coder writes from it
    render.py    a plan as readable YAML
    validation.py a draft checked like `coder validate`, plus what a runnable plan needs
    output.py    the task id, the taskfile and draft paths, the atomic write

May import: everything below the CLI (models, agent, policy, git, taskfile, ...).
"""
