"""Named toolset distributions and seeded, per-prompt toolset sampling.

A distribution decides which toolsets an episode is offered. It has one of two modes:

* ``independent``: each toolset has an inclusion probability in percent and is drawn on
  its own, so a prompt gets any subset;
* ``weighted_choice``: a list of explicit toolset combinations, one of which is drawn by
  weight.

Sampling is a pure function of (job seed, distribution name, prompt id): the same job
gives every prompt the same toolsets whatever the worker count, scheduling order or
machine. Toolsets that are not available on a worker are dropped after the draw, so the
draw itself never depends on availability. A prompt always gets at least one toolset
when any toolset of the distribution is available: when nothing survives the draw, the
available toolset with the highest inclusion probability is used (ties go to the
alphabetically first name).

Custom distributions come from a job file's ``distributions`` mapping or a YAML file::

    my_dist:
      description: Mostly shell work
      toolsets: {terminal: 80, file: 50}
    my_combo:
      description: One kit per prompt
      combinations:
        - {toolsets: [terminal, file], weight: 3}
        - {toolsets: [web], weight: 1}      # weight defaults to 1

A custom distribution may replace a built-in one only with ``override: true``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import math
import random
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import yaml

from hermes.errors import ConfigError

logger = logging.getLogger(__name__)

Mode = Literal["independent", "weighted_choice"]

_KEYS = ("combinations", "description", "override", "toolsets")
_COMBINATION_KEYS = ("toolsets", "weight")


class DistributionError(ConfigError, ValueError):
    """A distribution is unknown, malformed or names unknown toolsets (raised at job load)."""


def _is_number(value: object) -> bool:
    # bool is an int subclass, but `terminal: yes` is a typo, not a probability.
    return isinstance(value, int | float) and not isinstance(value, bool)


def _did_you_mean(word: str, options: Collection[str]) -> str:
    close = difflib.get_close_matches(word, sorted(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


@dataclass(frozen=True, slots=True)
class Combination:
    """One toolset combination of a weighted_choice distribution."""

    toolsets: tuple[str, ...]
    weight: float = 1.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Distribution:
    """A named toolset distribution; invalid values raise DistributionError on creation.

    ``probabilities`` (independent mode) holds (toolset, percent) pairs; ``combinations``
    (weighted_choice mode) holds the combinations. Exactly one of the two is non-empty.
    Both are stored in a canonical order, so the order they were written in never
    changes a draw.
    """

    name: str
    description: str = ""
    probabilities: tuple[tuple[str, float], ...] = ()
    combinations: tuple[Combination, ...] = ()
    source: str = "built-in"

    def __post_init__(self) -> None:
        _check(self)
        probs = tuple(sorted((t, float(p)) for t, p in self.probabilities))
        combos = sorted(
            (Combination(tuple(sorted(c.toolsets)), float(c.weight)) for c in self.combinations),
            key=lambda c: (c.toolsets, c.weight),
        )
        object.__setattr__(self, "probabilities", probs)
        object.__setattr__(self, "combinations", tuple(combos))

    @classmethod
    def independent(
        cls, name: str, description: str, percents: Mapping[str, float], source: str = "built-in"
    ) -> Distribution:
        return cls(
            name=name, description=description, probabilities=tuple(percents.items()), source=source
        )

    @property
    def mode(self) -> Mode:
        return "weighted_choice" if self.combinations else "independent"

    @property
    def toolsets(self) -> tuple[str, ...]:
        """Every toolset the distribution names, sorted."""
        if self.combinations:
            return tuple(sorted({t for c in self.combinations for t in c.toolsets}))
        return tuple(t for t, _ in self.probabilities)

    def draw_probabilities(self) -> dict[str, float]:
        """Chance (0..1) that the draw picks each toolset, before availability and fallback."""
        if not self.combinations:
            return {t: p / 100.0 for t, p in self.probabilities}
        total = sum(c.weight for c in self.combinations)
        return {
            t: sum(c.weight for c in self.combinations if t in c.toolsets) / total
            for t in self.toolsets
        }

    def to_spec(self) -> dict[str, Any]:
        """The YAML/JSON form this distribution can be loaded back from."""
        spec: dict[str, Any] = {"description": self.description}
        if self.combinations:
            spec["combinations"] = [
                {"toolsets": list(c.toolsets), "weight": c.weight} for c in self.combinations
            ]
        else:
            spec["toolsets"] = dict(self.probabilities)
        return spec

    def fingerprint(self) -> str:
        """A hash of what changes draws (name and weights), for job config hashes."""
        canonical = json.dumps([self.name, self.to_spec()], sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()


def _check(dist: Distribution) -> None:
    where = f"distribution {dist.name!r}"
    if not isinstance(dist.name, str) or not dist.name.strip():
        raise DistributionError(f"distribution names must be non-empty strings, got {dist.name!r}")
    if dist.probabilities and dist.combinations:
        raise DistributionError(
            f"{where} gives both `toolsets` and `combinations`; use `toolsets` for independent "
            "per-toolset probabilities or `combinations` for one weighted choice, not both"
        )
    if not dist.probabilities and not dist.combinations:
        raise DistributionError(
            f"{where} is empty; give `toolsets: {{name: percent, ...}}` or "
            "`combinations: [{toolsets: [...], weight: N}, ...]`"
        )
    if dist.combinations:
        _check_combinations(dist.combinations, where)
        return
    for toolset, percent in dist.probabilities:
        if not isinstance(toolset, str) or not toolset:
            raise DistributionError(f"{where}: toolset names must be strings, got {toolset!r}")
        if not _is_number(percent) or not math.isfinite(percent):
            raise DistributionError(
                f"{where}: the probability of {toolset!r} must be a number of percent from 0 "
                f"to 100, got {percent!r}"
            )
        if not 0 <= percent <= 100:
            raise DistributionError(
                f"{where}: the probability of {toolset!r} is {percent:g}; "
                "probabilities are percentages from 0 to 100"
            )
    if all(p == 0 for _, p in dist.probabilities):
        raise DistributionError(
            f"{where}: every toolset has probability 0, so no prompt could get a toolset; "
            "give at least one toolset a probability above 0"
        )


def _check_combinations(combinations: tuple[Combination, ...], where: str) -> None:
    for index, combo in enumerate(combinations, start=1):
        label = f"{where}: combination {index}"
        names = combo.toolsets
        if not names:
            raise DistributionError(f"{label} has an empty toolset list; list at least one toolset")
        if not all(isinstance(t, str) and t for t in names):
            raise DistributionError(f"{label}: toolset names must be strings, got {list(names)!r}")
        twice = sorted({t for t in names if names.count(t) > 1})
        if twice:
            raise DistributionError(f"{label} lists {', '.join(twice)} more than once")
        if not _is_number(combo.weight) or not math.isfinite(combo.weight) or combo.weight <= 0:
            raise DistributionError(
                f"{label} ({', '.join(names)}) has weight {combo.weight!r}; "
                "weights must be positive numbers"
            )


# --- built-ins ------------------------------------------------------------------------------

_BUILTIN_TABLE: tuple[tuple[str, str, dict[str, float]], ...] = (
    ("default", "Every base toolset on every prompt", {
        "web": 100, "vision": 100, "image_gen": 100, "terminal": 100, "file": 100, "browser": 100,
    }),
    ("image_gen", "Mostly image generation and vision; often web, sometimes a terminal", {
        "image_gen": 90, "vision": 90, "web": 55, "terminal": 45,
    }),
    ("research", "Web research, often with a browser, sometimes vision, rarely a terminal", {
        "web": 90, "browser": 70, "vision": 50, "terminal": 10,
    }),
    ("science", "Web, terminal and files almost always; vision and browser often", {
        "web": 94, "terminal": 94, "file": 94, "vision": 65, "browser": 50, "image_gen": 15,
    }),
    ("development", "Terminal and files most of the time; web sometimes, vision rarely", {
        "terminal": 80, "file": 80, "web": 30, "vision": 10,
    }),
    ("safe", "No terminal or file access: web, browser, vision and image generation", {
        "web": 80, "browser": 70, "vision": 60, "image_gen": 60,
    }),
    ("balanced", "Each base toolset on a coin flip", {
        "web": 50, "vision": 50, "image_gen": 50, "terminal": 50, "file": 50, "browser": 50,
    }),
    ("minimal", "Web search and extraction only", {"web": 100}),
    ("terminal_only", "Terminal and files only", {"terminal": 100, "file": 100}),
    ("terminal_web", "Terminal and files, plus web for documentation", {
        "terminal": 100, "file": 100, "web": 100,
    }),
    ("creative", "Image generation and vision, sometimes web", {
        "image_gen": 90, "vision": 90, "web": 30,
    }),
    ("reasoning", "Mostly web, often files, rarely a terminal", {
        "web": 90, "file": 60, "terminal": 20,
    }),
    ("browser_use", "A browser always; web search and vision usually", {
        "browser": 100, "web": 80, "vision": 70,
    }),
    ("browser_only", "A browser and nothing else", {"browser": 100}),
    ("browser_tasks", "A browser nearly always; a terminal or vision now and then", {
        "browser": 97, "vision": 12, "terminal": 15,
    }),
    ("terminal_tasks", "Terminal, files and web nearly always; browser and vision often", {
        "terminal": 97, "file": 97, "web": 97, "browser": 75, "vision": 50, "image_gen": 10,
    }),
    ("mixed_tasks", "Browser, terminal and files nearly always; other toolsets sometimes", {
        "browser": 92, "terminal": 92, "file": 92, "web": 35, "vision": 15, "image_gen": 15,
    }),
)  # fmt: skip

BUILTIN_DISTRIBUTIONS: Mapping[str, Distribution] = MappingProxyType(
    {name: Distribution.independent(name, text, table) for name, text, table in _BUILTIN_TABLE}
)


# --- catalog and loading --------------------------------------------------------------------


@dataclass(frozen=True, eq=False, slots=True)
class DistributionCatalog:
    """Built-in distributions merged with a job's custom ones (built-ins listed first)."""

    distributions: Mapping[str, Distribution] = field(default_factory=lambda: BUILTIN_DISTRIBUTIONS)

    def __post_init__(self) -> None:
        # A private read-only copy: the caller's dict cannot change the catalog later.
        frozen = MappingProxyType(dict(self.distributions))
        object.__setattr__(self, "distributions", frozen)

    def __contains__(self, name: object) -> bool:
        return name in self.distributions

    def __iter__(self) -> Iterator[Distribution]:
        return iter(self.distributions.values())

    def __len__(self) -> int:
        return len(self.distributions)

    def names(self) -> tuple[str, ...]:
        return tuple(self.distributions)

    def get(self, name: str) -> Distribution:
        """The distribution called ``name``; an unknown name lists the valid ones."""
        try:
            return self.distributions[name]
        except KeyError:
            raise DistributionError(
                f"unknown toolset distribution {name!r}{_did_you_mean(name, self.names())}; "
                f"valid names: {', '.join(self.names())}"
            ) from None


