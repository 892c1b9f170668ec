"""Every safety rule about what a step or the model may do, one module per rule.

    shellparse.py which programs a command line would run (walking shelllex.py's tokens)
    shelllex.py   a small bash lexer: literal words, run-time values, substitutions
    commands.py   the command allowlist (`Policy`, `check_command`)
    env.py        the environment a command sees (secrets scrubbed)
    paths.py      model-supplied paths stay in the worktree; protected paths are not written
    sandbox.py    the one way coder runs a command: policy checked, confined, network off,
                  resource limits, timeout, process-group kill, capped output
    confine.py    the kernel sandbox (Landlock) every command runs in, applied by a thread
    writes.py     a command's Profile: what it may write, what stays read-only, what it sees
    kernel.py     what this kernel offers for confining (Landlock ABI, namespaces), probed once
    reaper.py     coder as child subreaper: whether a sandbox can still hold a process
    cgroups.py    a pids cgroup per sandbox: limits.processes binds root; what it holds, listed
    tmpdirs.py    temporary directories named by their owner, those of gone coders removed
    proctrees.py  an MCP server's process tree: what it started during a step ends with it
    escapes.py    options of allowed programs that run other programs, refused
    view.py       what a command sees: a root of its own (worktree, temp dir, toolchain)
    mounts.py     a read-only mount namespace: metadata outside the worktree stays put
    userns.py     a user namespace of coder's own, so ordinary users get the same walls
    seccomp.py    no setuid or setgid file from a command (a seccomp filter)
    launch.py     `python -m coder.policy.launch`: confine this process, then become a program
                  (`launcher_argv`: how coder starts a program it does not run itself)

May import: the base modules (errors, redact, files, ...). Never git, models, tools, run or CLI.
"""
