"""Taskfile loading: defaults, every kind of problem with its position, hostile files."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from coder import taskfile, yamldoc
from coder.errors import InvalidTaskfile
from tests.helpers import ROOT


def write(tmp_path: Path, text: str, name: str = "task.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def problems(path: Path) -> list[str]:
    found, task = taskfile.check_file(path, path.name)
    assert (task is None) == bool(found)
    return [str(p) for p in found]


def test_minimal_taskfile_gets_friendly_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        title: Add a Health Endpoint!
        graph:
          - kind: shell
            cmd: echo one
          - kind: edit
            goal: change things
          - kind: test
    """,
    )
    task = taskfile.load(path)
    assert task.id == path.stem  # no id: the file names the run
    assert task.branch == f"agent/{task.id}-add-a-health-endpoint"
    generated = taskfile.check_document(yamldoc.load(path))[1]  # not from a file: generated
    assert generated is not None and re.fullmatch(r"T-\d{8}-\d{6}-[0-9a-f]{4}", generated.id)
    assert task.base is None and task.model is None
    assert [s.id for s in task.steps] == ["s1", "s2", "s3"]
    # no depends_on anywhere: the list is a sequence
    assert [s.depends_on for s in task.steps] == [(), ("s1",), ("s2",)]
    assert task.steps[0].goal == "run `echo one`"
    assert task.steps[2].goal == "run the tests"
    resolved = task.resolved(base="main", model="qwen2.5-coder:7b")
    assert (resolved.base, resolved.model) == ("main", "qwen2.5-coder:7b")


def test_explicit_depends_on_turns_off_the_sequence_default(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        title: t
        graph:
          - {id: a, kind: shell, cmd: "true"}
          - {id: b, kind: shell, cmd: "true"}
          - {id: c, kind: shell, cmd: "true", depends_on: [a, b]}
    """,
    )
    task = taskfile.load(path)
    assert task.deps() == {"a": (), "b": (), "c": ("a", "b")}


def test_to_dict_round_trips_through_the_schema(tmp_path: Path) -> None:
    task = taskfile.load(ROOT / "tasks" / "add-health-endpoint.yaml")
    doc = task.resolved(base="main", model="m").to_dict()
    again = taskfile.from_dict(doc)
    assert again.steps == task.steps
    assert (again.id, again.branch, again.base, again.model) == (task.id, task.branch, "main", "m")
    from coder.schemas import validator

    assert list(validator("task").iter_errors(doc)) == []


def test_durations(tmp_path: Path) -> None:
    assert [taskfile.parse_duration(v) for v in (90, "90s", "5m", "2h")] == [90, 90, 300, 7200]


def test_every_problem_is_reported_at_once_with_positions(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        title: Demo
        graph:
          - id: s1
            kind: shel
            goal: x
          - id: s2
            kind: shell
            depends_on: [s1, s9]
          - id: s2
            kind: edit
            goal: "edit"
            dependson: [s1]
            cmd: ls
          - id: s4
            kind: test
            depends_on: [s5]
            timeout: 5min
          - id: s5
            kind: test
            depends_on: [s4]
            on_fail: {strategy: fix_and_retry, max_cycles: 2}
            assert:
              - {type: text_in_file, path: ../x}
    """,
    )
    assert problems(path) == [
        "task.yaml:4:11: graph[0].kind (step s1): 'shel' is not one of analyze, edit, doc, shell,"
        " test, lint, custom (did you mean 'shell'?)",
        "task.yaml:6:5: graph[1] (step s2): missing required field 'cmd' for a shell step",
        "task.yaml:8:22: step 's2' depends on unknown step 's9'",
        "task.yaml:9:9: duplicate step id 's2' (first defined at line 6)",
        "task.yaml:12:5: graph[2] (step s2): unknown field 'dependson' (did you mean 'depends_on'?)",
        "task.yaml:13:5: step 's2': `cmd` is only used by shell, test and lint steps (this is an edit step)",
        "task.yaml:16:17: dependency cycle: s4 -> s5 -> s4",
        "task.yaml:17:14: graph[3].timeout (step s4): '5min' is not valid here: Seconds as a number,"
        " or a string such as 90s, 5m, 1h.",
        "task.yaml:23:9: graph[4].assert[0] (step s5): missing required field 'contains'",
        "task.yaml:23:36: graph[4].assert[0].path: '../x' must be a path inside the repository"
        " (relative, without ..)",
    ]