def parse_distribution(name: object, raw: object, *, source: str) -> tuple[Distribution, bool]:
    """Build a custom distribution from its YAML/JSON form; returns it and its override flag."""
    if not isinstance(name, str) or not name.strip():
        raise DistributionError(f"{source}: distribution names must be strings, got {name!r}")
    where = f"{source}: distribution {name!r}"
    if not isinstance(raw, Mapping):
        raise DistributionError(
            f"{where} must be a mapping with `description` and `toolsets` or `combinations`, "
            f"got {type(raw).__name__}"
        )
    for key in raw:
        if key not in _KEYS:
            raise DistributionError(
                f"{where} has unknown key {key!r}{_did_you_mean(str(key), _KEYS)}; "
                f"allowed keys: {', '.join(_KEYS)}"
            )
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise DistributionError(f"{where}: `description` must be a string")
    override = raw.get("override", False)
    if not isinstance(override, bool):
        raise DistributionError(f"{where}: `override` must be true or false, got {override!r}")
    toolsets = raw.get("toolsets") or {}
    if not isinstance(toolsets, Mapping):
        raise DistributionError(
            f"{where}: `toolsets` must map toolset names to percentages, e.g. "
            "{terminal: 80, file: 50} (for a list of combinations use `combinations`)"
        )
    entries = _as_list(raw.get("combinations"), where)
    combos = tuple(
        _parse_combination(entry, f"{where}: combination {index}")
        for index, entry in enumerate(entries, start=1)
    )
    try:
        dist = Distribution(
            name=name,
            description=description,
            probabilities=tuple(toolsets.items()),
            combinations=combos,
            source=source,
        )
    except DistributionError as exc:
        raise DistributionError(f"{source}: {exc}") from None
    return dist, override


