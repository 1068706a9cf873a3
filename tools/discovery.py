"""Find and import self-registering tool modules.

Two forms are discovered in a tools directory:
- ``<dir>/<module>.py`` with a top-level ``registry.register(...)`` (or
  ``registry.register_toolset(...)``) statement: found by parsing with ``ast``, so helper
  modules are never imported;
- ``<dir>/<name>/schema.json`` + ``<dir>/<name>/handler.py``: the folder form, registered
  here from the schema file and the handler module's ``handler`` function.

A module that fails to import is reported with its error and skipped; the rest still load.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import json
import logging
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from tools.registry import ToolRegistry, registry

logger = logging.getLogger(__name__)

BUILTIN_TOOLS_DIR = Path(__file__).resolve().parent
_SKIP_FILES = frozenset({"__init__.py", "registry.py"})
_REGISTER_CALLS = frozenset({"register", "register_toolset", "register_toolset_alias"})
_FOLDER_KEYS = frozenset(
    {
        "name",
        "description",
        "parameters",
        "toolset",
        "requires_env",
        "max_result_size_chars",
        "emoji",
        "strict",
    }
)


@dataclass
class DiscoveryReport:
    """What a discovery pass imported and what it had to skip, with the reason."""

    imported: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def _is_registry_call(node: ast.stmt) -> bool:
    if not isinstance(node, ast.Expr) or not isinstance(node.value, ast.Call):
        return False
    func = node.value.func
    return (
        isinstance(func, ast.Attribute)
        and func.attr in _REGISTER_CALLS
        and isinstance(func.value, ast.Name)
        and func.value.id == "registry"
    )


def module_registers_tools(path: Path) -> bool:
    """True when ``path`` has a top-level ``registry.register(...)``-style statement."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        # Worth importing anyway: the import error is then reported with its traceback.
        logger.debug("cannot parse %s: %s", path, exc)
        return "registry.register" in path.read_text(encoding="utf-8", errors="replace")
    return any(_is_registry_call(stmt) for stmt in tree.body)


def _module_name(tools_dir: Path, stem: str) -> str:
    if tools_dir == BUILTIN_TOOLS_DIR:
        return f"tools.{stem}"
    digest = hashlib.sha256(str(tools_dir).encode()).hexdigest()[:10]
    return f"_hermes_tools_{digest}.{stem}"


def _import_file(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    if name.startswith("tools."):
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _describe_failure(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" ({Path(last[0].filename).name}:{last[0].lineno})" if last else ""
    return f"{type(exc).__name__}: {exc}{where}"


def discover_tools(
    tools_dir: Path | str | None = None, *, target: ToolRegistry | None = None
) -> DiscoveryReport:
    """Import every tool module and folder tool under ``tools_dir`` (built-ins by default)."""
    root = Path(tools_dir).resolve() if tools_dir is not None else BUILTIN_TOOLS_DIR
    target = target or registry
    report = DiscoveryReport()
    for path in sorted(root.glob("*.py")):
        if path.name in _SKIP_FILES or not module_registers_tools(path):
            continue
        name = _module_name(root, path.stem)
        try:
            _import_file(name, path)
        except Exception as exc:
            report.failed[name] = _describe_failure(exc)
            logger.warning("could not import tool module %s: %s", name, report.failed[name])
        else:
            report.imported.append(name)
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if not (folder / "schema.json").is_file() or not (folder / "handler.py").is_file():
            continue
        name = _module_name(root, folder.name) + ".handler"
        try:
            _register_folder_tool(folder, name, target)
        except Exception as exc:
            report.failed[name] = _describe_failure(exc)
            logger.warning("could not load folder tool %s: %s", folder, report.failed[name])
        else:
            report.imported.append(name)
    return report


def discover_builtin_tools(tools_dir: Path | str | None = None) -> list[str]:
    """The seed's entry point: import tool modules and return the names imported."""
    return discover_tools(tools_dir).imported


def _register_folder_tool(folder: Path, module_name: str, target: ToolRegistry) -> None:
    try:
        spec: dict[str, Any] = json.loads((folder / "schema.json").read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{folder / 'schema.json'} is not valid JSON: {exc}") from exc
    if not isinstance(spec, dict):
        raise ValueError(f"{folder / 'schema.json'} must hold a JSON object")
    unknown = sorted(set(spec) - _FOLDER_KEYS)
    if unknown:
        raise ValueError(
            f"{folder / 'schema.json'}: unknown key(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(_FOLDER_KEYS))}"
        )
    name = str(spec.get("name", folder.name))
    existing = target.get_entry(name)
    if existing is not None and existing.module == module_name:
        return  # already loaded by an earlier discovery pass
    module = _import_file(module_name, folder / "handler.py")
    handler = getattr(module, "handler", None) or getattr(module, "handle", None)
    if handler is None:
        raise AttributeError(f"{folder / 'handler.py'} defines no 'handler' function")
    schema: dict[str, Any] = {k: spec[k] for k in ("description", "parameters") if k in spec}
    schema["name"] = name
    target.register(
        name=name,
        toolset=str(spec.get("toolset", name)),
        schema=schema,
        handler=handler,
        check_fn=getattr(module, "check_fn", None),
        requires_env=spec.get("requires_env"),
        emoji=spec.get("emoji", ""),
        max_result_size_chars=spec.get("max_result_size_chars"),
        dynamic_schema_overrides=getattr(module, "dynamic_schema_overrides", None),
    )
