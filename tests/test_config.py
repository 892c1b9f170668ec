"""Config precedence, file errors and detection of the project's test command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coder import config
from coder.checks import testcommand
from coder.errors import InvalidInput


def write_json(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def test_defaults_when_nothing_is_configured(tmp_path: Path) -> None:
    cfg = config.load(tmp_path, env={})
    assert cfg["model"] == "qwen2.5-coder:7b"
    assert cfg["ollama_host"] == "http://127.0.0.1:11434"
    assert set(cfg.sources.values()) == {"default"}
    assert cfg.project_root is None and cfg.files == ()


def test_every_setting_is_a_typed_attribute_read_once(repo: Path) -> None:
    """Config has one attribute per setting (DEFAULTS is the list), holding what `load` read
    with its precedence; a named model's server (`updated`) moves the attributes too."""
    from dataclasses import fields

    names = {f.name for f in fields(config.Config)}
    assert set(config.DEFAULTS) <= names
    assert names - set(config.DEFAULTS) == {
        "values",
        "sources",
        "project_root",
        "files",
        "untrusted",
    }
    write_json(repo / config.PROJECT_FILE, {"max_parallel": 4, "lint_command": "ruff check"})
    cfg = config.load(repo, flags={"model": "flag-model"}, env={})
    assert {key: getattr(cfg, key) for key in config.DEFAULTS} == dict(cfg.values)
    assert (cfg.max_parallel, cfg.lint_command, cfg.model) == (4, "ruff check", "flag-model")
    quick = cfg.updated({"request_timeout": 15})
    assert quick.request_timeout == 15 and quick["request_timeout"] == 15
    assert cfg.request_timeout == config.DEFAULTS["request_timeout"]


def test_precedence_flags_env_project_user_defaults(repo: Path) -> None:
    user = write_json(
        config.user_config_path(), {"model": "user-model", "temperature": 0.5, "max_parallel": 3}
    )
    project = write_json(repo / "coder.config.json", {"model": "project-model", "temperature": 0.1})
    env = {"CODER_MODEL": "env-model", "OLLAMA_HOST": "gpu-box:11500"}
    (repo / "sub").mkdir()
    cfg = config.load(repo / "sub", flags={"model": "flag-model", "seed": None}, env=env)
    assert cfg["model"] == "flag-model" and cfg.sources["model"] == "flag"
    assert (
        cfg["ollama_host"] == "http://gpu-box:11500"
        and cfg.sources["ollama_host"] == "env OLLAMA_HOST"
    )
    assert cfg["temperature"] == 0.1 and cfg.sources["temperature"] == f"project file {project}"
    assert cfg["max_parallel"] == 3 and cfg.sources["max_parallel"] == f"user file {user}"
    assert cfg["seed"] is None and cfg.sources["seed"] == "default"  # a None flag is "not given"
    assert cfg.files == (user, project)
    without_flag = config.load(repo, env=env)
    assert (
        without_flag["model"] == "env-model" and without_flag.sources["model"] == "env CODER_MODEL"
    )


def test_coder_config_replaces_the_project_file(repo: Path, tmp_path: Path) -> None:
    write_json(repo / "coder.config.json", {"model": "project-model"})
    other = write_json(tmp_path / "other.json", {"model": "other-model"})
    cfg = config.load(repo, env={"CODER_CONFIG": str(other)})
    assert cfg["model"] == "other-model" and cfg.sources["model"] == f"CODER_CONFIG {other}"
    with pytest.raises(
        InvalidInput, match="CODER_CONFIG points to .*missing.json, which is not a file"
    ):
        config.load(repo, env={"CODER_CONFIG": str(tmp_path / "missing.json")})


def test_invalid_json_names_file_line_and_column(repo: Path) -> None:
    path = repo / "coder.config.json"
    path.write_text('{\n  "model": "x",\n  "seed": ,\n}\n')
    with pytest.raises(InvalidInput) as info:
        config.load(repo, env={})
    assert info.value.message == f"{path}:3:11: invalid JSON: Expecting value"


def test_schema_errors_name_the_field_and_position(repo: Path) -> None:
    path = repo / "coder.config.json"
    path.write_text('{\n  "model": "x",\n  "max_parallel": 0,\n  "modle": "y"\n}\n')
    with pytest.raises(InvalidInput) as info:
        config.load(repo, env={})
    assert info.value.message == (  # in the file's order; an unknown key where it is
        f"{path}:3:19: max_parallel: 0 is less than the minimum of 1; "
        f"{path}:4:3: modle: unknown setting 'modle' (did you mean 'model'?)"
    )


