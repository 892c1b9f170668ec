"""Summaries when the context folds: before the loop folds old tool results away (loop.FILL;
the summary is asked for REPLY_TOKENS earlier, so its own call fits the window), the model
writes a short summary of what those turns established (files read, facts found,
what failed), and the summary replaces them in the conversation.

The summary request is the conversation up to the turns kept (so it starts with the bytes the
server has cached: system prompt, tools, the step's first messages and the turns themselves),
then one user message asking for the summary. It counts in the step's usage, so in its token
budget. Whenever it cannot help, `summarize` says why and the loop folds as it always did:

    the model call failed, or answered with a tool call or nothing
    the summary is longer than MAX_CHARS, or no shorter than the turns it would replace
    the request would not fit the context window, or the step's token budget

The turns replaced are those after the step's opening (system prompt and first user
message, never touched) and earlier summaries, and before the newest `keep` turns (a turn: an
assistant message and the tool results and nudges after it). They become two messages: the
summary as the model's own (assistant) message, then a user turn saying to go on, so user and
assistant still alternate (some servers' chat templates refuse anything else). A summary
written earlier stays where it is, so the conversation up to it is still the prefix the server
has cached.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from coder.errors import ModelError
from coder.models.provider import Message, ModelProvider, ToolSchema, Usage

MAX_CHARS = 2400  # about 600 tokens: a summary, not a transcript
REPLY_TOKENS = MAX_CHARS // 4  # what the reply is budgeted at
HEAD = "[Summary of earlier turns of this step, written when they were folded to save context]"

CONTINUE = "Go on with the step from where the summary leaves off."

PROMPT = (
    "The context window is nearly full, so the turns above (after the step's instructions) "
    "are about to be removed. Write a short summary of what they established, for yourself "
    "to continue the step from: the files you read or changed and what is in them that "
    "matters (names, line numbers, values, exact strings), facts you found, commands you ran "
    "and their results, and what failed or was ruled out. Plain text, at most "
    f"{MAX_CHARS} characters. Do not call a tool."
)


@dataclass(frozen=True)
class Span:
    """messages[start:end] are the turns a summary replaces."""

    start: int
    end: int


@dataclass(frozen=True)
class Outcome:
    replaced: int  # messages replaced by the summary (0: it fell back)
    chars: int  # the summary's length
    usage: Usage = field(default_factory=Usage)  # of the summary call (none when not asked)
    reason: str = ""  # why it fell back to folding ("" when it did not)


def span(messages: Sequence[Message], keep: int) -> Span | None:
    """The turns to replace: after the opening and the summaries so far, before the newest
    `keep` turns (None: there are none)."""
    last = max((i for i, m in enumerate(messages) if is_summary(m)), default=-1)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant" and i > last]
    if len(turns) <= keep:
        return None
    return Span(turns[0], turns[-keep] if keep else len(messages))


class Summarizer:
    """A step's summaries: `fit` asks for one when the conversation is over its budget; when
    that gave no usable summary it waits RETRY_AFTER more turns before trying again (so a
    model that cannot summarise costs one call, not one per turn)."""

    RETRY_AFTER = 2

    def __init__(self, provider: ModelProvider, tools: list[ToolSchema], keep: int) -> None:
        self.provider, self.tools, self.keep = provider, tools, keep
        self.quiet_until = 0  # the turn before which no summary is asked for

    def fit(
        self,
        messages: list[Message],
        *,
        turn: int,
        window: int,
        tokens_left: int | None,
        estimate: Callable[[Sequence[Message], Sequence[ToolSchema]], int],
    ) -> Outcome | None:
        """`summarize` now, or None while waiting after a failed call."""
        if turn < self.quiet_until:
            return None
        outcome = summarize(
            self.provider,
            messages,
            self.tools,
            keep=self.keep,
            window=window,
            tokens_left=tokens_left,
            estimate=estimate,
        )
        if not outcome.replaced:
            self.quiet_until = turn + self.RETRY_AFTER
        return outcome


def summarize(
    provider: ModelProvider,
    messages: list[Message],
    tools: list[ToolSchema],
    *,
    keep: int,
    window: int,
    tokens_left: int | None,
    estimate: Callable[[Sequence[Message], Sequence[ToolSchema]], int],
) -> Outcome:
    """Replace the older turns of `messages` (in place) by the model's summary of them; the
    outcome says how many messages went, or why none did (see the module docstring).
    `window`: the context size; `tokens_left`: what the step's token budget still allows
    (None: no budget); `estimate`: the loop's token estimate of a request."""
    where = span(messages, keep)
    if where is None:
        return Outcome(0, 0, reason="too few turns to summarize")
    question: Message = {"role": "user", "content": PROMPT}
    request = [*messages[: where.end], question]
    cost = estimate(request, tools) + REPLY_TOKENS
    if cost > window:
        return Outcome(0, 0, reason=f"the summary request ({cost} tokens) would not fit")
    if tokens_left is not None and cost > tokens_left:
        return Outcome(0, 0, reason=f"the step's token budget has {tokens_left} tokens left")
    try:
        reply = provider.chat(request, tools=tools)
    except ModelError as exc:
        return Outcome(0, 0, reason=f"the summary call failed: {exc.message}")
    text = reply.content.strip()
    problem = _unusable(text, bool(reply.tool_calls), messages[where.start : where.end])
    if problem:
        return Outcome(0, len(text), reply.usage, reason=problem)
    messages[where.start : where.end] = [  # the model's own words, then the user's turn
        {"role": "assistant", "content": f"{HEAD}\n{text}"},
        {"role": "user", "content": CONTINUE},
    ]
    return Outcome(where.end - where.start, len(text), reply.usage)


def is_summary(message: Message) -> bool:
    return message["role"] == "assistant" and str(message.get("content", "")).startswith(HEAD)


def _unusable(text: str, called: bool, turns: Sequence[Message]) -> str | None:
    if called:
        return "the model answered the summary request with a tool call"
    if not text:
        return "the summary was empty"
    if len(text) > MAX_CHARS:
        return f"the summary was {len(text)} characters long (at most {MAX_CHARS})"
    if len(text) >= sum(len(str(m.get("content", ""))) for m in turns):
        return "the summary was no shorter than the turns it would replace"
    return None
