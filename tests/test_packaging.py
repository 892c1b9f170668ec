"""The schemas are valid, and they ship inside the wheel: a non-editable install finds them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from coder import schemas
from tests.helpers import ROOT


@pytest.mark.parametrize("name", schemas.NAMES)
def test_schemas_are_valid_draft_2020_12(name: str) -> None:
    schema = schemas.load_schema(name)
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_bundled_task_schema_has_no_refs_and_still_validates() -> None:
    bundled = schemas.bundled("task")
    assert "$ref" not in json.dumps(bundled)
    example = {"title": "t", "graph": [{"kind": "shell", "cmd": "true", "timeout": "5m"}]}
    assert list(Draft202012Validator(bundled).iter_errors(example)) == []
    bad = {"title": "t", "graph": [{"kind": "shell", "timeout": "5min"}]}
    assert len(list(Draft202012Validator(bundled).iter_errors(bad))) == 2


def test_wheel_ships_the_schemas_and_an_installed_copy_uses_them(
    installed_wheel: tuple[Path, Path], tmp_path: Path
) -> None:
    wheel, site = installed_wheel
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"coder/schemas/{n}.schema.json" for n in schemas.NAMES} <= names
    probe = (
        "import coder, coder.schemas as s; print(s.schema_dir());"
        "from coder.cli import main; main(['validate', '-f', %r])"
        % str(ROOT / "tasks" / "hello-shell.yaml")
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site)},
    )
    assert proc.returncode == 0, proc.stderr
    schema_dir, verdict = proc.stdout.splitlines()
    assert Path(schema_dir) == site / "coder" / "schemas"
    assert verdict.endswith("valid (3 steps in 3 levels)")


def test_the_wheel_ships_the_examples_and_the_unittest_runner(
    installed_wheel: tuple[Path, Path], tmp_path: Path
) -> None:
    """An installed copy (not this checkout) writes an example into a fresh unittest project
    with `coder init --example`, checks that the tests are found (its unittest runner, from
    site-packages, counts them), and the example's run is green."""
    wheel, site = installed_wheel
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"coder/_examples/hello-shell.yaml", "coder/checks/testrunner.py"} <= names
    repo = tmp_path / "fresh"
    (repo / "tests").mkdir(parents=True)
    (repo / "tests" / "test_old.py").write_text(
        "import unittest\n\n\nclass T(unittest.TestCase):\n    def test_ok(self):\n"
        "        pass\n\n    @unittest.skip('later')\n    def test_later(self):\n        pass\n"
    )
    from tests.conftest import git

    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "initial")
    env = {**os.environ, "PYTHONPATH": str(site)}

    def installed(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "coder", *args],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    init = installed("init", "--json", "--example", "hello-shell")
    assert init.returncode == 0, init.stderr
    found = json.loads(init.stdout)
    assert found["example"] == str(repo / "tasks" / "hello-shell.yaml")
    assert found["tests"]["detail"] == (
        "`python -m unittest discover -s tests -v`: 1 passed, 1 skipped"
    )
    run = installed("run", "--autonomous", "-f", "tasks/hello-shell.yaml")
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_help_page_link_resolves_where_the_wheel_is_installed(
    installed_wheel: tuple[Path, Path], tmp_path: Path
) -> None:
    """`--help` ends with the page that documents the command: a file the installed package
    holds (the wheel ships docs/ and the README), not a path of this source checkout."""
    from coder.cli import COMMANDS

    _wheel, site = installed_wheel
    for name in COMMANDS:
        proc = subprocess.run(
            [sys.executable, "-m", "coder", *name.split(), "--help"],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(site), "COLUMNS": "400"},
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
        see = proc.stdout.strip().splitlines()[-1].strip()
        assert see.startswith(f"See {site / 'coder' / '_docs'}/"), (name, see)
        page, _, anchor = see.removeprefix("See ").partition("#")
        text = Path(page).read_text(encoding="utf-8")
        headings = {
            re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in text.splitlines()
            if line.startswith("#")
        }
        assert anchor in headings, (name, anchor)
