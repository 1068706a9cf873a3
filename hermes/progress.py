"""Progress on the terminal: episodes done/total, rate, tool calls, tokens/s, failures."""

from __future__ import annotations

import time
from typing import TextIO

from tqdm import tqdm

from hermes.worker import ShardReceipt


class Progress:
    """A tqdm bar fed with shard receipts; silent when disabled (tests, pipes)."""

    def __init__(self, *, total: int, enabled: bool, out: TextIO) -> None:
        self.started = time.monotonic()
        self.tool_calls = 0
        self.tokens = 0
        self.failures = 0
        self.rejected = 0
        self.bar = tqdm(
            total=total,
            unit="ep",
            desc="episodes",
            disable=not enabled,
            file=out,
            dynamic_ncols=True,
        )

    def update(self, receipt: ShardReceipt) -> None:
        totals = receipt.stats.get("totals", {})
        histograms = receipt.stats.get("histograms", {})
        self.tool_calls += int(totals.get("tool_calls", 0))
        self.tokens += int(histograms.get("total_tokens", {}).get("total", 0))
        self.failures += len(receipt.failed)
        self.rejected += receipt.rejected
        elapsed = max(time.monotonic() - self.started, 1e-6)
        self.bar.set_postfix(
            tools=self.tool_calls,
            tok_s=f"{self.tokens / elapsed:.0f}",
            rejected=self.rejected,
            failed=self.failures,
            refresh=False,
        )
        self.bar.update(receipt.kept + receipt.rejected + len(receipt.failed))

    def close(self) -> None:
        self.bar.close()
