"""Redaction (DESIGN invariant 8, RELIABILITY row 14).

Fake keys are assembled at runtime so the repository never holds a real-looking secret in one
piece (secret scanners, and our own redactor reading this file, stay quiet)."""

from __future__ import annotations

import os
import random
import string
import threading
from pathlib import Path
from typing import Any

import pytest

from coder.redact import (
    SCAN_FAILED,
    Redactor,
    marker,
    redact,
    secrets_from_env_file,
    secrets_from_environ,
    secrets_from_repo,
)


def fake(prefix: str, length: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    rng = random.Random(prefix + str(length))
    return prefix + "".join(rng.choice(alphabet) for _ in range(length))


UPPER = string.ascii_uppercase + string.digits
AWS_ID = fake("AK" + "IA", 16, UPPER)
AWS_SESSION_ID = fake("AS" + "IA", 16, UPPER)
AWS_SECRET = fake("", 40, string.ascii_letters + string.digits + "/+")
GITHUB = {
    p: fake(p + "_", 36) for p in ("gh" + "p", "gh" + "o", "gh" + "u", "gh" + "s", "gh" + "r")
}
GITHUB_PAT = fake("github" + "_pat_", 82, string.ascii_letters + string.digits + "_")
GITLAB = fake("gl" + "pat-", 20)
SLACK = fake("xo" + "xb-", 40, string.digits + "-")
OPENAI = fake("s" + "k-proj-", 48)
ANTHROPIC = fake("s" + "k-ant-api03-", 93, string.ascii_letters + string.digits + "_-")
GOOGLE = fake("AI" + "za", 35, string.ascii_letters + string.digits + "_-")
STRIPE = fake("s" + "k_live_", 24)
STRIPE_RESTRICTED = fake("r" + "k_live_", 24)
B64URL = string.ascii_letters + string.digits + "_-"
JWT = ".".join(
    (
        "ey" + "J" + fake("hbGciOiJIUzI1NiJ9", 0),
        "ey" + "J" + fake("", 40, B64URL),
        fake("", 43, B64URL),
    )
)
PEM_BODY = (
    "\n".join(fake("", 64, string.ascii_letters + string.digits + "+/") for _ in range(6))
    + "\nAB=="
)
PEM_LABEL = "RSA PRIVATE" + " KEY"
PEM = f"-----BEGIN {PEM_LABEL}-----\n{PEM_BODY}\n-----END {PEM_LABEL}-----"


@pytest.mark.parametrize(
    ("kind", "secret", "template"),
    [
        ("aws_access_key_id", AWS_ID, "aws_access_key_id = {}\n"),
        ("aws_access_key_id", AWS_SESSION_ID, "id={} and more"),
        ("aws_secret_access_key", AWS_SECRET, "aws_secret_access_key = {}\n"),
        ("aws_secret_access_key", AWS_SECRET, '{{"SecretAccessKey": "{}"}}'),
        *[
            ("github_token", tok, "git push https://github.com/x/y with {}")
            for tok in GITHUB.values()
        ],
        ("github_token", GITHUB_PAT, "GH={}"),
        ("gitlab_token", GITLAB, "curl -H 'PRIVATE-TOKEN: {}' gitlab.example.com"),
        ("slack_token", SLACK, "slack: {}"),
        ("openai_key", OPENAI, "OPENAI_API_KEY={}"),
        ("anthropic_key", ANTHROPIC, "client = Anthropic(api_key='{}')"),
        ("google_api_key", GOOGLE, "maps?key={}&q=1"),
        ("stripe_key", STRIPE, "stripe.api_key = {}"),
        ("stripe_key", STRIPE_RESTRICTED, "key: {}"),
        ("jwt", JWT, "cookie: session={}; Path=/"),
        ("private_key", PEM, "before\n{}\nafter\n"),
        ("authorization", "dXNlcjpwYXNzd29yZA==", "Authorization: Basic {}\r\n"),
        ("bearer_token", fake("", 32), "curl -H 'X-Auth: Bearer {}'"),
    ],
)
def test_known_formats_are_redacted(kind: str, secret: str, template: str) -> None:
    text = template.format(secret)
    out = redact(text)
    assert secret not in out
    # The distinctive part of the key is gone too, not just the whole string.
    assert secret[-12:] not in out
    assert any(marker(k) in out for k in (kind, "known_secret", "api_key", "token", "access_key"))


def _every_rule(text: str) -> str:
    """The scan with no trigger gate: every format's pattern and the assignments', in order."""
    from coder import redact as r

    for rule in r._RULES:
        text = rule.pattern.sub(r._REPLACERS[rule.kind], text)
    return r._ASSIGNMENT.sub(r._redact_assignment, text)


def test_the_triggers_only_skip_scans_that_would_find_nothing() -> None:
    # A text passes unscanned when it holds none of the rules' triggers (one flat check), or
    # skips a rule whose triggers it lacks: either way it must come out as if every rule ran.
    params = test_known_formats_are_redacted.pytestmark[0].args[1]
    texts = [template.format(secret) for _, secret, template in params]
    texts += [
        text for text, _ in test_literal_assignments_are_redacted_name_kept.pytestmark[0].args[1]
    ]
    texts += [*test_code_is_not_redacted.pytestmark[0].args[1], "echo step 3 > d0/e1/f5.txt"]
    for text in texts:
        for variant in (text, text.upper(), text.lower(), text.title()):
            assert redact(variant) == _every_rule(variant), variant


def test_format_kinds_are_precise() -> None:
    assert redact(f"x {AWS_ID} y") == f"x {marker('aws_access_key_id')} y"
    assert redact(f"'{GITHUB['gh' + 'p']}'") == f"'{marker('github_token')}'"
    assert redact(ANTHROPIC) == marker("anthropic_key")
    assert redact(OPENAI) == marker("openai_key")
    assert redact(JWT) == marker("jwt")


def test_pem_block_is_redacted_whole_and_surroundings_kept() -> None:
    out = redact(f"key:\n{PEM}\nnext line stays\n")
    assert out == f"key:\n{marker('private_key')}\nnext line stays\n"


def test_pem_variants() -> None:
    as_json = PEM.replace("\n", "\\n")
    assert redact(f'{{"private_key": "{as_json}\\n", "x": 1}}') == (
        f'{{"private_key": "{marker("private_key")}\\n", "x": 1}}'
    )
    truncated = "\n".join(PEM.splitlines()[:4])  # `head -4 key.pem`
    out = redact(truncated + "\n")
    assert PEM_BODY.splitlines()[2] not in out and marker("private_key") in out
    encrypted = PEM.replace(
        "-----\n", "-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,0A1B\n\n", 1
    )
    assert redact(encrypted) == marker("private_key")
    for label in ("PRIVATE KEY", "EC PRIVATE KEY", "OPENSSH PRIVATE KEY", "ENCRYPTED PRIVATE KEY"):
        block = PEM.replace(PEM_LABEL, label.replace(" KEY", "") + " KEY")
        assert redact(block) == marker("private_key"), label


def test_code_that_mentions_a_pem_header_is_kept() -> None:
    code = f'if line.startswith("-----BEGIN {PEM_LABEL}-----"):\n    in_key = True\n'
    assert redact(code) == code


def test_url_credentials_keep_user_and_host() -> None:
    assert redact("postgres://app:s3cr3t-pw@db.internal:5432/prod") == (
        f"postgres://app:{marker('url_password')}@db.internal:5432/prod"
    )
    assert (
        redact("https://u:p@ss@example.com/x")
        == f"https://u:{marker('url_password')}@example.com/x"
    )
    for harmless in ("https://example.com:8443/path", "http://[::1]:8080/", "mailto:a@b.c"):
        assert redact(harmless) == harmless


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PASSWORD=hunter2", "PASSWORD=[REDACTED:password]"),
        ("export DB_PASSWORD='correct horse'", "export DB_PASSWORD='[REDACTED:password]'"),
        ('"client_secret": "abc.def"', '"client_secret": "[REDACTED:secret]"'),
        ("api_key: zz9-plural-z-alpha", "api_key: [REDACTED:api_key]"),
        ("X-Api-Key: 0f3a9c", "X-Api-Key: [REDACTED:api_key]"),
        ("private_key => 'abc'", "private_key => '[REDACTED:private_key]'"),
        ("self.token = 'abc'", "self.token = '[REDACTED:token]'"),
        ("connect(password=pw123)", "connect(password=[REDACTED:password])"),
        ("/login?token=a1b2c3&next=/", "/login?token=[REDACTED:token]&next=/"),
        ("SECRET_KEY = 'django-insecure-x'", "SECRET_KEY = '[REDACTED:secret_key]'"),
    ],
)
def test_literal_assignments_are_redacted_name_kept(text: str, expected: str) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize(
    "code",
    [
        "token = request.args['t']",
        "password: str",
        "token: Optional[str] = None",
        "secret = self._secret",
        "password=password",
        "api_key = os.environ.get('API_KEY')",
        "headers = {'token': token}",
        "if token == expected:",
        "if token != 'abc':",
        "password = None",
        "token=${GITHUB_TOKEN}",
        "password: '{{ vault_password }}'",
        "password = '<your password here>'",
        "password = ''",
        "max_tokens = 4096",
        "token = 0",
        "num_tokens = count(text)",
        "tokenizer = load('gpt2')",
    ],
)
def test_code_is_not_redacted(code: str) -> None:
    assert redact(code) == code


