"""Toolset definitions: descriptions of the base toolsets and the composite ones.

Tools join their toolset by registering with ``toolset=...``; this module adds the
descriptions and the composites built with ``includes``. It registers no tools, so the
registry stays ignorant of which tools exist and discovery imports it like any other
registering module.
"""

from __future__ import annotations

from tools.registry import registry

registry.register_toolset(
    "terminal", "Run shell commands in the episode's working directory", tools=["terminal"]
)
registry.register_toolset(
    "file",
    "Read, write, patch and search files in the episode's working directory",
    tools=["read_file", "write_file", "patch", "search_files"],
)
registry.register_toolset(
    "code_execution", "Run Python code in a subprocess", tools=["execute_code"]
)
registry.register_toolset("todo", "Keep a task list for the episode", tools=["todo"])
registry.register_toolset(
    "web", "Web search and page extraction", tools=["web_search", "web_extract"]
)
registry.register_toolset(
    "moa", "Mixture of agents: ask several models and aggregate", tools=["mixture_of_agents"]
)
registry.register_toolset("vision", "Analyse images with a vision model", tools=["vision_analyze"])
registry.register_toolset("image_gen", "Generate images", tools=["image_generate"])
registry.register_toolset(
    "browser",
    "Drive a real browser over the Chrome DevTools protocol",
    tools=[
        "browser_navigate",
        "browser_snapshot",
        "browser_click",
        "browser_type",
        "browser_scroll",
        "browser_back",
        "browser_press",
        "web_search",
    ],
)
registry.register_toolset(
    "safe", "Everything without shell or file access", includes=["web", "vision", "image_gen"]
)
registry.register_toolset(
    "coding",
    "Shell, files, Python and a task list: the offline software-engineering kit",
    includes=["terminal", "file", "code_execution", "todo"],
)
registry.register_toolset("research", "Web research with several models", includes=["web", "moa"])
registry.register_toolset(
    "all", "Every built-in toolset", includes=["coding", "safe", "moa", "browser"]
)
