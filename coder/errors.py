"""Errors whose message is safe to show the user.

    CoderError                 exit 2 unless a subclass says otherwise
    ├── InvalidInput           2  a taskfile, config file or argument is wrong
    │   └── PolicyViolation    2  a command, path or setting refused by policy
    ├── EnvironmentProblem     3  no git repo, Ollama unreachable, model missing, ...
    │   └── ConcurrentRun      3  another runner holds the task lock
    ├── RunFailed              1  the run executed and its checks are red
    └── Interrupted          130  stopped by a signal; state is checkpointed

The CLI turns each into one line on stderr (plus a hint) and the exit code; anything else is a
bug and gets a traceback.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3
EXIT_INTERRUPTED = 130


class CoderError(Exception):
    exit_code = EXIT_USAGE

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class InvalidInput(CoderError):
    exit_code = EXIT_USAGE


class PolicyViolation(InvalidInput):
    """A command, path or setting refused by policy; the message names the thing and the fix."""


class EnvironmentProblem(CoderError):
    exit_code = EXIT_ENVIRONMENT


class ConcurrentRun(EnvironmentProblem):
    pass


class RunFailed(CoderError):
    exit_code = EXIT_FAILED


class Interrupted(CoderError):
    exit_code = EXIT_INTERRUPTED
