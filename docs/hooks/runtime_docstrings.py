"""Griffe extension for the API reference: the configs' docstrings in TRL's layout, as Markdown.

`AdaGRPOConfig` and `AdaAsyncGRPOConfig` document their knobs as TRL's configs do (a `Parameters:` block of
`name (`type`, *optional*, defaults to ...):` entries and `> group` lines), which Google-style parsing does not read.
This extension imports the two classes and gives griffe their docstring with that list written as Markdown.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re

from griffe import Docstring, Extension

RUNTIME_DOCSTRINGS = {
    "trl_ada.config.AdaGRPOConfig": ("trl_ada.config", "AdaGRPOConfig"),
    "trl_ada.async_grpo.async_grpo_config.AdaAsyncGRPOConfig": (
        "trl_ada.async_grpo.async_grpo_config",
        "AdaAsyncGRPOConfig",
    ),
}
ENTRY = re.compile(r"^(\w+) \((.*)\):\s*$")


def as_markdown(docstring: str) -> str:
    """TRL's docstring layout (a `Parameters:` block of `name (type):` entries and `> group` lines) as Markdown."""
    text = inspect.cleandoc(docstring)
    head, found, parameters = text.partition("\nParameters:\n")
    if not found:
        return text
    out = [head.rstrip(), "", "**Parameters**", ""]
    for line in inspect.cleandoc(parameters).splitlines():
        entry = ENTRY.match(line)
        if line.startswith("> "):
            out += ["", f"*{line[2:].strip()}*", ""]
        elif entry:
            out.append(f"- **`{entry[1]}`** ({entry[2]}):")
        elif line.strip():
            out.append("  " + line.strip())
    return "\n".join(out) + "\n"


class RuntimeDocstrings(Extension):
    def on_class_members(self, *, cls, **kwargs) -> None:
        target = RUNTIME_DOCSTRINGS.get(cls.path)
        if target is None:
            return
        module, name = target
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # AdaAsyncGRPOConfig imports trl.experimental
        runtime = getattr(importlib.import_module(module), name).__doc__
        cls.docstring = Docstring(as_markdown(runtime), parent=cls)
