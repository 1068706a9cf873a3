"""Discovery: AST-based module selection, folder tools, failures reported and skipped."""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

import pytest

from tools.discovery import discover_tools, module_registers_tools
from tools.registry import ToolRegistry, registry


def _write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


TOOL_MODULE = """
    from tools.registry import registry, tool_result

    def _handler(args, **kwargs):
        return tool_result(ok=True, tool="{name}")

    registry.register(
        name="{name}",
        toolset="{toolset}",
        schema={{"name": "{name}", "description": "d", "parameters": {{"type": "object"}}}},
        handler=_handler,
    )
"""


@pytest.fixture
def unique() -> str:
    return "t" + uuid.uuid4().hex[:8]


@pytest.fixture
def cleanup() -> list[str]:
    names: list[str] = []
    yield names
    for name in names:
        registry.deregister(name)


def test_ast_check_only_accepts_top_level_register_calls(tmp_path: Path) -> None:
    top = _write(
        tmp_path / "a.py", "from tools.registry import registry\nregistry.register(name='x')\n"
    )
    nested = _write(tmp_path / "b.py", "def f():\n    registry.register(name='x')\n")
    other = _write(tmp_path / "c.py", "other.register(name='x')\nregistry.lookup('x')\n")
    toolsets = _write(tmp_path / "d.py", "registry.register_toolset('s')\n")
    assert module_registers_tools(top)
    assert not module_registers_tools(nested)
    assert not module_registers_tools(other)
    assert module_registers_tools(toolsets)


def test_discovery_imports_tool_modules_and_reports_failures(
    tmp_path: Path, unique: str, cleanup: list[str]
) -> None:
    cleanup += [f"{unique}_good", f"{unique}_folder"]
    _write(tmp_path / "good.py", TOOL_MODULE.format(name=f"{unique}_good", toolset=unique))
    # A helper module with side effects must never be imported.
    _write(tmp_path / "helper.py", "raise SystemExit('helper imported')\n")
    _write(
        tmp_path / "broken.py",
        "from tools.registry import registry\nimport no_such_dependency_xyz\nregistry.register()\n",
    )
    _write(tmp_path / "syntax.py", "from tools.registry import registry\nregistry.register(\n")
    folder = tmp_path / "folder_tool"
    (folder).mkdir()
    (folder / "schema.json").write_text(
        json.dumps(
            {
                "name": f"{unique}_folder",
                "description": "a folder tool",
                "toolset": unique,
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                "max_result_size_chars": 5000,
            }
        )
    )
    _write(
        folder / "handler.py",
        """
        from tools.registry import tool_result

        def handler(args, **kwargs):
            return tool_result(q=args.get("q"), task=kwargs.get("task_id"))
        """,
    )
    bad_folder = tmp_path / "bad_folder"
    bad_folder.mkdir()
    (bad_folder / "schema.json").write_text("{not json")
    _write(bad_folder / "handler.py", "def handler(args, **kw):\n    return '{}'\n")
    no_handler = tmp_path / "no_handler"
    no_handler.mkdir()
    (no_handler / "schema.json").write_text(json.dumps({"name": f"{unique}_nohandler"}))
    _write(no_handler / "handler.py", "X = 1\n")

    report = discover_tools(tmp_path)

    assert sorted(m.rsplit(".", 1)[-1] for m in report.imported) == ["good", "handler"]
    failed = {k.split(".", 1)[1]: v for k, v in report.failed.items()}
    assert "ModuleNotFoundError: No module named 'no_such_dependency_xyz'" in failed["broken"]
    assert "SyntaxError" in failed["syntax"]
    assert "is not valid JSON" in failed["bad_folder.handler"]
    assert "defines no 'handler' function" in failed["no_handler.handler"]
    assert json.loads(registry.dispatch(f"{unique}_good", {})) == {
        "ok": True,
        "tool": f"{unique}_good",
    }
    entry = registry.get_entry(f"{unique}_folder")
    assert entry is not None and entry.toolset == unique and entry.max_result_size_chars == 5000
    assert json.loads(registry.dispatch(f"{unique}_folder", {"q": "hi"}, task_id="t1")) == {
        "q": "hi",
        "task": "t1",
    }
    assert registry.resolve_toolset(unique) == [f"{unique}_folder", f"{unique}_good"]

    # A second pass is idempotent: nothing is registered twice, nothing new fails.
    generation = registry.generation
    again = discover_tools(tmp_path)
    assert sorted(again.imported) == sorted(report.imported)
    assert registry.generation == generation


def test_folder_tool_can_target_another_registry(tmp_path: Path, unique: str) -> None:
    folder = tmp_path / "solo"
    folder.mkdir()
    (folder / "schema.json").write_text(json.dumps({"name": unique, "strict": True}))
    _write(folder / "handler.py", "def handler(args, **kw):\n    return '{\"v\": 1}'\n")
    (folder / "extra.json").write_text("{}")
    target = ToolRegistry()
    report = discover_tools(tmp_path, target=target)
    assert report.failed == {}
    assert target.get_entry(unique) is not None and registry.get_entry(unique) is None
    assert target.get_toolset(unique).tools == (unique,)


def test_unknown_folder_schema_keys_are_rejected(tmp_path: Path, unique: str) -> None:
    folder = tmp_path / "typo"
    folder.mkdir()
    (folder / "schema.json").write_text(json.dumps({"name": unique, "toolsett": "x"}))
    _write(folder / "handler.py", "def handler(args, **kw):\n    return '{}'\n")
    report = discover_tools(tmp_path, target=ToolRegistry())
    (error,) = report.failed.values()
    assert "unknown key(s) toolsett" in error


def test_builtin_tools_all_import_cleanly() -> None:
    report = discover_tools()
    assert report.failed == {}
    expected = {
        "terminal",
        "read_file",
        "write_file",
        "patch",
        "search_files",
        "execute_code",
        "todo",
        "web_search",
        "web_extract",
        "mixture_of_agents",
        "vision_analyze",
        "image_generate",
        "browser_navigate",
    }
    assert expected <= set(registry.tool_names())
    assert registry.validate_toolsets() == []
