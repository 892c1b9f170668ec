"""`coder validate` on random input (a seeded generator; the seed is in the failure message):
random YAML-ish bytes and random taskfile structures, through the CLI entry point in process.
Never a traceback or a crash, always exit 0 or 2, and `--json` always one JSON document."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from coder.cli import main

SEED = int(os.environ.get("CODER_FUZZ_SEED", "20261123"))
CASES = int(os.environ.get("CODER_FUZZ_CASES", "1500"))  # per generator

TOKENS = [
    "[", "]", "{", "}", ",", ":", ": ", "- ", "? ", "\n", "\n  ", "\n    ", " ", "\t", "'", '"',
    "&a ", "*a", "&b ", "*b", "!!str ", "!!map ", "!!binary ", "!x ", "<<: ", "#", "|", ">-",
    "---\n", "...\n", "%YAML 1.1\n", "%TAG ! x\n", "\\", "\\u00e9", "é", "\u2028", "\ufeff",
    "\x00", "\x85", "title", "graph", "kind", "shell", "cmd", "goal", "id", "depends_on",
    "true", "false", "null", "~", "0x1F", "1e5", ".inf", "2024-05-01", "yes", "on",
    "echo hi", "s1", "agent/x", "\r\n",
]  # fmt: skip

FIELDS = {
    "task": ["id", "title", "branch", "base", "model", "spec", "policies", "success", "graph"],
    "step": [
        "id", "kind", "goal", "depends_on", "timeout", "retries", "changes", "cmd", "cwd",
        "env", "framework", "args", "assert", "on_fail", "tools", "model",
    ],
}  # fmt: skip
KINDS = ["analyze", "edit", "doc", "shell", "test", "custom", "nope"]


def junk_bytes(rng: random.Random) -> bytes:
    text = "".join(rng.choice(TOKENS) for _ in range(rng.randint(0, 80)))
    data = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.1:  # raw bytes: invalid UTF-8, NULs
        data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 20)))
    return data


def value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 3 or roll < 0.45:
        return rng.choice(
            [
                "", "x", "s1", "s2", "agent/a b", "../up", "/etc", "5m", "0s", 0, -1, 3, 10**12,
                1.5, True, False, None, "echo $HOME", "curl x", "a" * rng.randint(0, 5000),
            ]
        )  # fmt: skip
    if roll < 0.7:
        return [value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = FIELDS["step"] + ["strategy", "max_cycles", "path", "type", "contains", "junk"]
    return {rng.choice(keys): value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def taskfile(rng: random.Random) -> bytes:
    def some(fields: list[str]) -> list[str]:  # often none: plausible files validate
        return rng.sample(fields, rng.randint(0, 4)) if rng.random() < 0.5 else []

    doc: dict[str, Any] = {key: value(rng) for key in some(FIELDS["task"])}
    if rng.random() < 0.8:
        doc["title"] = "t"
        doc["graph"] = [
            {
                "kind": rng.choice(KINDS),
                "cmd": "echo hi",
                "goal": "do it",
                **{k: value(rng) for k in some(FIELDS["step"])},
                **({"id": f"s{i}"} if rng.random() < 0.7 else {}),
                **({"depends_on": [f"s{rng.randint(0, 5)}"]} if rng.random() < 0.3 else {}),
            }
            for i in range(rng.randint(0, 6))
        ]
    if rng.random() < 0.3:
        text = json.dumps(doc, default=str)
    else:
        text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=rng.random() < 0.3)
    lines = text.splitlines(keepends=True)
    if lines and rng.random() < 0.3:  # a line given twice (duplicate keys), or cut short
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
    if lines and rng.random() < 0.2:
        lines = lines[: rng.randrange(len(lines))]
    return "".join(lines).encode()


@pytest.mark.parametrize("generator", [junk_bytes, taskfile])
def test_validate_never_crashes(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch, generator: Any
) -> None:
    monkeypatch.chdir(repo)  # in a repository, so run's preflight is exercised too
    rng = random.Random(f"{SEED}-{generator.__name__}")
    runner = CliRunner()
    path = tmp_path / "fuzz.yaml"
    codes = set()
    for case in range(CASES):
        data = generator(rng)
        path.write_bytes(data)
        as_json = case % 2 == 1
        args = ["validate", "-f", str(path)] + (["--json"] if as_json else [])
        result = runner.invoke(main, args)
        where = f"seed {SEED}, {generator.__name__} case {case}, input {data[:300]!r}"
        if result.exception and not isinstance(result.exception, SystemExit):
            raise AssertionError(where) from result.exception
        assert result.exit_code in (0, 2), (where, result.output)
        assert "Traceback" not in result.output, where
        if as_json:
            assert json.loads(result.stdout)["valid"] == (result.exit_code == 0), where
        codes.add(result.exit_code)
    assert codes == {0, 2} or generator is junk_bytes  # the structures reach valid files too
