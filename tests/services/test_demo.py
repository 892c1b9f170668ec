"""`coder demo` from an installed wheel, with no Ollama: the journey a newcomer sees first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import git
from tests.fake_ollama import down_url
from tests.helpers import ROOT


@pytest.fixture(scope="module")
def installed(installed_wheel: tuple[Path, Path]) -> Path:
    wheel, site = installed_wheel
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "coder/_demo/task.yaml",
        "coder/_demo/recording.json",
        "coder/_demo/project/calc.py",
    } <= names
    return site


def test_demo_runs_offline_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    target = tmp_path / "calc"
    env = {**os.environ, "PYTHONPATH": str(installed), "OLLAMA_HOST": down_url()}
    proc = subprocess.run(
        [sys.executable, "-m", "coder", "demo", "--keep", str(target), "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["status"] == "success" and report["repo"] == str(target)
    branch = report["branch"]
    trailers = git(
        target,
        "log",
        "--reverse",
        "--format=%(trailers:key=Coder-Step,valueonly,separator=)",
        f"main~1..{branch}",
    ).split()
    assert trailers == ["s2", "s3", "s4"]
    # the test step's commit is the model's fix of the failing test
    assert "return a * b" in git(target, "show", f"{branch}~1", "--", "calc.py")
    # one squash commit on main, tagged, equal to the branch tip's tree
    merge = report["merge"]
    assert merge["outcome"] == "merged" and merge["verified"] is True
    assert git(target, "rev-parse", "main").strip() == merge["commit"]
    assert git(target, "rev-parse", "coder/demo").strip() == merge["commit"]
    assert git(target, "rev-parse", "main^{tree}") == git(target, "rev-parse", f"{branch}^{{tree}}")
    assert "Coder-Merge: squash" in git(target, "log", "-1", "--format=%(trailers)", "main")
    assert git(target, "status", "--porcelain") == ""
    git(target, "fsck", "--strict")


def test_demo_text_output_says_where_to_look(installed: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(installed), "OLLAMA_HOST": down_url()}
    proc = subprocess.run(
        [sys.executable, "-m", "coder", "demo", "--keep", str(tmp_path / "d")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Squash-merged into main as " in proc.stdout
    assert "coder show -t demo" in proc.stdout
    assert "fixing" in proc.stderr and "fix cycle 1" in proc.stderr


def test_demo_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("x")
    from tests.conftest import coder

    code, _, err = coder(tmp_path, "demo", "--keep", str(tmp_path / "busy"))
    assert code == 2 and "is not empty" in err


def test_the_shipped_recording_matches_its_script(tmp_path: Path) -> None:
    fresh = tmp_path / "recording.json"
    subprocess.run(
        [sys.executable, str(ROOT / "fixtures" / "demo" / "record.py"), str(fresh)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    shipped = json.loads((ROOT / "fixtures" / "demo" / "recording.json").read_text())
    regenerated = json.loads(fresh.read_text())
    assert [(c["step"], c["reply"]["tool_calls"]) for c in regenerated["calls"]] == [
        (c["step"], c["reply"]["tool_calls"]) for c in shipped["calls"]
    ]
