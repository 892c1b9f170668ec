"""`coder init`: a repository prepared for coder (`.coder/`, excluded from git, and a
`coder.config.json` with what was detected about the project), and the example taskfiles
`coder init --example NAME` copies into `tasks/`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from coder import config as config_mod
from coder.checks.testcommand import detect_test_command
from coder.errors import InvalidInput, LinkInTheWay
from coder.files import nofollow
from coder.files.durable import write_atomic, write_failed
from coder.git import repository
from coder.project import CODER_DIR, TASKS_DIR, ensure_coder_dir
from coder.services import testprobe
from coder.services.testprobe import Probe


@dataclass
class InitResult:
    root: Path
    config_path: Path
    config_written: bool
    excluded: bool  # True when .git/info/exclude was changed
    config: dict[str, object] = field(default_factory=dict)
    probe: Probe | None = None  # the detected test command, run once (None: not run)


def init(cwd: Path, *, force: bool = False, probe: bool = True) -> InitResult:
    """Create `.coder/` and a `coder.config.json` holding what was detected about this
    project (its test command), and nothing else: defaults stay defaults, so your user config
    (`~/.config/coder/config.json`: the model, the server) keeps applying. Idempotent: an
    existing config is kept unless `force`. With `probe`, the test command (the config's, or
    the detected one) runs once to say whether it finds tests (coder.services.testprobe)."""
    repo = repository.open_repo(cwd)
    root = repository.repo_root(repo)
    ensure_coder_dir(root)
    excluded = repository.ensure_excluded(repo, f"/{CODER_DIR}/")
    path = root / config_mod.PROJECT_FILE
    detected = detected_config(root)
    written = force or not path.exists()
    if written:  # all or nothing: a full disk leaves no empty config behind
        data = (json.dumps(detected, indent=2) + "\n").encode("utf-8")
        try:
            write_atomic(path, data, new_mode=0o644, crash_point=None)
        except OSError as exc:
            raise write_failed(path, exc) from exc
    found = None
    if probe:
        cfg = config_mod.load(root)
        command = cfg.test_command or detected.get("test_command")
        found = testprobe.probe(cwd, str(command), cfg) if command else None
    return InitResult(root, path, written, excluded, detected, found)


def detected_config(root: Path) -> dict[str, object]:
    """The settings detected from the project's files (none when nothing was found)."""
    test_command = detect_test_command(root)
    return {} if test_command is None else {"test_command": test_command}


# --------------------------------------------------------------------------------------------
# The example taskfiles (`tasks/` of coder's source, shipped in the wheel as `coder/_examples`)


def examples_dir() -> Path:
    package = Path(__file__).parent.parent  # coder/
    packaged = package / "_examples"
    return packaged if packaged.is_dir() else package.resolve().parent / TASKS_DIR


def example_names() -> list[str]:
    return sorted(p.stem for p in examples_dir().glob("*.yaml"))


def write_example(root: Path, name: str, *, force: bool = False) -> Path:
    """Copy the example taskfile `name` into the repository's `tasks/`; InvalidInput naming
    the examples for an unknown one, or when the file exists (unless `force`). Written without
    following a link (a `tasks` link merged from a run would send it elsewhere): a link at
    `tasks` is refused, one at the file itself replaced (with `force`)."""
    source = examples_dir() / f"{name.removesuffix('.yaml')}.yaml"
    if not source.is_file():
        raise InvalidInput(
            f"no example named {name!r}", hint=f"choose one of: {', '.join(example_names())}"
        )
    rel = f"{TASKS_DIR}/{source.name}"
    try:
        nofollow.write_file(root, rel, source.read_bytes(), mode=0o644, new_only=not force)
    except FileExistsError:
        raise InvalidInput(
            f"{root / rel} exists; nothing was written", hint="pass --force to overwrite it"
        ) from None
    except LinkInTheWay as exc:
        raise exc.problem() from None
    except OSError as exc:
        raise write_failed(root / rel, exc) from exc
    return root / rel
