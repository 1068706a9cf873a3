"""Pause a worker's model requests while the endpoint is down, instead of failing prompts.

One gate per worker, shared by its episodes. After ``failure_threshold`` consecutive
transient failures (connection refused, timeouts, 5xx, garbage bodies; not 429, which
carries its own Retry-After) the gate closes: requests wait, one probe goes out every
``probe_interval_s``, and the first success reopens the gate for everyone. Time spent
waiting does not count against an episode's retries or deadline. After ``max_outage_s``
without a success the waiting requests fail as transient, so the prompts are listed as
infrastructure failures and ``--resume`` runs them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

# Failure kinds that suggest the endpoint itself is unreachable or broken.
_NOT_OUTAGE = frozenset({"rate_limit", "deadline", "outage"})


@dataclass(frozen=True, kw_only=True)
class OutagePolicy:
    failure_threshold: int = 8
    probe_interval_s: float = 2.0
    max_outage_s: float = 600.0

    def __post_init__(self) -> None:
        if self.failure_threshold < 1 or self.probe_interval_s <= 0 or self.max_outage_s <= 0:
            raise ValueError("outage policy values must be positive")


class OutageError(Exception):
    """The endpoint stayed down longer than ``max_outage_s``."""


class OutageGate:
    """Shared by every request of one worker; all methods run on its event loop."""

    def __init__(
        self, policy: OutagePolicy | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.policy = policy or OutagePolicy()
        self._clock = clock
        self.consecutive_failures = 0
        self.opened_at: float | None = None
        self.next_probe = 0.0
        self.probing = False
        self.outages = 0
        self.paused_s = 0.0
        self._reopened: asyncio.Event | None = None

    @property
    def closed(self) -> bool:
        """True while requests are held back."""
        return self.opened_at is not None

    def _event(self) -> asyncio.Event:
        if self._reopened is None:
            self._reopened = asyncio.Event()
            self._reopened.set()
        return self._reopened

    async def admit(self) -> tuple[bool, float]:
        """Wait until a request may go out. Returns (is_probe, seconds waited); raises
        ``OutageError`` when the outage outlasted ``max_outage_s``."""
        started = self._clock()
        while self.opened_at is not None:
            now = self._clock()
            if now - self.opened_at > self.policy.max_outage_s:
                raise OutageError(
                    f"endpoint unavailable for {now - self.opened_at:.0f} s "
                    f"(max_outage_s={self.policy.max_outage_s:g})"
                )
            if not self.probing and now >= self.next_probe:
                self.probing = True
                waited = self._clock() - started
                self.paused_s += waited
                return True, waited
            wait = max(min(self.next_probe - now, self.policy.probe_interval_s), 0.01)
            try:
                await asyncio.wait_for(self._event().wait(), wait)
            except asyncio.TimeoutError:
                continue
        waited = self._clock() - started
        self.paused_s += waited
        return False, waited

    def success(self) -> None:
        if self.opened_at is not None:
            logger.warning(
                "endpoint is back after %.1f s; resuming requests", self._clock() - self.opened_at
            )
        self.consecutive_failures = 0
        self.opened_at = None
        self.probing = False
        self._event().set()

    def failure(self, kind: str, *, probe: bool) -> None:
        if kind in _NOT_OUTAGE:
            return
        self.consecutive_failures += 1
        now = self._clock()
        if probe:
            self.probing = False
            self.next_probe = now + self.policy.probe_interval_s
        if self.opened_at is None and self.consecutive_failures >= self.policy.failure_threshold:
            self.opened_at = now
            self.next_probe = now + self.policy.probe_interval_s
            self.outages += 1
            self._event().clear()
            logger.warning(
                "endpoint failing (%d consecutive failures, last: %s); pausing requests and "
                "probing every %.1f s for up to %.0f s",
                self.consecutive_failures,
                kind,
                self.policy.probe_interval_s,
                self.policy.max_outage_s,
            )
