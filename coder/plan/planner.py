"""`coder plan`: a spec or a prompt becomes a valid, runnable taskfile.

The model is asked for the taskfile as JSON, constrained by Ollama's structured output to the
task JSON Schema (`schemas.bundled("task")`). Each answer is rendered as the YAML that will be
written, then checked exactly like `coder validate` (schema, ids, dependencies, cycles) plus
what a runnable plan needs (commands the policy allows, paths inside the repository, `changes`
that match the files that exist). Problems go back to the model as `FILE:LINE:COL: message`
lines, up to `plan_attempts` times; the result is a valid file or PlanFailed with the last
draft kept beside the target for inspection (prompts.py says how the messages stay
cache-stable across attempts).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coder import config as config_mod
from coder import taskfile
from coder.errors import BadSpec, InvalidInput, PlanFailed, Problem
from coder.git import repository
from coder.models.factory import open_models
from coder.models.provider import Retrying, TextDelta, Usage
from coder.plan.drafts import Draft, normalise, parse_answer
from coder.plan.output import choose_id, draft_path, shown, target_for, write_text
from coder.plan.overview import ProjectContext, gather_context
from coder.plan.prompts import SPEC_PLACEHOLDER, repair_message, spec_message, system_prompt
from coder.plan.render import render
from coder.plan.spec import Spec
from coder.plan.validation import check_draft
from coder.policy.commands import Policy
from coder.redact import Redactor
from coder.run.secrets import known_secrets
from coder.schemas import bundled

if TYPE_CHECKING:
    from coder.models.provider import ChatEvent, Message, Models


Notify = Callable[[str], None]


@dataclass(frozen=True)
class Drafting:
    """The model is asked for draft `attempt` of at most `attempts`."""

    attempt: int
    attempts: int


@dataclass(frozen=True)
class DraftStreaming:
    """Draft `attempt` streams in: its size so far, estimated in tokens."""

    attempt: int
    attempts: int
    tokens: int
    elapsed_s: float


@dataclass(frozen=True)
class DraftRejected:
    """Draft `attempt` has problems; unless it was the last, they go back to the model."""

    attempt: int
    attempts: int
    problems: tuple[Problem, ...]


PlanEvent = Drafting | DraftStreaming | DraftRejected
Watch = Callable[[PlanEvent], None]

CHARS_PER_TOKEN = 3.5  # a deliberately low ratio: overestimating refuses early, never truncates
MAX_ANSWER_RESERVE = 6144  # tokens kept free for the answer and one repair round


@dataclass(frozen=True)
class PlanOptions:
    model: str | None = None
    out: Path | None = None  # default: tasks/<id>.yaml at the repository root
    dry_run: bool = False
    force: bool = False  # overwrite an existing --out


@dataclass(frozen=True)
class PlanResult:
    task_id: str
    title: str
    path: Path | None  # the written taskfile; None for a dry run
    text: str  # the taskfile as written (YAML)
    document: dict[str, Any]
    attempts: int
    model: str
    usage: Usage


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def plan(
    spec: Spec,
    *,
    cwd: Path,
    options: PlanOptions,
    notify: Notify | None = None,
    watch: Watch | None = None,
) -> PlanResult:
    """Ask the model for a taskfile until it is valid (or the attempts run out), then write it
    (unless a dry run). Raises BadSpec (2), ModelUnavailable (3), ModelError or PlanFailed (1).
    `notify` gets what to tell the user; `watch` the drafts' progress (`PlanEvent`)."""
    say = notify or (lambda message: None)
    cfg = config_mod.load(cwd, flags={"model": options.model})
    repo = repository.open_repo(cwd)
    root = repository.repo_root(repo)
    out = (cwd / options.out) if options.out is not None else None
    if out is not None and out.exists() and not options.force and not options.dry_run:
        raise InvalidInput(
            f"{options.out} already exists",
            hint="choose another --out, or pass --force to overwrite it",
        )
    ctx = gather_context(repo, root, cfg)
    policy = Policy.from_config(cfg.values)
    planner = _Planner(spec, cwd, options, cfg, ctx, policy, out, say, watch or (lambda _e: None))

    # what the planner sends (the spec, the project's context) leaves no known secret in
    models = open_models(cfg, redactor=Redactor(known_secrets([root], cfg.values)))
    try:
        return planner.run(models)
    finally:
        models.close()