def test_realistic_source_file_is_unchanged() -> None:
    source = '''"""HTTP client with retries."""
import os
from dataclasses import dataclass

TOKEN_ENV = "GITHUB_TOKEN"


@dataclass
class Client:
    base_url: str = "https://api.github.com"
    token: str | None = None
    max_tokens: int = 1024

    def headers(self) -> dict[str, str]:
        token = self.token or os.environ[TOKEN_ENV]
        return {"Authorization": f"Bearer {token}", "Accept": "application/json"}

    def login(self, user: str, password: str) -> None:
        self.token = self._exchange(user, password=password)
'''
    assert redact(source) == source


def test_known_secrets_from_an_env_file() -> None:
    env = (
        "# local settings\n"
        "export API_KEY=plainvalue\n"
        'DB_PASSWORD="hunter two"\n'
        "SESSION_SECRET='abc#def'\n"
        "WEBHOOK_ID=a1b2c3d4e5f6  # inline comment\n"
        "NODE_ENV=production\n"
        "HOST=localhost\n"
        "PORT=8080\n"
        "EMPTY=\n"
        'MULTI_KEY="line one\nline two"\n'
    )
    secrets = secrets_from_env_file(env)
    assert secrets == ["plainvalue", "hunter two", "abc#def", "a1b2c3d4e5f6", "line one\nline two"]
    r = Redactor(secrets)
    out = r.redact("connecting with plainvalue / hunter two / abc#def to localhost in production")
    assert out == (
        "connecting with [REDACTED:known_secret] / [REDACTED:known_secret] / "
        "[REDACTED:known_secret] to localhost in production"
    )


