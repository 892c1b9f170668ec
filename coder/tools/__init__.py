"""coder's tools, in one registry used by the agent loop and the MCP server.

    base.py      Tool, ToolResult, ToolContext, params, prop: what every tool module takes
    registry.py  Registry (validation, errors as data, redaction, approvals), tools_for_kind,
                 doc_write_filter, step_complete, default_registry()
    proposal.py  what a call would change (files, a command) and the answer to it
    approval.py  per-edit approvals: a call's change (a diff, a command) shown before it
                 happens, and the answer (yes, no with a reason, the user's edit, all)
    worktree.py  a model's path resolved in the worktree, writes that follow no link, globs,
                 numbered lines and the closest match (shared by fs, git, search and shell)
    envfiles.py  `.env` files: their values registered as secrets before a tool answers
    fs.py        fs_read, fs_write, fs_edit, fs_glob
    grep.py      fs_grep (the regex in a child process with a time limit)
    git.py       git_status, git_diff, git_log, fs_apply_patch (libgit2 applies it)
    search.py    code_search (coder.context.retrieval: BM25, optionally with embeddings)
    shell.py     shell_run, tests_run (through coder.policy.sandbox); modules here are named
                 after their tools, so the `shell` step kind's is coder.run.steps.shell
    feedback.py  after every edit: the syntax veto and the linter's new findings
    codeindex.py the code index's ToolContext settings: its cache directory and embedder

Typical use::

    reg = default_registry()
    ctx = ToolContext(root=worktree, policy=policy, redactor=redactor)
    tools = reg.definitions(tools_for_kind("edit"))     # for the model
    text = reg.call(name, arguments, ctx).as_text()     # never raises for a model mistake

May import: context, policy, git, models' value types and the base modules. Never agent, run or CLI.
"""