@dataclass
class _Planner:
    spec: Spec
    cwd: Path
    options: PlanOptions
    cfg: config_mod.Config
    ctx: ProjectContext
    policy: Policy
    out: Path | None
    say: Notify
    watch: Watch
    _draft: tuple[int, int, float] = (0, 0, 0.0)  # attempt, attempts, when it was asked for
    _chars: int = 0

    def run(self, models: Models) -> PlanResult:
        system = system_prompt(self.ctx, self.policy)
        facts = models.warm_up()  # server down or model missing: exit 3 here
        num_ctx = facts.num_ctx or int(self.cfg.max_num_ctx)
        provider = models.for_step("plan")
        self._check_size(system, num_ctx)
        attempts = int(self.cfg.plan_attempts or 3)
        schema = bundled("task")
        prefix: list[Message] = [
            {"role": "system", "content": system},
            {"role": "user", "content": spec_message(self.spec)},
        ]
        fallback_id = taskfile.generate_id()
        self.say(f"Planning with {facts.model} at {facts.endpoint} (context {num_ctx} tokens)")
        usage, last = Usage(), None
        for attempt in range(1, attempts + 1):
            messages = (
                prefix
                if last is None
                else prefix
                + [
                    {"role": "assistant", "content": last.answer},
                    {"role": "user", "content": self._repair(last)},
                ]
            )
            self._draft, self._chars = (attempt, attempts, time.monotonic()), 0
            self.watch(Drafting(attempt, attempts))
            result = provider.chat(messages, format=schema, on_event=self._on_event)
            usage = usage + result.usage
            last = self._evaluate(result.content, result.done_reason, fallback_id)
            if not last.problems:
                return self._finish(last, attempt, provider.model, usage)
            if attempt < attempts:
                self.say(
                    f"attempt {attempt}/{attempts}: {len(last.problems)} problem"
                    f"{'s' * (len(last.problems) != 1)}; asking the model to fix them"
                )
            self.watch(DraftRejected(attempt, attempts, tuple(last.problems)))
        assert last is not None
        kept = None
        if not self.options.dry_run:
            kept = draft_path(last.target)
            write_text(kept, last.text if last.text.endswith("\n") else last.text + "\n")
        raise PlanFailed(
            last.problems, attempts, Path(shown(kept, self.cwd)) if kept else None, last.text
        )

    def _check_size(self, system: str, num_ctx: int) -> None:
        """Refuse a spec that cannot fit: Ollama would silently cut the prompt instead."""
        spec_tokens = estimate_tokens(self.spec.text)
        reserve = min(MAX_ANSWER_RESERVE, num_ctx // 3)
        room = num_ctx - estimate_tokens(system) - reserve
        if spec_tokens > room:
            raise BadSpec(
                f"spec is {spec_tokens} tokens (est.), the model's context is {num_ctx}; shorten "
                "it",
                hint=f"about {max(room, 0)} tokens are left for the spec after the project "
                "context and room for the answer; or use a model with a longer context (raise "
                "num_ctx / max_num_ctx in coder.config.json)",
            )

    def _on_event(self, event: ChatEvent) -> None:
        if isinstance(event, Retrying):
            self._chars = 0  # the text so far is void
            self.say(f"model call failed ({event.reason}); retrying in {event.delay_s:.1f}s")
        elif isinstance(event, TextDelta):
            self._chars += len(event.text)
            attempt, attempts, asked = self._draft
            tokens = math.ceil(self._chars / CHARS_PER_TOKEN)
            self.watch(DraftStreaming(attempt, attempts, tokens, time.monotonic() - asked))

    def _evaluate(self, answer: str, done_reason: str | None, fallback_id: str) -> Draft:
        fallback = target_for(fallback_id, self.ctx, self.out)
        data, problem = parse_answer(answer, done_reason, shown(draft_path(fallback), self.cwd))
        if problem is not None or not isinstance(data, dict):
            if problem is None:
                kinds: dict[type, str] = {list: "list", str: "string"}
                kind = kinds.get(type(data), "value")
                problem = Problem(
                    shown(draft_path(fallback), self.cwd),
                    1,
                    1,
                    f"the answer must be a JSON object with `title` and `graph`, not a {kind}",
                )
            return Draft(answer, problem.file, answer, None, [problem], None, fallback)
        task_id = choose_id(data.get("id"), data.get("title"), self.ctx, self.out)
        target = target_for(task_id, self.ctx, self.out)
        name = shown(draft_path(target), self.cwd)
        doc = normalise(data, self.spec, task_id)
        text = render(doc, self._header(target))
        problems, _ = check_draft(text, name, self.ctx, self.policy, self.cfg)
        return Draft(answer, name, text, doc, problems, task_id, target)

    def _repair(self, draft: Draft) -> str:
        if draft.data is None:
            return repair_message(draft, None, draft.problems)
        view = render({**draft.data, "spec": SPEC_PLACEHOLDER})
        problems, _ = check_draft(view, draft.name, self.ctx, self.policy, self.cfg)
        return repair_message(draft, view, problems)

    def _header(self, target: Path) -> str:
        source = "a prompt" if self.spec.source == "prompt" else self.spec.source
        return (
            f"# Planned by `coder plan` from {source} with {self.cfg.model}.\n"
            f"# Review it, then: coder run --autonomous -f {shown(target, self.cwd)}\n"
        )

    def _finish(self, draft: Draft, attempts: int, model: str, usage: Usage) -> PlanResult:
        assert draft.data is not None and draft.task_id is not None
        path = None
        if not self.options.dry_run:
            write_text(draft.target, draft.text)
            stale = draft_path(draft.target)  # a failed earlier plan's draft is now misleading
            if stale.is_file():
                stale.unlink()
            path = draft.target
        return PlanResult(
            draft.task_id,
            str(draft.data.get("title")),
            path,
            draft.text,
            draft.data,
            attempts,
            model,
            usage,
        )
