"""Every safety rule about what a step or the model may do, one module per rule.

    shell.py      which programs a command line would run (a small bash lexer)
    commands.py   the command allowlist (`Policy`, `check_command`)
    env.py        the environment a command sees (secrets scrubbed)
    paths.py      model-supplied paths stay in the worktree; protected paths are not written
    sandbox.py    the one way coder runs a command: policy checked, network off, timeout,
                  process-group kill, capped output

May import: the base modules (errors, redact, ...). Never git, models, tools, run or CLI.
"""