def test_unknown_dependency_suggests_the_closest_id(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        title: t
        graph:
          - {id: build, kind: shell, cmd: make}
          - {id: test, kind: test, depends_on: [biuld]}
    """,
    )
    assert problems(path) == [
        "task.yaml:4:41: step 'test' depends on unknown step 'biuld' (did you mean 'build'?)"
    ]


def test_long_cycle_is_printed_as_a_path(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        title: t
        graph:
          - {id: s1, kind: shell, cmd: "true", depends_on: [s3]}
          - {id: s2, kind: shell, cmd: "true", depends_on: [s1]}
          - {id: s3, kind: shell, cmd: "true", depends_on: [s2]}
          - {id: s4, kind: shell, cmd: "true", depends_on: [s4]}
    """,
    )
    assert problems(path) == [
        "task.yaml:3:52: dependency cycle: s1 -> s2 -> s3 -> s1",
        "task.yaml:6:53: step 's4' depends on itself",
    ]


@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        ("title: t\ngraph: []\n", "task.yaml:2:8: graph: [] should be non-empty"),
        ("graph:\n  - {kind: shell, cmd: x}\n", "task.yaml:1:1: missing required field 'title'"),
        (
            "title: t\ngraph:\n  - {kind: shell, cmd: x}\nbranch: main\n",
            "task.yaml:4:9: branch: 'main' is not a valid branch: it must start with agent/"
            " (e.g. agent/add-health)",
        ),
        (
            "title: t\ngraph:\n  - {kind: test, on_fail: {strategy: skip, max_cycles: 2}}\n",
            "task.yaml:3:44: step 's1': max_cycles only applies with strategy fix_and_retry",
        ),
        (
            "title: t\ngraph:\n  - {kind: edit, goal: g, on_fail: {strategy: fix_and_retry}}\n",
            "task.yaml:3:47: step 's1': fix_and_retry applies to test and lint steps (use retries for"
            " an edit step)",
        ),
        (
            "title: t\ngraph:\n  - {kind: shell, cmd: x, cwd: /etc}\n",
            "task.yaml:3:32: graph[0].cwd: '/etc' must be a path inside the repository (relative,"
            " without ..)",
        ),
        (
            "title: t\nsuccess: {required_files: [../../x]}\ngraph:\n  - {kind: test}\n",
            "task.yaml:2:28: success.required_files[0]: '../../x' must be a path inside the repository"
            " (relative, without ..)",
        ),
        (
            "- just\n- a list\n",
            "task.yaml:1:1: a taskfile must be a mapping with `title` and `graph`, not a list",
        ),
    ],
)
def test_single_problems(tmp_path: Path, snippet: str, expected: str) -> None:
    assert problems(write(tmp_path, snippet)) == [expected]