def _as_list(value: object, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise DistributionError(
            f"{where}: `combinations` must be a list of {{toolsets: [...], weight: N}} entries"
        )
    return value


def _parse_combination(raw: object, label: str) -> Combination:
    if not isinstance(raw, Mapping):
        raise DistributionError(f"{label} must be a mapping like {{toolsets: [web], weight: 1}}")
    for key in raw:
        if key not in _COMBINATION_KEYS:
            raise DistributionError(
                f"{label} has unknown key {key!r}{_did_you_mean(str(key), _COMBINATION_KEYS)}; "
                f"allowed keys: {', '.join(_COMBINATION_KEYS)}"
            )
    names = raw.get("toolsets")
    if not isinstance(names, list):
        raise DistributionError(
            f"{label}: `toolsets` must be a list of toolset names, e.g. [terminal, file]"
        )
    return Combination(tuple(names), raw.get("weight", 1))


def load_distributions(
    inline: Mapping[str, Any] | None = None, file: Path | str | None = None
) -> DistributionCatalog:
    """The built-ins plus the custom distributions of a job (inline mapping and/or file)."""
    custom: dict[str, Distribution] = {}
    sources: list[tuple[str, Mapping[Any, Any]]] = []
    if file is not None:
        sources.append((str(file), _read_yaml(Path(file))))
    if inline:
        sources.append(("the job's `distributions`", inline))
    for source, table in sources:
        for name, raw in table.items():
            dist, override = parse_distribution(name, raw, source=source)
            if name in custom:
                raise DistributionError(
                    f"distribution {name!r} is defined both in {custom[name].source} and in "
                    f"{source}; keep one"
                )
            _check_shadowing(dist, override)
            custom[name] = dist
    merged = {**BUILTIN_DISTRIBUTIONS, **dict(sorted(custom.items()))}
    return DistributionCatalog(MappingProxyType(merged))


def _check_shadowing(dist: Distribution, override: bool) -> None:
    builtin = dist.name in BUILTIN_DISTRIBUTIONS
    if builtin and not override:
        raise DistributionError(
            f"{dist.source}: custom distribution {dist.name!r} has the name of a built-in one; "
            "rename it, or set `override: true` in it to replace the built-in"
        )
    if override and not builtin:
        raise DistributionError(
            f"{dist.source}: distribution {dist.name!r} sets `override: true` but there is no "
            f"built-in distribution of that name{_did_you_mean(dist.name, BUILTIN_DISTRIBUTIONS)}"
            "; remove `override` or fix the name"
        )


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (PyYAML silently keeps the last one)."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping
)


