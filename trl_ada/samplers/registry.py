"""
The sampler registry: `@register_sampler("name")` makes a sampler selectable by name everywhere. A leaf module (it
imports no other sampler module), so `settings` and `base` can look samplers up. Pure Python.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

SamplerClass = TypeVar("SamplerClass", bound=type)

SAMPLERS: dict[str, type] = {}
"""Every registered sampler class by name, in registration order (the core ones first); an installed plug-in joins it
when first named ([`sampler_class`]) or when [`load_plugins`] imports them all."""

_IMPORTED: dict[str, type] = {}
"""Registered classes selected by an import path, by that path."""


def register_sampler(name: str):
    """Class decorator: register a [`Sampler`] subclass under `name` (sets its `name`), selectable as `sampler=name` in
    `AdaGRPOConfig`, on the command line and in `trl-ada simulate`. Registering another class under a taken name
    raises; re-registering the same class replaces it (see `_same_definition`)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a sampler name must be a Python identifier (it is a config value), got {name!r}")

    def register(cls: SamplerClass) -> SamplerClass:
        if not _is_sampler_class(cls):
            raise TypeError(
                f"@register_sampler({name!r}) decorates a subclass of trl_ada.samplers.Sampler, got {cls!r}"
            )
        taken = SAMPLERS.get(name)
        if taken is not None and not _same_definition(taken, cls):
            raise ValueError(
                f"sampler name {name!r} is already registered by {_where(taken)}; {_where(cls)} cannot take it. "
                f"Register it under another name, e.g. @register_sampler({name + '_2'!r})."
            )
        cls.name = name
        SAMPLERS[name] = cls
        return cls

    return register


def _is_sampler_class(cls: Any) -> bool:
    """Whether `cls` subclasses `trl_ada.samplers.Sampler`, told by its bases' names (this module imports no other)."""
    return isinstance(cls, type) and any(
        klass.__module__ == "trl_ada.samplers.base" and klass.__qualname__ == "Sampler" for klass in cls.__mro__
    )


def _same_definition(registered: type, candidate: type) -> bool:
    """Whether `candidate` is `registered` defined again: the same qualified name, in the same module or source file.
    Not identity, since a reload, a notebook cell run twice or a script also imported by its path makes a new class
    object for the same code; not the name alone, or another module's `EstSampler` would silently replace the built-in
    one."""
    if registered is candidate:
        return True
    if registered.__qualname__ != candidate.__qualname__:
        return False
    if registered.__module__ == candidate.__module__:
        return True
    source = _source_file(registered)
    return source is not None and source == _source_file(candidate)


def _source_file(cls: type) -> str | None:
    """The file that defines `cls`'s module (its module is in `sys.modules` while it runs), or `None`."""
    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    return os.path.realpath(path) if path else None


def _where(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


CUSTOM_SAMPLER_DOCS = "docs/custom-sampler.md ('Write your own sampler')"
"""Where the error for an unknown sampler sends the user."""

ENTRY_POINT_GROUP = "trl_ada.samplers"
"""Installed packages can ship samplers: an entry point in this group names a module (or class) to import."""


def sampler_class(name: str) -> type:
    """The class registered under `name`. A name not registered yet is looked up among the entry points of group
    `trl_ada.samplers`, then as an import path (`"my_package.samplers:KnapsackSampler"`, from the working directory if
    not installed), so a plug-in is selectable in a fresh process. `ValueError` naming the registered ones
    otherwise."""
    if isinstance(name, str) and name not in SAMPLERS and name not in _IMPORTED:
        _load_plugin(name)
    try:
        return SAMPLERS[name] if name in SAMPLERS else _IMPORTED[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"sampler={name!r} is not supported. Choose one of {sampler_names()}. A sampler of your own "
            "(@trl_ada.samplers.register_sampler) is known only in a process that imported its module: import it "
            "before building the config, or pass its import path 'module:Class' (e.g. 'my_samplers:MySampler'), "
            f"which imports it in any process (the command line, a worker). See {CUSTOM_SAMPLER_DOCS}."
        ) from None


def _load_plugin(name: str) -> None:
    for entry_point in _entry_points():
        if entry_point.name == name:
            entry_point.load()  # importing the plug-in runs its @register_sampler
            return
    module_name, _, attribute = name.replace(":", ".").rpartition(".")
    if not module_name:
        return
    try:
        cls = getattr(_import_module_or_from_working_directory(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(
            f"sampler={name!r} is neither a registered sampler ({sampler_names()}) nor an importable class "
            f"({type(error).__name__}: {error}), from the installed packages or the working directory "
            f"{os.getcwd()}. Fix the import path, or register the sampler first."
        ) from None
    registered = getattr(cls, "name", None)
    if SAMPLERS.get(registered) is not cls:
        raise ValueError(
            f"sampler={name!r} imports {cls!r}, which is not registered. Decorate it with "
            "@trl_ada.samplers.register_sampler('some_name')."
        )
    _IMPORTED[name] = cls  # the path the user gave selects it from now on (the class keeps its registered name)


def _import_module_or_from_working_directory(module_name: str) -> Any:
    """Import `module_name`, from the working directory if its top-level package is not found, as `trl grpo` imports
    `--reward_funcs` (a console script does not have the working directory on `sys.path`; `python -m` does). The
    working directory stays on `sys.path` only when the module was found there (a spawned worker inherits it)."""
    from importlib import import_module

    try:
        return import_module(module_name)
    except ModuleNotFoundError as error:
        cwd = os.getcwd()
        if error.name != module_name.partition(".")[0] or cwd in sys.path:
            raise
        sys.path.insert(0, cwd)
        try:
            return import_module(module_name)
        except ImportError:
            sys.path.remove(cwd)
            raise


def sampler_names() -> list[str]:
    """Every selectable sampler name: the registered ones (the core first), then the plug-ins installed under the entry
    point group `trl_ada.samplers` that no one has imported yet (trl-ada's own experimental ones among them)."""
    names = list(SAMPLERS)
    for entry_point in _entry_points():
        if entry_point.name not in names:
            names.append(entry_point.name)
    return names


def load_plugins() -> dict[str, type]:
    """Import every installed plug-in sampler (entry point group `trl_ada.samplers`) and return [`SAMPLERS`]: for the
    listings that read every sampler's class (which samplers read a knob). A plug-in that fails to import is left out
    of the listing with a warning; naming it (`sampler_class`) raises its error."""
    for name in sampler_names():
        if name not in SAMPLERS:
            try:
                sampler_class(name)
            except Exception as error:  # a listing must not fail for one broken package
                logger.warning("The sampler plug-in %r could not be imported and is left out: %s", name, error)
    return SAMPLERS


def _entry_points() -> list[Any]:
    from importlib.metadata import entry_points

    return list(entry_points(group=ENTRY_POINT_GROUP))