def test_an_unknown_nested_setting_is_named_at_its_key(repo: Path) -> None:
    path = repo / "coder.config.json"
    path.write_text('{\n  "models": {"fast": {"model": "m", "temprature": 0.1}}\n}\n')
    with pytest.raises(InvalidInput) as info:
        config.load(repo, env={})
    assert info.value.message == (
        f"{path}:2:37: models.fast.temprature: unknown setting 'temprature' "
        "(did you mean 'temperature'?)"
    )


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://127.0.0.1:11434", "http://127.0.0.1:11434"),
        ("127.0.0.1", "http://127.0.0.1:11434"),
        (":11435", "http://127.0.0.1:11435"),
        ("0.0.0.0", "http://127.0.0.1:11434"),
        ("gpu-box:8080/", "http://gpu-box:8080"),
        ("http://gpu-box", "http://gpu-box:80"),
        ("https://ollama.internal/", "https://ollama.internal:443"),
        ("[::1]:11435", "http://[::1]:11435"),
        ("http://gpu-box:8000/v1/", "http://gpu-box:8000/v1"),
    ],
)
def test_normalize_host(given: str, expected: str) -> None:
    assert config.normalize_host(given) == expected


@pytest.mark.parametrize("bad", ["http://:::bad", "gpu-box:port", "host:99999", "ftp://h", "a b"])
def test_a_malformed_host_is_a_clear_error_naming_where_it_came_from(
    repo: Path, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    """The ollama client reads OLLAMA_HOST when it is imported and dies with a traceback on
    what it cannot parse; coder says what is wrong first (exit 2), before anything runs."""
    from tests.conftest import coder

    monkeypatch.setenv("OLLAMA_HOST", bad)
    code, _out, err = coder(repo, "doctor")
    assert code == 2
    assert err.splitlines()[:2] == [
        f"coder: error: {bad!r} is not a model server address (from env OLLAMA_HOST)",
        "  hint: give host, host:port or http://host:port (for example 127.0.0.1:11434)",
    ]


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"package.json": '{"scripts": {"test": "vitest"}}'}, "npm test"),
        ({"package.json": '{"scripts": {}}'}, None),
        ({"go.mod": "module x\n"}, "go test ./..."),
        ({"Cargo.toml": "[package]\n"}, "cargo test"),
        ({"pyproject.toml": "[tool.pytest.ini_options]\n"}, "python -m pytest -q"),
        ({"tests/conftest.py": ""}, "python -m pytest -q"),
        (
            {"tests/test_x.py": "import unittest\nclass T(unittest.TestCase): pass\n"},
            "python -m unittest discover -s tests -v",
        ),
        (
            {"test_x.py": "class T(__import__('unittest').TestCase): pass"},
            "python -m unittest discover -v",
        ),
        # unittest does not find plain test functions: pytest does
        ({"tests/test_x.py": "def test_a():\n    assert 1\n"}, "python -m pytest -q"),
        ({"test_x.py": ""}, "python -m pytest -q"),
        ({"README.md": "hi"}, None),
        # inside the package, as toolz keeps them (`toolz/tests/`): what pytest collects
        (
            {"setup.py": "", "toolz/tests/test_itertoolz.py": "def test_a():\n    assert 1\n"},
            "python -m pytest -q",
        ),
        (
            {"src/pkg/tests/test_x.py": "import unittest\nclass T(unittest.TestCase): pass\n"},
            "python -m pytest -q",
        ),
        ({"node_modules/x/tests/test_y.py": "def test_a(): pass\n"}, None),
    ],
)
def test_detect_test_command(tmp_path: Path, files: dict[str, str], expected: str | None) -> None:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert testcommand.detect_test_command(tmp_path) == expected


def test_config_set_get_unset_edit_one_setting_and_keep_the_rest(
    make_repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import coder

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    repo = make_repo()
    path = repo / "coder.config.json"
    path.write_text('{\n  "$schema": "./schemas/config.schema.json",\n  "seed": 7\n}\n')
    code, out, _ = coder(repo, "config", "set", "max_parallel", "2")
    assert code == 0 and out == f"Set max_parallel = 2 in {path}.\n"
    assert json.loads(path.read_text()) == {
        "$schema": "./schemas/config.schema.json",
        "seed": 7,
        "max_parallel": 2,
    }
    code, out, _ = coder(repo, "config", "get", "max_parallel", "--json")
    assert json.loads(out) == {"key": "max_parallel", "value": 2, "source": f"project file {path}"}
    # bad input changes nothing: an unknown setting, a bad value
    before = path.read_bytes()
    code, _, err = coder(repo, "config", "set", "modle", "x")
    assert code == 2 and "unknown setting 'modle' (did you mean 'model'?)" in err
    code, _, err = coder(repo, "config", "set", "max_parallel", "two")
    assert code == 2 and "max_parallel: must be a whole number or null, got the string 'two'" in err
    assert path.read_bytes() == before
    code, out, _ = coder(repo, "config", "unset", "max_parallel")
    assert code == 0 and "max_parallel" not in json.loads(path.read_text())
    assert coder(repo, "config", "get", "max_parallel")[1] == "null  (default)\n"
    # --user: the user's file, which a project setting still outranks
    code, out, _ = coder(repo, "config", "set", "model", "m-user", "--user")
    user = tmp_path / "xdg" / "coder" / "config.json"
    assert code == 0 and json.loads(user.read_text()) == {"model": "m-user"}
    coder(repo, "config", "set", "model", "m-project")
    assert coder(repo, "config", "get", "model")[1] == f'"m-project"  (project file {path})\n'