def _read_yaml(path: Path) -> Mapping[Any, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DistributionError(
            f"cannot read distributions file {path}: {exc.strerror or exc}"
        ) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise DistributionError(f"distributions file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, Mapping) or not data:
        raise DistributionError(
            f"distributions file {path} must be a non-empty mapping of distribution names to "
            f"definitions, got {type(data).__name__ if data is not None else 'an empty file'}"
        )
    return data


def validate(catalog: DistributionCatalog, name: str, known_toolsets: Collection[str]) -> None:
    """Check at job load that ``name`` exists and names only known toolsets."""
    dist = catalog.get(name)
    known = set(known_toolsets)
    unknown = [t for t in dist.toolsets if t not in known]
    if unknown:
        hints = [f"{t!r}{_did_you_mean(t, known)}" for t in unknown]
        raise DistributionError(
            f"distribution {name!r} ({dist.source}) uses unknown toolset(s) "
            f"{', '.join(hints)}; valid toolsets: {', '.join(sorted(known))}"
        )


# --- sampling and exact expectations ---------------------------------------------------------


def _rng(job_seed: int, name: str, prompt_id: str) -> random.Random:
    # JSON makes the key unambiguous ("a"+"bc" vs "ab"+"c"); sha256 is stable everywhere,
    # unlike hash(), which is salted per process.
    key = json.dumps([int(job_seed), name, str(prompt_id)], ensure_ascii=False)
    return random.Random(int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest(), "big"))


def _draw(dist: Distribution, rng: random.Random) -> tuple[str, ...]:
    # Only Random.random() is used: its output for an int seed is stable across Python
    # versions, unlike choices()/sample() whose algorithms may change.
    if not dist.combinations:
        # One number per toolset, in sorted order, even at 0% or 100%, so changing one
        # toolset's probability never shifts the draws of the others.
        return tuple(t for t, p in dist.probabilities if rng.random() * 100.0 < p)
    point = rng.random() * sum(c.weight for c in dist.combinations)
    for combo in dist.combinations:
        point -= combo.weight
        if point < 0:
            return combo.toolsets
    return dist.combinations[-1].toolsets  # float rounding at the very top of the range


def _allowed(dist: Distribution, available: Collection[str] | None) -> frozenset[str]:
    names = frozenset(dist.toolsets)
    return names if available is None else names & frozenset(available)


def _fallback(dist: Distribution, allowed: frozenset[str]) -> str | None:
    candidates = [(p, t) for t, p in dist.draw_probabilities().items() if p > 0 and t in allowed]
    if not candidates:
        return None
    return min(candidates, key=lambda c: (-c[0], c[1]))[1]


def sample_toolsets(
    distribution: Distribution,
    *,
    job_seed: int,
    prompt_id: str,
    available: Collection[str] | None = None,
) -> list[str]:
    """The sorted toolsets of one prompt, drawn from (job_seed, distribution name, prompt_id).

    Returns an empty list only when none of the distribution's toolsets is available.
    """
    drawn = _draw(distribution, _rng(job_seed, distribution.name, prompt_id))
    allowed = _allowed(distribution, available)
    kept = sorted(t for t in drawn if t in allowed)
    if kept:
        return kept
    fallback = _fallback(distribution, allowed)
    return [] if fallback is None else [fallback]


def inclusion_probabilities(
    distribution: Distribution, available: Collection[str] | None = None
) -> dict[str, float]:
    """Exact chance (0..1) that each toolset is in a prompt's sample, fallback included."""
    allowed = _allowed(distribution, available)
    fallback = _fallback(distribution, allowed)
    if not distribution.combinations:
        result = {t: (p / 100.0 if t in allowed else 0.0) for t, p in distribution.probabilities}
        if fallback is not None:
            result[fallback] += math.prod(
                1.0 - p / 100.0 for t, p in distribution.probabilities if t in allowed
            )
        return result
    result = dict.fromkeys(distribution.toolsets, 0.0)
    total = sum(c.weight for c in distribution.combinations)
    for combo in distribution.combinations:
        kept = [t for t in combo.toolsets if t in allowed]
        if not kept and fallback is not None:
            kept = [fallback]
        for toolset in kept:
            result[toolset] += combo.weight / total
    return result


def expected_toolsets(
    distribution: Distribution, available: Collection[str] | None = None
) -> float:
    """Exact expected number of toolsets per prompt (linearity over the inclusions)."""
    return math.fsum(inclusion_probabilities(distribution, available).values())


# --- listing --------------------------------------------------------------------------------


def _percent(fraction: float) -> str:
    return f"{fraction * 100:.4g}%"


def _describe(dist: Distribution, available: Collection[str] | None) -> list[str]:
    allowed = _allowed(dist, available)
    mark = {t: ("" if t in allowed else "  (unavailable here)") for t in dist.toolsets}
    origin = "built-in" if dist.source == "built-in" else f"from {dist.source}"
    lines = [f"{dist.name}  [{dist.mode}, {origin}]", f"  {dist.description or '-'}"]
    width = max(len(t) for t in dist.toolsets)
    if dist.combinations:
        total = sum(c.weight for c in dist.combinations)
        lines.append("  combinations (one per prompt):")
        for combo in dist.combinations:
            share = _percent(combo.weight / total)
            lines.append(f"    {share:>7}  {', '.join(combo.toolsets)}  (weight {combo.weight:g})")
        lines.append("  toolsets (chance of being drawn):")
    else:
        lines.append("  toolsets (each drawn independently):")
    for toolset, fraction in dist.draw_probabilities().items():
        lines.append(f"    {toolset:<{width}}  {_percent(fraction):>7}{mark[toolset]}")
    lines.append(f"  expected toolsets per prompt: {expected_toolsets(dist):.2f}")
    if available is not None:
        here = expected_toolsets(dist, available)
        lines.append(f"  expected with the toolsets available here: {here:.2f}")
    return lines


def format_distributions(
    catalog: DistributionCatalog, available: Collection[str] | None = None
) -> str:
    """Plain-text listing of every distribution, for `hermes-batch distributions`."""
    blocks = ["\n".join(_describe(dist, available)) for dist in catalog]
    return "\n\n".join(blocks) + "\n"


def distributions_as_json(
    catalog: DistributionCatalog, available: Collection[str] | None = None
) -> str:
    """JSON listing (specs plus exact inclusion probabilities), for `--json`."""
    rows = []
    for dist in catalog:
        row: dict[str, Any] = {"name": dist.name, "mode": dist.mode, "source": dist.source}
        row.update(dist.to_spec())
        row["inclusion_probabilities"] = inclusion_probabilities(dist, available)
        row["expected_toolsets"] = expected_toolsets(dist, available)
        rows.append(row)
    return json.dumps(rows, indent=2, ensure_ascii=False)
