"""The event log: schema-valid JSON lines, redacted, whole under threads, readable after a crash."""

from __future__ import annotations

import json
import string
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import structlog

from coder.redact import SCAN_FAILED, Redactor
from coder.run.eventlog import EventLog, follow_events, log_path, read_events
from coder.schemas import validator

AWS_ID = "AK" + "IA" + "ABCDEFGHIJKLMNOP"
GITHUB = "gh" + "p_" + (string.ascii_letters + string.digits)[:36]
PEM_LABEL = "EC PRIVATE" + " KEY"
PEM = f"-----BEGIN {PEM_LABEL}-----\n{'A1b2' * 16}\n{'C3d4' * 10}==\n-----END {PEM_LABEL}-----"


@pytest.fixture
def coder_dir(tmp_path: Path) -> Path:
    return tmp_path / ".coder"


def raw_lines(coder_dir: Path, task_id: str = "T-1") -> list[str]:
    return log_path(coder_dir, task_id).read_text(encoding="utf-8").splitlines()


def test_every_line_validates_against_the_log_schema(coder_dir: Path) -> None:
    with EventLog(coder_dir, "T-1") as log:
        log.info("run.started", base="main")
        step = log.bind(step_id="s1", attempt=1)
        step.debug("model.request", model="qwen2.5-coder:7b", prompt_tokens=812)
        step.info("step.committed", commit="0" * 40, duration_s=12.5)
        step.warning("step.retry", reason="tests red", error=ValueError("2 failed"))
        step.error("step.failed", error=RuntimeError("boom"), duration_s=0)
        try:
            raise KeyError("missing")
        except KeyError:
            step.exception("step.errored")
        log.info("Run Finished!", status="success")  # repaired, not dropped
    lines = raw_lines(coder_dir)
    assert len(lines) == 7
    check = validator("log")
    events = [json.loads(line) for line in lines]
    for event in events:
        check.validate(event)
        assert event["task_id"] == "T-1" and event["timestamp"].endswith("Z")
    assert [e["level"] for e in events] == [
        "info",
        "debug",
        "info",
        "warning",
        "error",
        "error",
        "info",
    ]
    assert list(events[0])[:4] == ["timestamp", "level", "event", "task_id"]
    assert events[4]["error"] == "boom"
    assert "KeyError: 'missing'" in events[5]["traceback"]
    assert events[6]["event"] == "run_finished_" and events[6]["event_raw"] == "Run Finished!"


def test_planted_secrets_never_reach_the_file_or_the_console(coder_dir: Path) -> None:
    seen: list[dict[str, Any]] = []
    redactor = Redactor(["db-password-from-dotenv"])
    with EventLog(coder_dir, "T-1", redactor=redactor, console=seen.append) as log:
        log.info("tool.result", output=f"key {AWS_ID} and {GITHUB}\n{PEM}\n")
        log.bind(step_id="s1").error("step.errored", error=Exception(f"auth failed for {GITHUB}"))
        log.info("command.env", env={"API_TOKEN": "plain-token-value", "PATH": "/usr/bin"})
        log.info(
            "config.loaded", password="hunter", dsn="postgres://app:db-password-from-dotenv@db/x"
        )
        log.info("tool.args", args=["--token", "db-password-from-dotenv"], path=Path("/repo"))
    text = log_path(coder_dir, "T-1").read_text(encoding="utf-8")
    rendered = json.dumps(seen)
    for secret in (
        AWS_ID,
        GITHUB,
        "A1b2A1b2",
        "plain-token-value",
        "hunter",
        "db-password-from-dotenv",
    ):
        assert secret not in text, secret
        assert secret not in rendered, secret
    assert "[REDACTED:private_key]" in text and "[REDACTED:github_token]" in text
    assert '"PATH": "/usr/bin"' in text and '"path": "/repo"' in text
    assert len(seen) == 5


def test_redaction_failure_drops_the_fields_not_the_event(coder_dir: Path) -> None:
    class Broken(Redactor):
        def _scan(self, text: str) -> str:
            raise RuntimeError("scanner bug")

    class Unusable(Redactor):
        def redact_obj(self, obj: Any) -> Any:
            return SCAN_FAILED

    for redactor in (Broken(), Unusable()):
        with EventLog(coder_dir, "T-1", redactor=redactor) as log:
            log.bind(step_id="s1").info("tool.result", output=f"leak {AWS_ID}")
    text = log_path(coder_dir, "T-1").read_text(encoding="utf-8")
    assert AWS_ID not in text
    for line in raw_lines(coder_dir):
        event = json.loads(line)
        validator("log").validate(event)
        assert event["event"] == "tool.result" and event["task_id"] == "T-1"
        assert SCAN_FAILED in line


