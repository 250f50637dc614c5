"""Griffe extension for the API reference: the docstrings' cross-references, written as TRL writes them.

The package's docstrings use the doc-builder style of TRL and transformers: ``[`GRPOTrainer`]`` or
``[`~trl.GRPOTrainer`]`` (``~``: show the last name only). mkdocstrings does not read that style, so the site showed
them as bracketed text. This extension rewrites each into what mkdocs-autorefs resolves:

- a name of this package (written in full, ``trl_ada.rewards.sandbox.Sandbox``, as the docstring's module sees it,
  ``Sandbox``, or the name of exactly one object of the package) becomes a link to its entry in the reference, ``[`Sandbox`][trl_ada.rewards.sandbox.Sandbox]``;
  one the reference does not render fails the strict build ("Could not find cross-reference target");
- a name of another library (``trl.GRPOTrainer``, ``transformers.Trainer``) becomes code: the site is built
  offline, with no other project's inventory to link to;
- a name that resolves nowhere raises, naming the docstring: a typo must not reach the site as text.

A Google-style item whose type holds a reference (``name ([`~trl_ada.samplers.PassRateEstimator`], *optional*):``)
gets that type as the opening of its description (``name: ([`PassRateEstimator`][...], *optional*) ...``), where it
renders as a link: mkdocstrings shows an item's type as code, in which a reference is left as its Markdown text. The
item's type column then shows the signature's annotation, which mkdocstrings links itself.
"""

from __future__ import annotations

import re

from griffe import Extension, Module, NameResolutionError, Object

PACKAGE = "trl_ada"
# [`name`] or [`~name`], not already a Markdown link ([`x`](url)) or an autorefs reference ([`x`][id]).
REFERENCE = re.compile(r"\[`(~?)([A-Za-z_][\w.]*)`\](?![(\[])")
# A Google-style item whose type holds a reference: `name ([`Type`], *optional*): description`.
TYPED_ITEM = re.compile(r"^( *)(\*{0,2}\w+) \(([^()\n]*\[`~?[\w.]+`\][^()\n]*)\):(.*)$", re.MULTILINE)


def canonical(package: Module, path: str) -> str | None:
    """The path under which the reference renders ``path`` (re-exports followed), or ``None`` if no such member."""
    parts = path.split(".")
    if parts[0] != package.name:
        return None
    try:
        member = package[".".join(parts[1:])] if len(parts) > 1 else package
    except KeyError:
        return None
    try:
        return member.canonical_path
    except Exception:  # an alias whose target griffe did not load (e.g. an external object re-exported)
        return None


def rewrite(obj: Object, package: Module, by_name: dict[str, set[str]]) -> None:
    if obj.docstring is None:
        return

    def replace(match: re.Match[str]) -> str:
        short, name = match.group(1) == "~", match.group(2)
        shown = name.rsplit(".", 1)[-1] if short else name
        target = name
        if name.split(".")[0] != package.name:
            try:
                target = obj.resolve(name) if "." not in name else name
            except NameResolutionError:  # e.g. imported inside a function: the package's one object of that name
                found = by_name.get(name, set())
                target = next(iter(found)) if len(found) == 1 else name
        if target.split(".")[0] == package.name:
            path = canonical(package, target)
            if path is None:
                raise ValueError(f"{obj.path}'s docstring refers to [`{name}`], which is not in {package.name}.")
            return f"[`{shown}`][{path}]"
        if "." in target:
            return f"`{shown}`"  # another library's object: no inventory to link to offline
        raise ValueError(f"{obj.path}'s docstring refers to [`{name}`], which resolves to nothing.")

    value = TYPED_ITEM.sub(r"\1\2: (\3)\4", obj.docstring.value)
    obj.docstring.value = REFERENCE.sub(replace, value)


class CrossReferences(Extension):
    """Rewrites doc-builder cross-references once the whole package is loaded (so re-exports resolve).

    Args:
        package: The package whose docstrings are rewritten and whose objects are linked.
    """

    def __init__(self, package: str = PACKAGE) -> None:
        super().__init__()
        self.package = package

    def on_package(self, *, pkg: Module, **kwargs: object) -> None:
        if pkg.name != self.package:
            return

        def objects(obj: Object):
            yield obj
            for member in obj.members.values():
                if not member.is_alias and member.parent is obj:
                    yield from objects(member)

        by_name: dict[str, set[str]] = {}
        for obj in objects(pkg):
            by_name.setdefault(obj.name, set()).add(obj.path)
        for obj in list(objects(pkg)):
            rewrite(obj, pkg, by_name)
