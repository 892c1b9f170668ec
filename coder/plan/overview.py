"""What `coder plan` tells the model about the repository, read at HEAD (tracked files only:
ignored ones never appear), and checks plans against."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from coder import config as config_mod
from coder.checks.testcommand import detect_test_command
from coder.context import instructions
from coder.context.languages import vendored
from coder.git import branches, commits, trees
from coder.git.repository import Repo
from coder.redact import redact

MAX_TREE_ENTRIES = 300  # files listed in the prompt; the rest summarised per directory
MAX_README_CHARS = 2000
MAX_COMMITS = 10
BINARY_SUFFIXES = frozenset(
    """
    .png .jpg .jpeg .gif .bmp .ico .webp .tif .tiff .psd .pdf .zip .gz .tgz .bz2 .xz .7z .rar
    .tar .jar .war .whl .egg .so .dylib .dll .exe .bin .o .a .lib .obj .pyc .pyo .class .wasm
    .woff .woff2 .ttf .otf .eot .mp3 .mp4 .wav .ogg .flac .mov .avi .mkv .webm .sqlite .db
    .pkl .npy .npz .parquet .onnx .pt .gguf .safetensors .lockb
""".split()
)
LANGUAGES = {
    ".py": "Python",
    ".js": "JavaScript",
    ".mjs": "JavaScript",
    ".cjs": "JavaScript",
    ".jsx": "JavaScript",
    ".ts": "TypeScript",
    ".tsx": "TypeScript",
    ".go": "Go",
    ".rs": "Rust",
    ".java": "Java",
    ".kt": "Kotlin",
    ".rb": "Ruby",
    ".php": "PHP",
    ".c": "C",
    ".h": "C",
    ".cc": "C++",
    ".cpp": "C++",
    ".hpp": "C++",
    ".cs": "C#",
    ".swift": "Swift",
    ".scala": "Scala",
    ".sh": "Shell",
    ".lua": "Lua",
    ".ex": "Elixir",
    ".exs": "Elixir",
    ".hs": "Haskell",
    ".dart": "Dart",
    ".vue": "Vue",
    ".svelte": "Svelte",
}


@dataclass(frozen=True)
class ProjectContext:
    """What the planner tells the model about the repository (and checks plans against)."""

    root: Path
    branch: str | None
    files: tuple[str, ...]  # every file of HEAD's tree (for existence checks)
    listed: tuple[str, ...]  # the files shown to the model: no vendored or binary files
    languages: tuple[tuple[str, int], ...]
    test_command: str | None
    readme: str | None
    commits: tuple[str, ...]
    branches: frozenset[str] = field(default_factory=frozenset)
    instructions: str = ""  # AGENTS.md and friends (coder.context.instructions), rendered


def gather_context(repo: Repo, root: Path, cfg: config_mod.Config) -> ProjectContext:
    """Compact facts about the project at HEAD (only tracked files: ignored ones never appear)."""
    head = branches.head_commit(repo)
    files = tuple(trees.tree_paths(repo, head)) if head else ()
    listed = tuple(p for p in files if _worth_listing(p))
    try:
        branch: str | None = branches.current_branch(repo)
    except Exception:  # detached or unborn: the plan still works, `base` just cannot be named
        branch = None
    return ProjectContext(
        root=root,
        branch=branch,
        files=files,
        listed=listed,
        languages=_languages(listed),
        test_command=cfg.test_command or detect_test_command(root),
        readme=_readme(repo, head, files) if head else None,
        instructions=_instructions(repo, head, cfg) if head else "",
        commits=_recent_subjects(repo, head) if head else (),
        branches=branches.local_branches(repo),
    )


def _worth_listing(path: str) -> bool:
    return not vendored(path) and PurePosixPath(path).suffix.lower() not in BINARY_SUFFIXES


def _languages(paths: Iterable[str]) -> tuple[tuple[str, int], ...]:
    counts: dict[str, int] = {}
    for path in paths:
        language = LANGUAGES.get(PurePosixPath(path).suffix.lower())
        if language:
            counts[language] = counts.get(language, 0) + 1
    return tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _instructions(repo: Repo, head: str, cfg: config_mod.Config) -> str:
    return instructions.read(
        repo,
        head,
        names=tuple(cfg.instruction_files or instructions.DEFAULT_FILES),
        max_chars=int(cfg.instructions_max_chars or instructions.DEFAULT_MAX_CHARS),
    ).render()


def _readme(repo: Repo, head: str, files: tuple[str, ...]) -> str | None:
    names = [p for p in files if "/" not in p and p.lower().startswith("readme")]
    if not names:
        return None
    data = trees.file_at(repo, head, sorted(names)[0])
    if data is None:
        return None
    text = data[: MAX_README_CHARS * 2].decode("utf-8", errors="replace")
    excerpt = text[:MAX_README_CHARS]
    if len(text) > MAX_README_CHARS:
        excerpt = excerpt.rsplit("\n", 1)[0] + "\n[...]"
    return redact(excerpt.strip())


def _recent_subjects(repo: Repo, head: str) -> tuple[str, ...]:
    return tuple(redact(s) for s in commits.recent_subjects(repo, head, MAX_COMMITS))


def format_tree(paths: tuple[str, ...], limit: int = MAX_TREE_ENTRIES) -> str:
    """Shallow paths first (they say the most about the layout); past `limit`, the remaining
    files are counted per top-level directory."""
    if len(paths) <= limit:
        return "\n".join(paths)
    shown = sorted(sorted(paths, key=lambda p: (p.count("/"), p))[:limit])
    rest: dict[str, int] = {}
    for path in set(paths) - set(shown):
        top = path.split("/", 1)[0] + "/"
        rest[top] = rest.get(top, 0) + 1
    more = [f"{d} ... {n} more files" for d, n in sorted(rest.items())]
    return "\n".join(shown + more)