def test_env_file_author_is_not_a_secret_name() -> None:
    assert secrets_from_env_file("GIT_AUTHOR_NAME=Test User\nGIT_AUTH_HELPER=helper-cmd\n") == [
        "helper-cmd"
    ]


def test_secrets_from_environ() -> None:
    env = {
        "FAKE_API_KEY": "fake-key-value-1",
        "GH_TOKEN": "fake-token-value",
        "DB_PASSWORD": "pw-value",
        "HOME": "/home/me",
        "LANG": "C.UTF-8",
        "EMPTY_SECRET": "",
    }
    assert sorted(secrets_from_environ(env)) == ["fake-key-value-1", "fake-token-value", "pw-value"]
    assert isinstance(secrets_from_environ(), list)


def test_env_file_escapes() -> None:
    assert secrets_from_env_file('TOKEN="a\\nb\\"c"') == ['a\\nb\\"c', 'a\nb"c']


def test_short_known_secrets_are_ignored_and_longest_wins() -> None:
    r = Redactor(["abc", "12345", "longsecret", "longsecret-extended"])
    assert len(r) == 2
    assert r.redact("abc 12345 longsecret-extended longsecret") == (
        "abc 12345 [REDACTED:known_secret] [REDACTED:known_secret]"
    )
    r.add("another-one")
    assert r.redact("x another-one") == "x [REDACTED:known_secret]"
    assert redact("say opensesame", known_secrets=["opensesame"]) == "say [REDACTED:known_secret]"


class BrokenRedactor(Redactor):
    def _scan(self, text: str) -> str:
        raise RuntimeError("scanner bug")


def test_fails_closed() -> None:
    broken = BrokenRedactor()
    assert broken.redact(f"harmless {AWS_ID}") == SCAN_FAILED
    assert broken.redact_obj({"a": ["x", 1]}) == {"a": [SCAN_FAILED, 1]}
    assert Redactor().redact(b"bytes are not text") == SCAN_FAILED  # type: ignore[arg-type]
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    assert Redactor().redact_obj(cyclic) == SCAN_FAILED


