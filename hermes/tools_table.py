"""The ``hermes-batch tools`` listing: every toolset and tool, available or not, and why."""

from __future__ import annotations

import json
from dataclasses import dataclass

from tools.discovery import DiscoveryReport
from tools.registry import RegistrySnapshot, ToolRegistry


@dataclass(frozen=True, kw_only=True)
class ToolRow:
    toolset: str
    tool: str
    available: bool
    reason: str


def tool_rows(registry: ToolRegistry, snapshot: RegistrySnapshot) -> list[ToolRow]:
    """One row per tool of each base toolset (composites are summarised separately)."""
    rows = []
    for toolset in sorted(snapshot.toolsets):
        if registry.get_toolset(toolset).includes:
            continue
        for tool in snapshot.toolsets[toolset]:
            if tool in snapshot.entries:
                rows.append(ToolRow(toolset=toolset, tool=tool, available=True, reason=""))
                continue
            reason = snapshot.unavailable.get(tool)
            if reason is None and registry.get_entry(tool) is None:
                reason = "not registered (its module is missing or failed to import)"
            rows.append(ToolRow(toolset=toolset, tool=tool, available=False, reason=reason or ""))
    return rows


def composite_rows(registry: ToolRegistry, snapshot: RegistrySnapshot) -> list[str]:
    """One line per toolset built from ``includes``, with how much of it is available."""
    lines = []
    for toolset in sorted(snapshot.toolsets):
        includes = registry.get_toolset(toolset).includes
        if not includes:
            continue
        tools = snapshot.toolsets[toolset]
        usable = sum(1 for t in tools if t in snapshot.entries)
        lines.append(
            f"{toolset} = {' + '.join(includes)}: {usable} of {len(tools)} tools available"
        )
    return lines


def render_text(
    rows: list[ToolRow], composites: list[str], report: DiscoveryReport, fingerprint: str
) -> str:
    """A fixed-width table followed by import failures, for a terminal."""
    header = ("TOOLSET", "TOOL", "AVAILABLE", "WHY NOT")
    cells = [(r.toolset, r.tool, "yes" if r.available else "no", r.reason) for r in rows]
    widths = [
        max(len(h), *(len(c[i]) for c in cells)) if cells else len(h)
        for i, h in enumerate(header[:3])
    ]
    lines = []
    for row in [header, *cells]:
        lines.append(
            "  ".join(v.ljust(w) for v, w in zip(row[:3], widths, strict=True)) + "  " + row[3]
        )
    if composites:
        lines += ["", "Composite toolsets:", *(f"  {line}" for line in composites)]
    available = len({r.tool for r in rows if r.available})
    total = len({r.tool for r in rows})
    lines.append("")
    lines.append(f"{available} of {total} tools available; registry fingerprint {fingerprint}")
    for module, error in sorted(report.failed.items()):
        lines.append(f"failed to import {module}: {error}")
    return "\n".join(line.rstrip() for line in lines)


def render_json(
    rows: list[ToolRow], composites: list[str], report: DiscoveryReport, fingerprint: str
) -> str:
    payload = {
        "fingerprint": fingerprint,
        "tools": [r.__dict__ for r in rows],
        "composite_toolsets": composites,
        "failed_imports": report.failed,
    }
    return json.dumps(payload, indent=2)
