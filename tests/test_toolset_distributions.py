"""Toolset distributions: built-ins, seeded sampling, exact expectations, validation, listing."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from toolset_distributions import (
    BUILTIN_DISTRIBUTIONS,
    Distribution,
    DistributionCatalog,
    DistributionError,
    distributions_as_json,
    expected_toolsets,
    format_distributions,
    inclusion_probabilities,
    load_distributions,
    parse_distribution,
    sample_toolsets,
    validate,
)

ROOT = Path(__file__).resolve().parent.parent
# The toolsets the reference tool's distributions use (and this project registers).
BASE_TOOLSETS = frozenset({"browser", "file", "image_gen", "terminal", "vision", "web"})
N = 5000
# The samples are fixed by their seeds, so these tests are not flaky; the bound only says
# that the seed was not chosen to pass. 4.5 sigma of a binomial is exceeded with
# probability about 7e-6 per comparison.
SIGMAS = 4.5


def _spec(raw: dict[str, Any], name: str = "custom") -> Distribution:
    return parse_distribution(name, raw, source="test")[0]


def _assert_frequencies_match(dist: Distribution, available: set[str] | None = None) -> None:
    exact = inclusion_probabilities(dist, available)
    counts: Counter[str] = Counter()
    sizes: list[int] = []
    for i in range(N):
        picked = sample_toolsets(dist, job_seed=7, prompt_id=f"p{i}", available=available)
        counts.update(picked)
        sizes.append(len(picked))
    for toolset, p in exact.items():
        sigma = math.sqrt(p * (1 - p) / N)
        observed = counts[toolset] / N
        assert abs(observed - p) <= SIGMAS * sigma + 1e-12, (toolset, observed, p)
    mean = sum(sizes) / N
    sd = math.sqrt(sum((s - mean) ** 2 for s in sizes) / (N - 1))
    assert abs(mean - expected_toolsets(dist, available)) <= SIGMAS * sd / math.sqrt(N) + 1e-12


# --- built-ins ------------------------------------------------------------------------------


def test_builtins_have_the_reference_names_and_weights() -> None:
    assert list(BUILTIN_DISTRIBUTIONS) == [
        "default", "image_gen", "research", "science", "development", "safe", "balanced",
        "minimal", "terminal_only", "terminal_web", "creative", "reasoning", "browser_use",
        "browser_only", "browser_tasks", "terminal_tasks", "mixed_tasks",
    ]  # fmt: skip
    used = {t for dist in BUILTIN_DISTRIBUTIONS.values() for t in dist.toolsets}
    assert used == BASE_TOOLSETS
    assert all(dist.mode == "independent" for dist in BUILTIN_DISTRIBUTIONS.values())
    assert dict(BUILTIN_DISTRIBUTIONS["terminal_tasks"].probabilities) == {
        "terminal": 97, "file": 97, "web": 97, "browser": 75, "vision": 50, "image_gen": 10,
    }  # fmt: skip
    assert dict(BUILTIN_DISTRIBUTIONS["image_gen"].probabilities) == {
        "image_gen": 90, "vision": 90, "web": 55, "terminal": 45,
    }  # fmt: skip
    assert dict(BUILTIN_DISTRIBUTIONS["browser_tasks"].probabilities) == {
        "browser": 97, "vision": 12, "terminal": 15,
    }  # fmt: skip
    assert expected_toolsets(BUILTIN_DISTRIBUTIONS["default"]) == 6.0


def test_every_builtin_validates_against_the_base_toolsets() -> None:
    catalog = load_distributions()
    for name in BUILTIN_DISTRIBUTIONS:
        validate(catalog, name, BASE_TOOLSETS)


def test_module_state_is_immutable() -> None:
    with pytest.raises(TypeError):
        BUILTIN_DISTRIBUTIONS["mine"] = BUILTIN_DISTRIBUTIONS["default"]  # type: ignore[index]
    with pytest.raises(AttributeError):
        BUILTIN_DISTRIBUTIONS["default"].name = "other"  # type: ignore[misc]
    source = {"only": BUILTIN_DISTRIBUTIONS["minimal"]}
    catalog = DistributionCatalog(source)
    source["extra"] = BUILTIN_DISTRIBUTIONS["default"]
    assert catalog.names() == ("only",)


# --- determinism ----------------------------------------------------------------------------

_CHILD = """
import json, sys
from toolset_distributions import BUILTIN_DISTRIBUTIONS, sample_toolsets
dist = BUILTIN_DISTRIBUTIONS["balanced"]
print(json.dumps([sample_toolsets(dist, job_seed=42, prompt_id=f"id-{i}") for i in range(300)]))
"""


def test_samples_are_identical_in_fresh_processes_with_different_hash_salts() -> None:
    outputs = []
    for salt in ("1", "987654"):
        env = {**os.environ, "PYTHONHASHSEED": salt}
        done = subprocess.run(
            [sys.executable, "-c", _CHILD], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        outputs.append(json.loads(done.stdout))
    here = [
        sample_toolsets(BUILTIN_DISTRIBUTIONS["balanced"], job_seed=42, prompt_id=f"id-{i}")
        for i in range(300)
    ]
    assert outputs[0] == outputs[1] == here


def test_a_different_seed_or_distribution_name_changes_assignments() -> None:
    dist = BUILTIN_DISTRIBUTIONS["balanced"]
    ids = [f"id-{i}" for i in range(200)]
    first = [sample_toolsets(dist, job_seed=1, prompt_id=i) for i in ids]
    again = [sample_toolsets(dist, job_seed=1, prompt_id=i) for i in ids]
    other = [sample_toolsets(dist, job_seed=2, prompt_id=i) for i in ids]
    assert first == again
    assert sum(a != b for a, b in zip(first, other, strict=True)) > 150
    renamed = Distribution.independent("balanced2", "", dict(dist.probabilities))
    moved = [sample_toolsets(renamed, job_seed=1, prompt_id=i) for i in ids]
    assert sum(a != b for a, b in zip(first, moved, strict=True)) > 150


def test_sampling_order_does_not_matter() -> None:
    dist = BUILTIN_DISTRIBUTIONS["mixed_tasks"]
    ids = [f"row-{i}" for i in range(1000)]
    forward = {i: sample_toolsets(dist, job_seed=3, prompt_id=i) for i in ids}
    random.Random(0).shuffle(ids)
    shuffled = {i: sample_toolsets(dist, job_seed=3, prompt_id=i) for i in ids}
    assert forward == shuffled
    assert len({tuple(v) for v in forward.values()}) > 10


def test_dict_and_combination_order_do_not_change_draws() -> None:
    one = _spec({"toolsets": {"web": 30, "terminal": 60, "file": 10}})
    two = _spec({"toolsets": {"file": 10, "terminal": 60, "web": 30}})
    combo_a = _spec({"combinations": [{"toolsets": ["web"]}, {"toolsets": ["file", "terminal"]}]})
    combo_b = _spec({"combinations": [{"toolsets": ["terminal", "file"]}, {"toolsets": ["web"]}]})
    for i in range(300):
        assert sample_toolsets(one, job_seed=5, prompt_id=str(i)) == sample_toolsets(
            two, job_seed=5, prompt_id=str(i)
        )
        assert sample_toolsets(combo_a, job_seed=5, prompt_id=str(i)) == sample_toolsets(
            combo_b, job_seed=5, prompt_id=str(i)
        )


# --- statistics -----------------------------------------------------------------------------


def test_independent_frequencies_match_exact_probabilities_with_the_fallback() -> None:
    # P(nothing drawn) = 0.7 * 0.8 * 0.9 = 0.504, so the fallback (web) matters a lot.
    dist = _spec({"toolsets": {"web": 30, "terminal": 20, "file": 10, "vision": 0}})
    exact = inclusion_probabilities(dist)
    assert exact["web"] == pytest.approx(0.3 + 0.504)
    assert exact["vision"] == 0.0
    assert expected_toolsets(dist) == pytest.approx(0.6 + 0.504)
    _assert_frequencies_match(dist)


def test_weighted_choice_frequencies_match_exact_probabilities() -> None:
    dist = _spec(
        {
            "combinations": [
                {"toolsets": ["terminal", "file"], "weight": 3},
                {"toolsets": ["web"], "weight": 1},
                {"toolsets": ["web", "browser", "vision"], "weight": 0.5},
            ]
        }
    )
    assert dist.mode == "weighted_choice"
    exact = inclusion_probabilities(dist)
    assert exact == pytest.approx(
        {"terminal": 3 / 4.5, "file": 3 / 4.5, "web": 1.5 / 4.5, "browser": 0.5 / 4.5,
         "vision": 0.5 / 4.5}
    )  # fmt: skip
    assert expected_toolsets(dist) == pytest.approx((6 + 1 + 1.5) / 4.5)
    _assert_frequencies_match(dist)
    samples = {tuple(sample_toolsets(dist, job_seed=1, prompt_id=str(i))) for i in range(500)}
    assert samples == {("file", "terminal"), ("web",), ("browser", "vision", "web")}


def test_weighted_choice_with_unavailable_toolsets_falls_back() -> None:
    dist = _spec(
        {
            "combinations": [
                {"toolsets": ["terminal", "file"], "weight": 2},
                {"toolsets": ["browser"], "weight": 1},
            ]
        }
    )
    available = {"file", "web"}
    # The browser combination loses everything; the fallback is the most likely available
    # toolset, file (2/3).
    assert inclusion_probabilities(dist, available) == pytest.approx(
        {"terminal": 0.0, "file": 1.0, "browser": 0.0}
    )
    assert expected_toolsets(dist, available) == pytest.approx(1.0)
    _assert_frequencies_match(dist, available)


def test_at_least_one_toolset_even_when_the_draw_is_empty() -> None:
    dist = _spec({"toolsets": {"web": 10, "terminal": 10, "file": 10}})
    samples = [sample_toolsets(dist, job_seed=11, prompt_id=str(i)) for i in range(N)]
    assert all(samples)
    # Ties go to the alphabetically first name: file.
    only_fallback = sum(s == ["file"] for s in samples) / N
    p = 0.9**3 + 0.1 * 0.9 * 0.9  # nothing drawn, or file alone
    assert abs(only_fallback - p) <= SIGMAS * math.sqrt(p * (1 - p) / N)
    assert Counter(len(s) for s in samples)[0] == 0


def test_unavailable_toolsets_are_dropped_and_fallback_is_highest_available() -> None:
    dist = _spec({"toolsets": {"browser": 90, "vision": 50, "terminal": 20, "file": 5}})
    available = {"terminal", "file", "web"}
    samples = [
        sample_toolsets(dist, job_seed=2, prompt_id=str(i), available=available) for i in range(N)
    ]
    assert all(samples) and all(set(s) <= {"terminal", "file"} for s in samples)
    assert inclusion_probabilities(dist, available) == pytest.approx(
        {"browser": 0.0, "vision": 0.0, "terminal": 0.2 + 0.8 * 0.95, "file": 0.05}
    )
    _assert_frequencies_match(dist, available)
    # The draw ignores availability: an available toolset drawn without restriction is
    # still there when others are unavailable.
    for i in range(300):
        free = sample_toolsets(dist, job_seed=2, prompt_id=str(i))
        limited = sample_toolsets(dist, job_seed=2, prompt_id=str(i), available=available)
        drawn_here = [t for t in free if t in available]
        assert limited == (drawn_here or ["terminal"])


def test_zero_probability_toolsets_are_never_the_fallback() -> None:
    dist = _spec({"toolsets": {"browser": 50, "web": 0}})
    assert sample_toolsets(dist, job_seed=0, prompt_id="x", available={"web"}) == []
    assert expected_toolsets(dist, {"web"}) == 0.0
    assert sample_toolsets(dist, job_seed=0, prompt_id="x", available=set()) == []


def test_builtin_expected_counts_match_empirical_means() -> None:
    for name in ("research", "safe", "browser_tasks"):
        _assert_frequencies_match(BUILTIN_DISTRIBUTIONS[name])


# --- validation -----------------------------------------------------------------------------


def test_unknown_distribution_name_lists_the_valid_names() -> None:
    with pytest.raises(DistributionError) as err:
        validate(load_distributions(), "reserch", BASE_TOOLSETS)
    message = str(err.value)
    assert "'reserch'" in message and "did you mean 'research'" in message
    assert all(name in message for name in BUILTIN_DISTRIBUTIONS)


def test_unknown_toolsets_are_named_with_the_valid_ones() -> None:
    catalog = load_distributions({"mine": {"toolsets": {"terminl": 50, "web": 10, "gpu": 5}}})
    with pytest.raises(DistributionError) as err:
        validate(catalog, "mine", BASE_TOOLSETS)
    message = str(err.value)
    assert "'gpu', 'terminl' (did you mean 'terminal'?)" in message
    assert "valid toolsets: browser, file, image_gen, terminal, vision, web" in message
    validate(catalog, "default", BASE_TOOLSETS)  # only the chosen distribution is checked


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"toolsets": {"web": 150}}, "probability of 'web' is 150; probabilities are percentages"),
        ({"toolsets": {"web": -1}}, "probability of 'web' is -1"),
        ({"toolsets": {"web": "80%"}}, "probability of 'web' must be a number of percent"),
        ({"toolsets": {"web": True}}, "probability of 'web' must be a number"),
        ({"toolsets": {"web": float("nan")}}, "probability of 'web' must be a number"),
        ({"toolsets": {}}, "'custom' is empty; give `toolsets"),
        ({"description": "nothing"}, "'custom' is empty"),
        ({"toolsets": {"web": 0, "file": 0}}, "every toolset has probability 0"),
        (
            {"combinations": [{"toolsets": ["web"], "weight": 0}]},
            "combination 1 (web) has weight 0",
        ),
        (
            {"combinations": [{"toolsets": ["web"]}, {"toolsets": ["file"], "weight": -2}]},
            "combination 2 (file) has weight -2; weights must be positive",
        ),
        ({"combinations": [{"toolsets": [], "weight": 1}]}, "combination 1 has an empty toolset"),
        ({"combinations": [{"toolsets": ["web", "web"]}]}, "combination 1 lists web more than"),
        ({"combinations": [{"toolsets": "web"}]}, "`toolsets` must be a list of toolset names"),
        ({"combinations": [{"toolset": ["web"]}]}, "unknown key 'toolset' (did you mean"),
        ({"combinations": {"toolsets": ["web"]}}, "`combinations` must be a list"),
        (
            {"toolsets": {"web": 50}, "combinations": [{"toolsets": ["web"]}]},
            "gives both `toolsets` and `combinations`",
        ),
        (
            {"toolset": {"web": 50}},
            "unknown key 'toolset' (did you mean 'toolsets'?); allowed keys: combinations, "
            "description, override, toolsets",
        ),
        ({"toolsets": ["web", "file"]}, "`toolsets` must map toolset names to percentages"),
        ({"toolsets": {"web": 5}, "override": "yes"}, "`override` must be true or false"),
        ({"toolsets": {"web": 5}, "description": 3}, "`description` must be a string"),
    ],
)
def test_malformed_distributions_say_what_to_fix(raw: dict[str, Any], expected: str) -> None:
    with pytest.raises(DistributionError) as err:
        load_distributions({"custom": raw})
    message = str(err.value)
    assert expected in message
    assert "the job's `distributions`" in message and "'custom'" in message


def test_a_distribution_that_is_not_a_mapping_is_rejected() -> None:
    with pytest.raises(DistributionError, match=r"'x' must be a mapping .* got list"):
        load_distributions({"x": [1, 2]})
    numeric_name: dict[Any, Any] = {5: {"toolsets": {"web": 5}}}  # as YAML gives `5:`
    with pytest.raises(DistributionError, match="names must be strings, got 5"):
        load_distributions(numeric_name)


def test_errors_are_config_errors_and_value_errors() -> None:
    from hermes.errors import ConfigError

    assert issubclass(DistributionError, ConfigError)
    assert issubclass(DistributionError, ValueError)


# --- custom distributions and files ---------------------------------------------------------


def test_custom_file_and_inline_distributions_load(tmp_path: Path) -> None:
    path = tmp_path / "dists.yaml"
    path.write_text(
        "my_dist:\n"
        "  description: Mostly shell\n"
        "  toolsets: {terminal: 80, file: 50}\n"
        "my_combo:\n"
        "  description: One kit\n"
        "  combinations:\n"
        "    - {toolsets: [terminal, file], weight: 3}\n"
        "    - {toolsets: [web], weight: 1}\n",
        encoding="utf-8",
    )
    catalog = load_distributions({"inline_one": {"toolsets": {"web": 100}}}, path)
    assert isinstance(catalog, DistributionCatalog)
    assert catalog.names()[: len(BUILTIN_DISTRIBUTIONS)] == tuple(BUILTIN_DISTRIBUTIONS)
    assert catalog.names()[len(BUILTIN_DISTRIBUTIONS) :] == ("inline_one", "my_combo", "my_dist")
    mine = catalog.get("my_dist")
    assert mine.mode == "independent" and mine.source == str(path)
    assert dict(mine.probabilities) == {"file": 50.0, "terminal": 80.0}
    combo = catalog.get("my_combo")
    assert combo.mode == "weighted_choice" and expected_toolsets(combo) == pytest.approx(1.75)
    for name in ("my_dist", "my_combo", "inline_one"):
        validate(catalog, name, BASE_TOOLSETS)
        dist = catalog.get(name)
        again = parse_distribution(name, dist.to_spec(), source="round trip")[0]
        assert again.fingerprint() == dist.fingerprint()
        assert again.probabilities == dist.probabilities
        assert again.combinations == dist.combinations


def test_shadowing_a_builtin_needs_override() -> None:
    with pytest.raises(DistributionError) as err:
        load_distributions({"research": {"toolsets": {"web": 100}}})
    assert "'research' has the name of a built-in" in str(err.value)
    assert "set `override: true`" in str(err.value)
    catalog = load_distributions({"research": {"toolsets": {"web": 100}, "override": True}})
    assert dict(catalog.get("research").probabilities) == {"web": 100.0}
    assert catalog.names().index("research") == 2  # keeps the built-in's place
    assert BUILTIN_DISTRIBUTIONS["research"].toolsets == ("browser", "terminal", "vision", "web")
    with pytest.raises(DistributionError, match="override: true` but there is no built-in"):
        load_distributions({"reserch": {"toolsets": {"web": 100}, "override": True}})


def test_the_same_name_in_file_and_job_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "d.yaml"
    path.write_text("mine:\n  toolsets: {web: 10}\n", encoding="utf-8")
    with pytest.raises(DistributionError, match=r"'mine' is defined both in .*d\.yaml and in"):
        load_distributions({"mine": {"toolsets": {"web": 20}}}, path)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "cannot read distributions file"),
        ("mine: {toolsets: [unclosed\n", "is not valid YAML"),
        ("- web\n- file\n", "must be a non-empty mapping of distribution names"),
        ("", "an empty file"),
        ("a: {toolsets: {web: 1}}\na: {toolsets: {web: 2}}\n", "duplicate key 'a'"),
    ],
)
def test_file_errors_name_the_file(tmp_path: Path, content: str | None, expected: str) -> None:
    path = tmp_path / "dists.yaml"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(DistributionError) as err:
        load_distributions(None, path)
    assert expected in str(err.value) and str(path) in str(err.value)


def test_errors_inside_a_file_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "dists.yaml"
    path.write_text("mine:\n  toolsets: {web: 120}\n", encoding="utf-8")
    with pytest.raises(DistributionError) as err:
        load_distributions(None, path)
    assert str(err.value).startswith(f"{path}: distribution 'mine'")


# --- listing --------------------------------------------------------------------------------


def test_listing_shows_every_distribution_with_expected_counts() -> None:
    catalog = load_distributions(
        {"kits": {"description": "Kits", "combinations": [{"toolsets": ["web"], "weight": 2}]}}
    )
    text = format_distributions(catalog)
    text.encode("ascii")  # plain text, no emoji
    for dist in catalog:
        assert f"{dist.name}  [{dist.mode}" in text
        assert dist.description in text
    assert "expected toolsets per prompt: 6.00" in text  # default
    assert "expected toolsets per prompt: 2.21" in text  # research: 2.2135
    assert "100%  web  (weight 2)" in text
    assert "unavailable here" not in text


def test_listing_marks_unavailable_toolsets() -> None:
    catalog = DistributionCatalog()
    text = format_distributions(catalog, available={"web", "terminal", "file"})
    block = text.split("\n\n")[0]
    assert "browser       100%  (unavailable here)" in block
    assert "    web           100%\n" in block
    assert "expected with the toolsets available here: 3.00" in block


def test_json_listing_is_loadable_and_exact() -> None:
    rows = json.loads(distributions_as_json(load_distributions(), available={"web"}))
    assert [row["name"] for row in rows] == list(BUILTIN_DISTRIBUTIONS)
    research = rows[2]
    assert research["mode"] == "independent" and research["toolsets"]["web"] == 90
    assert research["inclusion_probabilities"] == {
        "browser": 0.0,
        "terminal": 0.0,
        "vision": 0.0,
        "web": 1.0,
    }
    assert research["expected_toolsets"] == 1.0