def test_redact_obj_nested() -> None:
    data = {
        "event": "tool.result",
        "attempt": 2,
        "ok": True,
        "ratio": 0.5,
        "none": None,
        "output": [f"found {GITHUB['gh' + 'p']}", ("tuple", AWS_ID)],
        "request": {"headers": {"Authorization": "Bearer abc", "Accept": "json"}, "password": "pw"},
        "path": Path("/repo/src"),
        "error": ValueError(f"bad key {STRIPE}"),
        "max_tokens": "4096",
        "token": "",
    }
    original = repr(data)
    out = Redactor().redact_obj(data)
    assert repr(data) == original  # input untouched
    assert out["event"] == "tool.result" and out["attempt"] == 2 and out["ok"] is True
    assert out["ratio"] == 0.5 and out["none"] is None
    assert out["output"] == [
        "found [REDACTED:github_token]",
        ("tuple", "[REDACTED:aws_access_key_id]"),
    ]
    assert out["request"] == {
        "headers": {"Authorization": "[REDACTED:authorization]", "Accept": "json"},
        "password": "[REDACTED:password]",
    }
    assert out["path"] == "/repo/src"
    assert out["error"] == "bad key [REDACTED:stripe_key]"
    assert out["max_tokens"] == "4096" and out["token"] == ""


def test_concurrent_add_and_redact() -> None:
    r = Redactor()
    secrets = [f"known-secret-{i:04d}" for i in range(200)]
    errors: list[str] = []

    def adder() -> None:
        for s in secrets:
            r.add(s)

    def scanner() -> None:
        for _ in range(200):
            out = r.redact("nothing here but known-secret-0000 maybe")
            if out not in (
                "nothing here but known-secret-0000 maybe",
                "nothing here but [REDACTED:known_secret] maybe",
            ):
                errors.append(out)

    threads = [threading.Thread(target=adder)] + [
        threading.Thread(target=scanner) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert r.redact(" ".join(secrets)).count("[REDACTED:known_secret]") == 200


ADVERSARIAL = {
    "random": lambda: "".join(random.Random(7).choices(string.printable, k=1_000_000)),
    "jwt-prefixes": lambda: "eyJ" * 333_334,
    "jwt-dots": lambda: "eyJa.eyJb." * 100_000,
    "pem-headers": lambda: ("-----BEGIN " + PEM_LABEL + "-----\n") * 30_000,
    "urls": lambda: "a://b:" * 166_667,
    "names": lambda: "password " * 111_112,
    "assigns": lambda: "token=" * 166_667,
    "open-quote": lambda: 'secret="' + "a\\" * 500_000,
    "long-name": lambda: "a-" * 500_000 + "token",
    "gh-prefixes": lambda: "ghp_" * 250_000,
    "one-run": lambda: "x" * 1_000_000,
}


@pytest.mark.parametrize("name", ADVERSARIAL)
def test_megabyte_inputs_complete(name: str) -> None:
    """Adversarial 1 MB inputs for each pattern family: these finish in well under a second
    because every pattern is linear; a catastrophic one would hang here (no timing asserted)."""
    out = Redactor(["known-secret-value"]).redact(ADVERSARIAL[name]())
    assert out != SCAN_FAILED


def test_an_env_file_a_command_left_never_blocks_and_a_linked_one_is_read(tmp_path: Path) -> None:
    """A worktree a command touched is hostile: its `.env` may be a FIFO, or a link to one (an
    open blocks until a writer comes). Reading the repository's secrets opens neither (one
    non-blocking open, checked on the descriptor: no window between a check and the read for
    a FIFO to be swapped in), and still reads the user's own linked env file."""
    os.mkfifo(tmp_path / ".env")
    os.mkfifo(tmp_path / "elsewhere")
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / ".env").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "values").write_text("TOKEN=s3cr3t-linked-value\n")
    (tmp_path / "svc").mkdir()
    (tmp_path / "svc" / ".env").symlink_to(tmp_path / "shared" / "values")
    found: list[list[str]] = []
    worker = threading.Thread(target=lambda: found.append(secrets_from_repo(tmp_path)), daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "reading the repository's env files did not finish"
    assert found == [["s3cr3t-linked-value"]]
