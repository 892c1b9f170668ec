"""Hostile documents (RELIABILITY.md row 20): exit 2 with one clear line, bounded time, memory
and output; never a crash. The big inputs are generated here, not committed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coder import config, taskfile, yamldoc
from coder.checks import testcommand
from coder.errors import InvalidInput
from tests.conftest import coder


def validate(path: Path) -> tuple[int, str]:
    """`coder validate -f PATH` through the real entry point in a subprocess (a crash of the C
    parser would take the test process down with it): exit code and all output."""
    proc = subprocess.run(
        [sys.executable, "-m", "coder", "validate", "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, proc.stdout + proc.stderr


def problems(path: Path) -> list[str]:
    found, _task = taskfile.check_file(path, path.name)
    return [str(p) for p in found]


@pytest.mark.parametrize(
    "text",
    [
        "[" * 30_000,  # 60 KB: libyaml's composer overflowed the C stack (exit 139)
        "{a: " * 30_000,
        '{"a": ' * 30_000,  # a JSON taskfile
        "- " * 30_000 + "x\n",  # block sequences nest too, one level per `- `
        "title: t\ngraph:\n  - kind: shell\n    cmd: " + "[" * 30_000 + "]" * 30_000 + "\n",
    ],
    ids=["flow-seq", "flow-map", "json", "block-seq", "balanced-in-a-field"],
)
def test_deep_nesting_is_refused_without_a_crash(tmp_path: Path, text: str) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    code, out = validate(path)
    assert code == 2, out
    assert f"nesting is too deep (more than {yamldoc.MAX_DEPTH} levels" in out
    assert "Traceback" not in out and len(out) < 1000


def test_nesting_within_the_limit_is_fine() -> None:
    depth = yamldoc.MAX_DEPTH
    assert yamldoc.parse("[" * depth + "]" * depth, "x").data is not None
    with pytest.raises(yamldoc.DocumentError, match="nesting is too deep"):
        yamldoc.parse("[" * (depth + 1) + "]" * (depth + 1), "x")


def test_one_big_value_repeated_by_aliases_is_refused(tmp_path: Path) -> None:
    """A 2 MB anchored goal referenced by 3,000 steps: 2.2 MB on disk, 6 GB expanded; each
    too-long error repeated the whole string (MemoryError)."""
    big = "x" * (2 * 2**20)
    lines = ["title: t", "graph:", f"  - {{kind: edit, goal: &g {big}}}"]
    lines += ["  - {kind: edit, goal: *g}"] * 3_000
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    assert path.stat().st_size < yamldoc.MAX_BYTES
    code, out = validate(path)
    assert code == 2, out[:2000]
    assert "document expands to more than 4 MB of text through its aliases" in out
    assert len(out) < 1000


def test_long_values_are_cut_in_messages(tmp_path: Path) -> None:
    path = tmp_path / "long.yaml"
    path.write_text(f"title: t\ngraph:\n  - kind: edit\n    goal: {'y' * 100_000}\n")
    [line] = problems(path)
    assert line.startswith("long.yaml:4:11: graph[0].goal: 'yyyy")
    assert "… (100,000 characters) is too long (100,000 characters; at most 4,000 allowed)" in line
    assert len(line) < 200


def test_too_many_nodes_are_refused_before_they_are_built(tmp_path: Path) -> None:
    path = tmp_path / "wide.yaml"
    path.write_text("[" + "a," * (yamldoc.MAX_NODES + 1) + "]\n")
    assert problems(path) == ["wide.yaml:1:1: document has more than 200,000 nodes"]


# --- duplicate keys ------------------------------------------------------------------------


def test_duplicate_keys_in_a_step_are_an_error_naming_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "task.yaml"
    path.write_text(
        "title: t\ngraph:\n  - kind: shell\n    cmd: echo 1\n    cmd: rm -rf important\n"
    )
    assert problems(path) == [
        "task.yaml:5:5: duplicate key 'cmd' (first at line 4, again at line 5); keep one: "
        "the last would silently win"
    ]
    code, out, _err = coder(tmp_path, "validate", "-f", str(path))
    assert code == 2 and "duplicate key 'cmd'" in out


def test_every_duplicate_key_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "task.yaml"
    path.write_text(
        "title: a\ntitle: b\npolicies: {retries: 1, retries: 2}\n"
        'graph:\n  - {kind: test, "kind": test}\n'
    )
    assert [p.split(": ", 1)[0] + ": " + p.split("'")[1] for p in problems(path)] == [
        "task.yaml:2:1: title",
        "task.yaml:3:24: retries",
        "task.yaml:5:18: kind",
    ]


def test_merge_keys_may_override(tmp_path: Path) -> None:
    path = tmp_path / "task.yaml"
    path.write_text(
        "title: t\nx-base: &base {kind: shell, cmd: echo base}\ngraph:\n"
        "  - {<<: *base, cmd: echo own}\n"
    )
    # the override is fine; the unknown top-level field is the only problem
    assert [p.split(": ", 1)[1] for p in problems(path)] == [
        "unknown field 'x-base' (did you mean 'base'?)"
    ]


def test_duplicate_keys_in_a_json_config_file(repo: Path) -> None:
    path = repo / "coder.config.json"
    path.write_text('{\n  "model": "a",\n  "allow_network": false,\n  "model": "b"\n}\n')
    with pytest.raises(InvalidInput) as info:
        config.load(repo)
    assert info.value.message == (
        f"{path}:4:3: duplicate key 'model' (first at line 2, again at line 4); keep one: "
        "the last would silently win"
    )


def test_duplicate_keys_on_one_line_are_told_apart_by_column(repo: Path) -> None:
    path = repo / "coder.config.json"
    path.write_text('{"model": "a", "model": "b"}')
    with pytest.raises(InvalidInput) as info:
        config.load(repo)
    assert info.value.message == (
        f"{path}:1:16: duplicate key 'model' (first at column 2, again at column 16 of line "
        "1); keep one: the last would silently win"
    )


def test_deep_json_config_is_refused(repo: Path) -> None:
    (repo / "coder.config.json").write_text('{"a": ' * 30_000)
    with pytest.raises(InvalidInput, match="nesting is too deep"):
        config.load(repo)


def test_json_numbers_keep_json_meaning(repo: Path) -> None:
    (repo / "coder.config.json").write_text('{"request_timeout": 1e3, "model": "\\ud83d\\ude00"}')
    cfg = config.load(repo)
    assert cfg["request_timeout"] == 1000.0 and cfg["model"] == "\U0001f600"


def test_loads_json_refuses_deep_nesting_as_bad_json() -> None:
    assert yamldoc.loads_json('{"a": [1, "[[[["]}') == {"a": [1, "[[[["]}
    with pytest.raises(json.JSONDecodeError, match="nesting is too deep") as info:
        yamldoc.loads_json("[" * 10_000 + "]" * 10_000)
    assert info.value.pos == yamldoc.MAX_DEPTH


@pytest.mark.parametrize("text", ["[" * 100_000, "[1, 2]", '{"scripts": []}'])
def test_a_hostile_package_json_does_not_crash_init_detection(tmp_path: Path, text: str) -> None:
    (tmp_path / "package.json").write_text(text)
    assert testcommand.detect_test_command(tmp_path) is None


def test_a_deeply_nested_replay_file_is_bad_input(tmp_path: Path) -> None:
    from coder.models.replay import ReplayModels

    path = tmp_path / "rec.json"
    path.write_text('{"calls": ' + "[" * 100_000)
    with pytest.raises(InvalidInput, match="not a coder recording"):
        ReplayModels(path)


# --- files that are not files --------------------------------------------------------------


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "task.yaml"
    os.mkfifo(fifo)
    assert problems(fifo) == [
        "task.yaml:1:1: is a named pipe (FIFO), not a regular file; save the content to a file"
    ]


def test_dev_zero_is_refused(tmp_path: Path) -> None:
    code, out = validate(Path("/dev/zero"))
    assert code == 2
    assert out.splitlines()[0] == (
        "/dev/zero:1:1: is a character device, not a regular file; save the content to a file"
    )


def test_config_file_that_is_a_fifo(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = repo.parent / "fifo.json"
    os.mkfifo(fifo)
    monkeypatch.setenv("CODER_CONFIG", str(fifo))
    with pytest.raises(InvalidInput, match="not a file|not a regular file"):
        config.load(repo)


# --- messages that say what is wrong -------------------------------------------------------


@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        (
            "title: t\ngraph:\n  - {kind: shell, cmd: false}\n",
            "task.yaml:3:24: graph[0].cmd: must be a string, got a YAML boolean `false`; quote it",
        ),
        (
            "title: t\ngraph:\n  - {kind: shell, cmd: 1.50}\n",
            "task.yaml:3:24: graph[0].cmd: must be a string, got a YAML number `1.50`; quote it",
        ),
        (
            "title: t\ngraph:\n  - kind: shell\n    cmd:\n",
            "task.yaml:4:9: graph[0].cmd: must be a string, got nothing (the value is empty); "
            "quote it",
        ),
        (
            "title: t\ngraph:\n  - {kind: test, retries: '2'}\n",
            "task.yaml:3:27: graph[0].retries: must be a whole number, got the string '2'",
        ),
        (
            'title: t\nbranch: "agent/a b"\ngraph:\n  - {kind: test}\n',
            "task.yaml:2:9: branch: 'agent/a b' is not a valid branch: it contains a space; use "
            "letters, digits, ., _, - and / (e.g. agent/add-health)",
        ),
        (
            "title: t\nbranch: feature/x\ngraph:\n  - {kind: test}\n",
            "task.yaml:2:9: branch: 'feature/x' is not a valid branch: it must start with agent/ "
            "(e.g. agent/add-health)",
        ),
        (
            "title: t\nbranch: agent//x\ngraph:\n  - {kind: test}\n",
            "task.yaml:2:9: branch: 'agent//x' is not a valid branch: each part after agent/ must "
            "be non-empty and start with a letter, digit, _ or - (e.g. agent/add-health)",
        ),
        (
            "title: t\ngraph:\n\t- kind: shell\n",
            "task.yaml:3:1: YAML syntax error: found character that cannot start any token "
            "(while scanning for the next token); the character is a tab, and YAML indents "
            "with spaces only",
        ),
    ],
)
def test_messages(tmp_path: Path, snippet: str, expected: str) -> None:
    path = tmp_path / "task.yaml"
    path.write_text(snippet)
    assert problems(path) == [expected]
