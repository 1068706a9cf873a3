"""One agent episode: a prompt run to completion against a model with a set of tools.

Knows nothing of Ray or of output files: it takes a prompt, a dispatcher, a model client
and settings, and returns an ``EpisodeRecord`` with everything an output row needs.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hermes.model_client import (
    Completion,
    ModelClient,
    PermanentModelError,
    TransientModelError,
)
from hermes.trajectory import split_inline_reasoning, to_hermes_conversations
from tools.dispatch import ToolCallResult, ToolDispatcher
from tools.settings import ToolContext

logger = logging.getLogger(__name__)

DEFAULT_SUMMARY_PROMPT = (
    "You have used all the turns available. Without calling any tool, summarise what you "
    "did and found, and give your final answer."
)


@dataclass(frozen=True, kw_only=True)
class EpisodeSettings:
    """How an episode runs. ``ephemeral_system_prompt`` and ``prefill_messages`` reach the
    model but are not saved in the record; ``system_prompt`` is saved."""

    max_turns: int = 10
    max_invalid_turns: int = 3
    summary_on_max_turns: bool = False
    summary_prompt: str = DEFAULT_SUMMARY_PROMPT
    deadline_s: float = 900.0
    system_prompt: str | None = None
    ephemeral_system_prompt: str | None = None
    prefill_messages: tuple[Mapping[str, Any], ...] = ()
    scratch_root: Path | None = None
    keep_scratch: bool = False

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        if self.max_invalid_turns < 1:
            raise ValueError("max_invalid_turns must be at least 1")
        if self.deadline_s <= 0:
            raise ValueError("deadline_s must be positive")


@dataclass(frozen=True, kw_only=True)
class EpisodeRecord:
    """The outcome of one episode: the fields of an output row that the loop owns."""

    task_id: str
    tools: list[str]
    messages: list[dict[str, Any]]
    conversations: list[dict[str, str]]
    completed: bool
    partial: bool
    finish_reason: str
    api_calls: int
    num_tool_calls: int
    tool_stats: dict[str, dict[str, int]]
    truncated_results: int
    invalid_tool_calls: int
    usage: dict[str, int]
    error: str | None
    error_kind: str | None
    has_reasoning: bool
    started_at: str
    finished_at: str
    duration_s: float
    model_time_s: float
    tool_time_s: float
    scratch_dir: str | None = None
    request_errors: dict[str, int] = field(default_factory=dict)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclass
class _Progress:
    """Mutable state of a running episode."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    api_calls: int = 0
    num_tool_calls: int = 0
    invalid_tool_calls: int = 0
    invalid_streak: int = 0
    truncated_results: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model_time_s: float = 0.0
    tool_time_s: float = 0.0
    tool_stats: dict[str, dict[str, int]] = field(default_factory=dict)
    request_errors: dict[str, int] = field(default_factory=dict)

    def count_tool(self, result: ToolCallResult) -> None:
        stats = self.tool_stats.setdefault(result.name, {"count": 0, "success": 0, "failure": 0})
        stats["count"] += 1
        stats["success" if result.ok else "failure"] += 1
        self.num_tool_calls += 1
        self.truncated_results += int(result.truncated or _cut_by_tool(result.content))
        self.tool_time_s += result.duration_s
        self.invalid_tool_calls += int(result.unknown_tool or result.invalid_arguments)


def _cut_by_tool(content: str) -> bool:
    """Whether the tool itself cut its output (``{"truncated": true, ...}``).

    Process tools truncate while capturing, so their result already fits the budget and
    the dispatcher's own cut (``ToolCallResult.truncated``) never sees the loss.
    """
    if not content.startswith("{") or '"truncated": true' not in content:
        return False
    try:
        data = json.loads(content)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("truncated") is True


