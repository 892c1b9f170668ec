"""The spec `coder plan` plans: from `-f FILE`, a path given as the argument, or the prompt."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from coder import yamldoc
from coder.errors import BadSpec, DocumentError


@dataclass(frozen=True)
class Spec:
    text: str
    source: str  # the file it came from, or "prompt"


_LOOKS_LIKE_FILE = re.compile(r"\S+\.(md|markdown|txt|rst|adoc|org|ya?ml|json)", re.IGNORECASE)


def read_spec(prompt: str | None, file: Path | None, cwd: Path) -> Spec:
    """The spec from `-f FILE`, or from the positional argument: a path to an existing file
    is read, anything else is the prompt itself."""
    if prompt is not None and file is not None:
        raise BadSpec("give the spec either as an argument or with -f FILE, not both")
    if file is None and prompt is not None:
        candidate = cwd / prompt
        if "\n" not in prompt and len(prompt) < 4096 and candidate.is_file():
            file = Path(prompt)
        elif _LOOKS_LIKE_FILE.fullmatch(prompt.strip()):
            raise BadSpec(
                f"spec file {prompt} does not exist",
                hint="check the path; to plan from a prompt, describe the change in words (quoted)",
            )
    if file is not None:
        try:
            text = yamldoc.read_text(cwd / file, str(file))
        except DocumentError as exc:
            raise BadSpec(f"cannot read the spec: {exc.problem}") from None
        source = str(file)
    elif prompt is not None:
        text, source = prompt, "prompt"
    else:
        raise BadSpec(
            "no spec given", hint='run `coder plan "what to build"` or `coder plan -f SPEC.md`'
        )
    text = tidy(text)
    if not text:
        raise BadSpec(
            f"the spec is empty ({source})",
            hint="describe what to build: the behaviour, the files, the tests",
        )
    return Spec(text, source)


def tidy(text: str) -> str:
    """Trailing spaces removed (they would force the YAML `spec:` out of block style)."""
    return "\n".join(line.rstrip() for line in text.strip().splitlines())