def test_bind_adds_fields_to_a_child_only(coder_dir: Path) -> None:
    with EventLog(coder_dir, "T-1") as log:
        step = log.bind(step_id="s2")
        attempt = step.bind(attempt=3)
        attempt.info("step.started")
        step.info("step.note")
        log.info("run.note")
        attempt.close()  # a child's close is a no-op: the root owns the file
        log.info("run.still_open")
    events = list(read_events(coder_dir, "T-1"))
    assert [(e.get("step_id"), e.get("attempt")) for e in events] == [
        ("s2", 3),
        ("s2", None),
        (None, None),
        (None, None),
    ]
    with pytest.raises(ValueError, match="closed"):
        log.info("run.after_close")


def test_structlog_global_configuration_is_untouched(tmp_path: Path) -> None:
    before = structlog.get_config()
    with EventLog(tmp_path / "a", "T-1") as first, EventLog(tmp_path / "b", "T-2") as second:
        first.info("run.started")
        second.info("run.started")
    assert structlog.get_config() == before
    assert [e["task_id"] for e in read_events(tmp_path / "a", "T-1")] == ["T-1"]
    assert [e["task_id"] for e in read_events(tmp_path / "b", "T-2")] == ["T-2"]


def test_threads_writing_concurrently_produce_whole_lines(coder_dir: Path) -> None:
    threads_n, per_thread = 8, 150
    payload = "x" * 20_000  # bigger than any pipe or stdio buffer
    with EventLog(coder_dir, "T-1") as log:

        def worker(n: int) -> None:
            step = log.bind(step_id=f"s{n}")
            for i in range(per_thread):
                step.info("tool.result", seq=i, output=payload)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(threads_n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    lines = raw_lines(coder_dir)
    assert len(lines) == threads_n * per_thread
    seqs: dict[str, list[int]] = {}
    for line in lines:
        event = json.loads(line)  # every line is a whole object
        assert event["output"] == payload
        seqs.setdefault(event["step_id"], []).append(event["seq"])
    assert seqs == {f"s{n}": list(range(per_thread)) for n in range(threads_n)}


def test_read_events_skips_a_torn_last_line(coder_dir: Path) -> None:
    with EventLog(coder_dir, "T-1") as log:
        log.info("step.started", step_id="s1")
        log.info("step.committed", step_id="s1")
    path = log_path(coder_dir, "T-1")
    with path.open("ab") as fh:
        fh.write(b'{"timestamp": "2026-11-22T04:00:00Z", "level": "info", "event": "step.st')
    assert [e["event"] for e in read_events(coder_dir, "T-1")] == ["step.started", "step.committed"]
    # The next runner ends the torn line first, so its own first event is not glued to it.
    with EventLog(coder_dir, "T-1") as log:
        log.info("run.resumed")
    assert [e["event"] for e in read_events(coder_dir, "T-1")] == [
        "step.started",
        "step.committed",
        "run.resumed",
    ]


def test_read_events_skips_lines_that_are_no_events(coder_dir: Path) -> None:
    """A log edited by hand: a line nested deeper than json's recursion limit (a
    RecursionError traceback from `coder logs` and `coder report` before), garbage, non-UTF-8,
    a list: skipped like a torn line."""
    with EventLog(coder_dir, "T-1") as log:
        log.info("step.started", step_id="s1")
    with log_path(coder_dir, "T-1").open("ab") as fh:
        fh.write(b"[" * 100_000 + b"\ngarbage\n\xff\n[1]\n")
    with EventLog(coder_dir, "T-1") as log:
        log.info("run.resumed")
    assert [e["event"] for e in read_events(coder_dir, "T-1")] == ["step.started", "run.resumed"]


def test_read_events_of_a_task_without_log(coder_dir: Path) -> None:
    assert list(read_events(coder_dir, "T-1")) == []


def test_follow_events_yields_appended_lines_then_stops(coder_dir: Path) -> None:
    log = EventLog(coder_dir, "T-1")
    log.info("run.started")
    finished = threading.Event()

    def writer() -> None:
        for i in range(5):
            time.sleep(0.02)
            log.info("step.started", step_id=f"s{i}")
        # A line arriving in two writes is yielded once, whole.
        with log_path(coder_dir, "T-1").open("ab") as fh:
            fh.write(b'{"timestamp": "2026-11-22T04:00:00Z", "level": "info", ')
            fh.flush()
            time.sleep(0.05)
            fh.write(b'"event": "run.finished"}\n')
        finished.set()

    thread = threading.Thread(target=writer)
    thread.start()
    got = [e["event"] for e in follow_events(coder_dir, "T-1", stop=finished.is_set, poll=0.01)]
    thread.join()
    log.close()
    assert got == ["run.started"] + ["step.started"] * 5 + ["run.finished"]


def test_follow_events_waits_for_the_log_to_appear(coder_dir: Path) -> None:
    stop = threading.Event()
    got: list[str] = []

    def follower() -> None:
        got.extend(e["event"] for e in follow_events(coder_dir, "T-1", stop=stop.is_set, poll=0.01))

    thread = threading.Thread(target=follower)
    thread.start()
    time.sleep(0.05)
    with EventLog(coder_dir, "T-1") as log:
        log.info("run.started")
    stop.set()
    thread.join(timeout=10)
    assert got == ["run.started"]