class Episode:
    """Runs one prompt. Create one per prompt; ``run`` may be awaited once."""

    def __init__(
        self,
        *,
        task_id: str,
        prompt: str,
        tool_names: Sequence[str],
        dispatcher: ToolDispatcher,
        client: ModelClient,
        settings: EpisodeSettings,
    ) -> None:
        self.task_id = task_id
        self.prompt = prompt
        self.dispatcher = dispatcher
        self.client = client
        self.settings = settings
        self.definitions = dispatcher.snapshot.get_definitions(tool_names)
        self.offered = [d["function"]["name"] for d in self.definitions]
        self.p = _Progress()
        self.deadline = float("inf")

    def _api_messages(self) -> list[dict[str, Any]]:
        """What the model sees: saved messages plus the ephemeral parts, minus our extras."""
        s = self.settings
        saved = self.p.messages
        system_parts = [m["content"] for m in saved[:1] if m["role"] == "system"]
        if s.ephemeral_system_prompt:
            system_parts.append(s.ephemeral_system_prompt)
        head = [{"role": "system", "content": "\n\n".join(system_parts)}] if system_parts else []
        body = saved[1:] if saved and saved[0]["role"] == "system" else saved
        out = head + [dict(m) for m in s.prefill_messages]
        for message in body:
            clean = {k: v for k, v in message.items() if k != "reasoning"}
            if clean.get("tool_calls") == []:
                del clean["tool_calls"]
            out.append(clean)
        return out

    async def run(self) -> EpisodeRecord:
        started_at, started = _now(), time.monotonic()
        scratch = _make_scratch(self.settings.scratch_root, self.task_id)
        ctx = ToolContext(
            task_id=self.task_id, scratch_dir=scratch, settings=self.dispatcher.snapshot.settings
        )
        if self.settings.system_prompt:
            self.p.messages.append({"role": "system", "content": self.settings.system_prompt})
        self.p.messages.append({"role": "user", "content": self.prompt})
        try:
            self.deadline = started + self.settings.deadline_s
            outcome = await self._loop(ctx)
        finally:
            ctx.close()
            if not self.settings.keep_scratch:
                _remove_scratch(scratch)
        return self._record(outcome, started_at, started, scratch)

    async def _loop(self, ctx: ToolContext) -> _Outcome:
        s = self.settings
        while True:
            if self.p.api_calls >= s.max_turns:
                if s.summary_on_max_turns:
                    return await self._summarise()
                return _Outcome("max_turns", partial=True)
            if time.monotonic() >= self.deadline:
                return _Outcome("deadline", partial=True, error="episode deadline reached")
            turn = await self._call_model(self.definitions)
            if isinstance(turn, _Outcome):
                return turn
            if not turn.tool_calls:
                return _Outcome(turn.finish_reason or "stop", completed=True)
            results = await self._run_tools(turn, ctx)
            all_invalid = all(r.unknown_tool or r.invalid_arguments for r in results)
            self.p.invalid_streak = self.p.invalid_streak + 1 if all_invalid else 0
            if self.p.invalid_streak >= s.max_invalid_turns:
                return _Outcome(
                    "invalid_tool_calls",
                    partial=True,
                    error=f"{self.p.invalid_streak} consecutive turns with only invalid tool calls",
                )

    async def _call_model(self, tools: Sequence[Mapping[str, Any]]) -> Completion | _Outcome:
        try:
            completion = await self.client.complete(
                self._api_messages(), tools, deadline=self.deadline
            )
        except PermanentModelError as exc:
            return _Outcome("error", error=str(exc), error_kind="permanent")
        except TransientModelError as exc:
            if exc.kind == "deadline" or time.monotonic() >= self.deadline:
                return _Outcome("deadline", partial=True, error=str(exc))
            return _Outcome("error", error=str(exc), error_kind="transient")
        self.p.api_calls += 1
        self.p.prompt_tokens += completion.prompt_tokens
        self.p.completion_tokens += completion.completion_tokens
        self.p.model_time_s += completion.latency_s
        for kind in completion.error_kinds:
            self.p.request_errors[kind] = self.p.request_errors.get(kind, 0) + 1
        # Time spent waiting out an endpoint outage is not the episode's own time.
        self.deadline += completion.paused_s
        self.p.messages.append(_assistant_message(completion, self.p.api_calls))
        return completion

    async def _run_tools(self, turn: Completion, ctx: ToolContext) -> list[ToolCallResult]:
        results = []
        calls = self.p.messages[-1]["tool_calls"]
        for call in calls:  # in order: a later call may read what an earlier one wrote
            function = call["function"]
            result = await self.dispatcher.call(
                function["name"], function["arguments"], ctx, offered=self.offered
            )
            self.p.count_tool(result)
            self.p.messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "name": function["name"],
                    "content": result.content,
                }
            )
            results.append(result)
        return results

    async def _summarise(self) -> _Outcome:
        self.p.messages.append({"role": "user", "content": self.settings.summary_prompt})
        turn = await self._call_model(())
        if isinstance(turn, _Outcome):
            return turn
        return _Outcome("max_turns_summary", completed=True, partial=True)

    def _record(
        self, outcome: _Outcome, started_at: str, started: float, scratch: Path
    ) -> EpisodeRecord:
        p = self.p
        has_reasoning = any(m.get("reasoning") for m in p.messages if m["role"] == "assistant")
        return EpisodeRecord(
            task_id=self.task_id,
            tools=list(self.offered),
            messages=p.messages,
            conversations=to_hermes_conversations(p.messages, self.definitions),
            completed=outcome.completed,
            partial=outcome.partial,
            finish_reason=outcome.finish_reason,
            api_calls=p.api_calls,
            num_tool_calls=p.num_tool_calls,
            tool_stats=p.tool_stats,
            truncated_results=p.truncated_results,
            invalid_tool_calls=p.invalid_tool_calls,
            usage={
                "prompt_tokens": p.prompt_tokens,
                "completion_tokens": p.completion_tokens,
                "total_tokens": p.prompt_tokens + p.completion_tokens,
            },
            error=outcome.error,
            error_kind=outcome.error_kind,
            has_reasoning=has_reasoning,
            started_at=started_at,
            finished_at=_now(),
            duration_s=time.monotonic() - started,
            model_time_s=p.model_time_s,
            tool_time_s=p.tool_time_s,
            scratch_dir=str(scratch) if self.settings.keep_scratch else None,
            request_errors=dict(sorted(p.request_errors.items())),
        )