def test_yaml_1_1_traps_stay_strings(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        title: t
        created_at: 2026-01-01T10:00:00Z
        graph:
          - {kind: edit, goal: yes}
          - {kind: edit, goal: 2024-05-01}
    """,
    )
    task = taskfile.load(path)
    assert [s.goal for s in task.steps] == ["yes", "2024-05-01"]
    assert task.created_at == "2026-01-01T10:00:00Z"


def test_load_raises_with_every_problem(tmp_path: Path) -> None:
    path = write(tmp_path, "title: t\ngraph:\n  - {kind: nope}\n  - {kind: shell}\n")
    with pytest.raises(InvalidTaskfile) as info:
        taskfile.load(path)
    assert len(info.value.problems) == 2
    assert info.value.message.endswith("(and 1 more problem)"), info.value.message
    path.write_text("title: t\ngraph:\n  - {kind: edit}\n  - {kind: nope}\n  - {kind: shell}\n")
    with pytest.raises(InvalidTaskfile) as info:
        taskfile.load(path)
    assert info.value.message.endswith(
        "task.yaml:3:5: graph[0]: missing required field 'goal' for an edit step "
        "(and 2 more problems)"
    )


# --- hostile files: one clear line, never a traceback or a hang -----------------------------


def test_yaml_syntax_error_has_the_parser_position(tmp_path: Path) -> None:
    path = write(tmp_path, "title: t\ngraph:\n  - kind: shell\n   cmd: [oops\n")
    [line] = problems(path)
    assert line.startswith("task.yaml:4:") and "YAML syntax error" in line


def test_empty_file(tmp_path: Path) -> None:
    path = write(tmp_path, "")
    assert problems(path) == [
        "task.yaml:1:1: file is empty; a taskfile needs at least `title`"
        " and `graph` (a list of steps)"
    ]


def test_missing_file_and_directory(tmp_path: Path) -> None:
    assert problems(tmp_path / "nope.yaml") == ["nope.yaml:1:1: no such file (check the path)"]
    (tmp_path / "dir.yaml").mkdir()
    assert problems(tmp_path / "dir.yaml") == [
        "dir.yaml:1:1: is a directory, not a file (pass the YAML file inside it)"
    ]


def test_binary_junk(tmp_path: Path) -> None:
    path = tmp_path / "task.yaml"
    path.write_bytes(bytes(range(256)) * 4)
    assert problems(path) == ["task.yaml:1:1: not a text file (it contains NUL bytes)"]


def test_non_utf8_names_the_byte_and_position(tmp_path: Path) -> None:
    path = tmp_path / "task.yaml"
    path.write_bytes(b"title: caf\xe9\ngraph: []\n")
    assert problems(path) == ["task.yaml:1:11: not valid UTF-8 (byte 0xe9); save the file as UTF-8"]


def test_huge_file_is_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "task.yaml"
    with path.open("wb") as fh:
        line = b"# padding padding padding padding padding padding padding padding\n"
        fh.write(line * (50 * 2**20 // len(line)))
    assert problems(path) == ["task.yaml:1:1: file is too large (52.4 MB; the limit is 4 MB)"]


def test_billion_laughs_is_refused(tmp_path: Path) -> None:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        prev, cur = chr(96 + i), chr(97 + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    path = write(tmp_path, "\n".join(lines) + "\n")
    assert problems(path) == [
        "task.yaml:1:1: document expands to more than 200,000 nodes through its aliases"
        " (*name repeats &name)"
    ]


def test_recursive_alias_is_refused(tmp_path: Path) -> None:
    assert problems(write(tmp_path, "title: &t [*t]\n")) == ["task.yaml:1:8: recursive YAML alias"]


def test_modest_aliases_are_fine(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        title: t
        graph:
          - &check {kind: shell, cmd: "make check"}
          - *check
    """,
    )
    assert [s.cmd for s in taskfile.load(path).steps] == ["make check", "make check"]


def test_document_positions_point_at_keys_or_values() -> None:
    doc = yamldoc.parse("a:\n  b: [1, 2]\n", "x")
    assert doc.position(["a", "b", 1]) == (2, 10)
    assert doc.position(["a", "b"], key=True) == (2, 3)
    assert doc.position(["a", "missing"]) == (2, 3)


def test_branch_names_as_libgit2_judges_them():
    """taskfile's own refname check (it may not import pygit2) agrees with libgit2 on every
    name of up to 7 characters after agent/ that the schema's pattern lets through."""
    import itertools
    import re

    import pygit2

    from coder.schemas import load_schema
    from coder.taskfile import _valid_branch_name

    shape = re.compile(load_schema("task")["properties"]["branch"]["pattern"])
    checked = 0
    for size in range(1, 8):
        for chars in itertools.product("lk.o/c", repeat=size):
            branch = "agent/" + "".join(chars)
            if not shape.search(branch):
                continue
            checked += 1
            git = pygit2.reference_is_valid_name(f"refs/heads/{branch}")
            assert _valid_branch_name(branch) == git, branch
    assert checked > 10_000
