"""`coder plan`: a spec or a prompt becomes a valid, runnable taskfile.

    service.py   project context, the planning prompt, the model's drafts checked like
                 `coder validate` and repaired until valid, the taskfile written

May import: everything below the CLI (models, agent, policy, git, taskfile, ...).
"""