@dataclass(frozen=True)
class _Outcome:
    finish_reason: str
    completed: bool = False
    partial: bool = False
    error: str | None = None
    error_kind: str | None = None


def _assistant_message(completion: Completion, turn: int) -> dict[str, Any]:
    reasoning, content = completion.reasoning, completion.content
    if reasoning is None:
        reasoning, content = split_inline_reasoning(content)
    calls = []
    for index, call in enumerate(completion.tool_calls):
        # Some servers omit ids; pairing results by id needs one.
        call_id = call.get("id") or f"call_{turn}_{index}"
        calls.append({**call, "id": call_id})
    return {"role": "assistant", "content": content, "reasoning": reasoning, "tool_calls": calls}


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _make_scratch(root: Path | None, task_id: str) -> Path:
    base = root or Path(tempfile.gettempdir()) / "hermes-scratch"
    base.mkdir(parents=True, exist_ok=True)
    prefix = _UNSAFE.sub("_", task_id)[:60] + "-"
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def _remove_scratch(path: Path) -> None:
    def make_writable_and_retry(func: Any, target: str, _exc: Any) -> None:
        # The model may have made files or folders read-only; take the write bit back.
        parent = Path(target).parent
        parent.chmod(parent.stat().st_mode | stat.S_IWUSR | stat.S_IXUSR)
        Path(target).chmod(stat.S_IRWXU)
        func(target)

    try:
        shutil.rmtree(path, onerror=make_writable_and_retry)
    except OSError as exc:
        logger.warning("could not remove scratch directory %s: %s", path, exc)


async def run_episode(
    prompt: str,
    *,
    task_id: str,
    tool_names: Sequence[str],
    dispatcher: ToolDispatcher,
    client: ModelClient,
    settings: EpisodeSettings,
) -> EpisodeRecord:
    """Run one prompt to completion; never raises for model or tool failures."""
    episode = Episode(
        task_id=task_id,
        prompt=prompt,
        tool_names=tool_names,
        dispatcher=dispatcher,
        client=client,
        settings=settings,
    )
    return await episode.run()


__all__ = ["Episode", "EpisodeRecord", "EpisodeSettings", "run_episode"]
