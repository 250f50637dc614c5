"""The package's layout (issue 34): the import paths users already type still work, as thin re-exports of the same
objects; the `trl-ada` entry points answer; the top level of `trl_ada/` stays small; and `trl_ada` has no import
circle (the graph is read from the source with `ast`, imports inside functions included)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from collections.abc import Iterable
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "trl_ada"

# ---------------------------------------------------------------------------------------------------------------------
# Old public paths
# ---------------------------------------------------------------------------------------------------------------------

# The public names each moved module had (its __all__ and the other public names of its top level), by their new home.
OLD_NAMES = {
    "trl_ada.rewards": {  # was one module, now the package
        "trl_ada.rewards.text": ["RewardFunc", "accept_text_completions", "as_messages", "completion_text"],
        "trl_ada.rewards.math": [
            "answer_span",
            "last_boxed",
            "math_verify_reward",
            "normalize_reference",
            "reference_as_completion",
            "reference_verifies",
        ],
        "trl_ada.rewards.reward_registry": [
            "REWARD_FUNCS",
            "failing_reward_name",
            "get_reward_funcs",
            "required_reward_columns",
            "resolve_reward_funcs",
            "score_completions",
        ],
        "trl_ada.rewards.code": ["CodeExecutionReward", "code_execution_reward"],
        "trl_ada.tasks.arithmetic": ["exact_match_reward"],
    },
}


@pytest.mark.parametrize("old", sorted(OLD_NAMES))
def test_every_old_public_name_is_the_same_object_at_its_new_home(old):
    module = importlib.import_module(old)
    for new, names in OLD_NAMES[old].items():
        home = importlib.import_module(new)
        for name in names:
            assert getattr(module, name) is getattr(home, name), f"{old}.{name} is not {new}.{name}"


def test_the_reward_package_declares_what_it_re_exports():
    from trl_ada import rewards
    from trl_ada.rewards import reward_registry

    assert set(rewards.__all__) <= set(dir(rewards))
    assert "get_reward_funcs" in rewards.__all__ and reward_registry.get_reward_funcs is rewards.get_reward_funcs


def test_no_module_is_a_shim_or_shares_a_name_with_another():
    """Each module is where its code lives: none only re-exports another (a "Moved:" shim), and no two modules of
    the package (`__init__.py` and `__main__.py` aside) share a file name, so a name says which one is meant."""
    modules = sorted(PACKAGE.rglob("*.py"))
    docstrings = {path: ast.get_docstring(ast.parse(path.read_text())) or "" for path in modules}
    assert [str(path.relative_to(ROOT)) for path, text in docstrings.items() if text.startswith("Moved")] == []
    names = [path.name for path in modules if path.name not in ("__init__.py", "__main__.py")]
    assert sorted({name for name in names if names.count(name) > 1}) == []


def test_dotted_reward_paths_users_type_still_resolve():
    from trl_ada.rewards.code import code_execution_reward
    from trl_ada.rewards.math import math_verify_reward
    from trl_ada.rewards.reward_registry import get_reward_funcs, resolve_reward_funcs
    from trl_ada.tasks.arithmetic import exact_match_reward

    paths = [
        "trl_ada.rewards.math_verify_reward",
        "trl_ada.rewards.exact_match_reward",
        "trl_ada.rewards.math.math_verify_reward",
        "trl_ada.rewards.code.code_execution_reward",
        "trl_ada.tasks.arithmetic.exact_match_reward",
    ]
    expected = [math_verify_reward, exact_match_reward, math_verify_reward, code_execution_reward, exact_match_reward]
    assert get_reward_funcs(paths) == expected
    named = [math_verify_reward, exact_match_reward, code_execution_reward]
    assert get_reward_funcs(["math_verify", "exact_match", "code_execution"]) == named
    assert resolve_reward_funcs(["trl_ada.rewards.math_verify_reward"]) == [math_verify_reward]


def test_the_reward_package_and_the_sandbox_stay_import_light():
    code = (
        "import sys, trl_ada.rewards, trl_ada.rewards.sandbox, trl_ada.rewards.code\n"
        "print(sorted({'torch', 'trl'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr


# ---------------------------------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------------------------------


def test_the_console_script_is_trl_ada_cli_main_and_answers_help(capsys):
    import trl_ada.cli

    assert '"trl-ada=trl_ada.cli:main"' in (ROOT / "setup.py").read_text()
    (entry,) = entry_points(group="console_scripts", name="trl-ada")
    assert entry.value == "trl_ada.cli:main"
    main = entry.load()
    assert main is trl_ada.cli.main
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: trl-ada") and all(command in out for command in ("simulate", "train", "evaluate"))


def test_python_dash_m_trl_ada_cli_is_the_command():
    result = subprocess.run(
        [sys.executable, "-m", "trl_ada.cli", "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: trl-ada")


def test_python_dash_m_trl_ada_cli_train_runs_the_job():
    # Running it imports torch and TRL (tests/test_docs.py and tests/test_install.py launch it); here: what it calls.
    guard = ast.parse((PACKAGE / "cli" / "train.py").read_text()).body[-1]
    assert ast.unparse(guard) == "if __name__ == '__main__':\n    sys.exit(cli_main())"


@pytest.mark.parametrize(
    ("script", "module", "function"),
    [
        ("train_ada.py", "trl_ada.cli.train", "cli_main"),
        ("prepare_data.py", "trl_ada.cli.prepare_data", "main"),
        ("evaluate.py", "trl_ada.cli.evaluate", "main"),
    ],
)
def test_the_scripts_run_the_cli_modules(script, module, function):
    spec = importlib.util.spec_from_file_location(f"_layout_script_{script[:-3]}", ROOT / "scripts" / script)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    assert getattr(loaded, function) is getattr(importlib.import_module(module), function)


# ---------------------------------------------------------------------------------------------------------------------
# The top level
# ---------------------------------------------------------------------------------------------------------------------

MAX_TOP_LEVEL_MODULES = 10
"""Modules beside `trl_ada/__init__.py` (issue 34 counted 20 before the regrouping)."""


def test_the_top_level_holds_at_most_ten_modules():
    modules = sorted(path.name for path in PACKAGE.glob("*.py") if path.name != "__init__.py")
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, f"{len(modules)} modules at trl_ada/'s top level: {modules}"


# ---------------------------------------------------------------------------------------------------------------------
# The import graph
# ---------------------------------------------------------------------------------------------------------------------


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Every module under `root` (the directory of the package named `package`), by its dotted name."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join([package, *parts])] = path
    return modules


def import_graph(root: Path = PACKAGE, package: str = "trl_ada", type_checking: bool = True) -> dict[str, set[str]]:
    """Module -> the modules of the same tree it imports, from every import statement anywhere in its source (module
    level, inside functions, and under `if TYPE_CHECKING:` unless `type_checking=False`). `from pkg import name` is an
    edge to the submodule `pkg.name` when there is one, else to `pkg`; `import a.b.c` to the longest of `a.b.c`,
    `a.b`, `a` in the tree."""
    modules = module_files(root, package)
    graph: dict[str, set[str]] = {name: set() for name in modules}

    def in_tree(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    for name, path in modules.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]  # the package `.` names
        tree = ast.parse(path.read_text(), str(path))
        never_run = set() if type_checking else _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in never_run:
                continue
            if isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
                imported = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
                ]
            else:
                continue
            for target in imported:
                if target == package or target.startswith(package + "."):
                    module = in_tree(target)
                    if module and module != name:
                        graph[name].add(module)
    return graph


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """The ids of every node under an `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`) block of `tree`."""
    nodes = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            nodes.update(id(child) for statement in node.body for child in ast.walk(statement))
    return nodes


def strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's cycles, grouped: each component of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return components


def a_cycle(graph: dict[str, set[str]], component: Iterable[str]) -> list[str]:
    """One import circle through the component's first module, as `[a, b, ..., a]` (breadth-first: a shortest one)."""
    members = set(component)
    start = min(members)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for successor in sorted(graph[node] & members):
            if successor == start:
                return [*paths[node], start]
            if successor not in paths:
                paths[successor] = [*paths[node], successor]
                queue.append(successor)
    raise AssertionError(f"no cycle through {start}")  # a strongly connected component always has one


def cycles_report(graph: dict[str, set[str]], components: list[list[str]]) -> str:
    return "\n".join(" -> ".join(a_cycle(graph, component)) for component in components)


def test_the_import_graph_sees_relative_function_level_and_submodule_imports(tmp_path):
    # The circle trl_ada had between rewards.py and code_reward.py, hidden in a function-level import.
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "rewards.py").write_text("from .sub.code import reward\n")
    (package / "sub" / "__init__.py").write_text("from . import code\n")
    (package / "sub" / "code.py").write_text("def reward():\n    from ..rewards import helper\n")
    graph = import_graph(package, "pkg")
    assert graph == {
        "pkg": set(),
        "pkg.rewards": {"pkg.sub.code"},
        "pkg.sub": {"pkg.sub.code"},
        "pkg.sub.code": {"pkg.rewards"},
    }
    (component,) = strongly_connected_components(graph)
    assert a_cycle(graph, component) == ["pkg.rewards", "pkg.sub.code", "pkg.rewards"]
    # An import under `if TYPE_CHECKING:` is an edge of the full graph only: it never runs.
    (package / "sub" / "code.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from ..rewards import helper\n"
    )
    assert import_graph(package, "pkg")["pkg.sub.code"] == {"pkg.rewards"}
    assert import_graph(package, "pkg", type_checking=False)["pkg.sub.code"] == set()


def test_the_import_graph_of_a_subtree():
    # The graph runs on any sub-tree of the package, e.g. the one package whose circles are still being removed.
    graph = import_graph(PACKAGE / "samplers", "trl_ada.samplers")
    assert "trl_ada.samplers.base" in graph and all(name.startswith("trl_ada.samplers") for name in graph)
    whole = import_graph()
    assert all(graph[name] == {m for m in whole[name] if m.startswith("trl_ada.samplers")} for name in graph)


def test_no_import_cycle_in_the_whole_package():
    # Every import statement counts: module level, inside functions, and under `if TYPE_CHECKING:` (an annotation that
    # needs a circle to name its type is a circle all the same).
    graph = import_graph()
    components = strongly_connected_components(graph)
    assert not components, "import circles in trl_ada:\n" + cycles_report(graph, components)


# ---------------------------------------------------------------------------------------------------------------------
# The core and its plug-ins
# ---------------------------------------------------------------------------------------------------------------------

MAX_PUBLIC_SAMPLER_NAMES = 15
"""`trl_ada.samplers.__all__`: the sampler contract and the few functions that build and try samplers."""

EXPERIMENTAL_SAMPLERS = {"spo": "spo", "knapsack": "knapsack", "dapo_gated": "dapo_gated"}
"""Sampler name -> its module under `trl_ada/experimental/`."""


def test_the_public_sampler_namespace_is_the_contract():
    import trl_ada.samplers as samplers

    assert len(samplers.__all__) <= MAX_PUBLIC_SAMPLER_NAMES, samplers.__all__
    # Nothing else public at the package's top level: the core samplers are reached by name or by their module.
    public = {name for name in vars(samplers) if not name.startswith("_")}
    modules = {name for name in public if type(getattr(samplers, name)).__name__ == "module"}
    assert public - modules == set(samplers.__all__)


def test_the_core_imports_no_plug_in():
    graph = import_graph()
    core = {name for name in graph if not name.startswith("trl_ada.experimental")}
    reaching = {name: sorted(t for t in graph[name] if t.startswith("trl_ada.experimental")) for name in core}
    assert not {name: targets for name, targets in reaching.items() if targets}


def test_the_experimental_samplers_import_only_public_names():
    """Each plug-in imports trl-ada as a package of yours would: absolute imports of names without a leading underscore,
    from modules without one, and nothing from another plug-in."""
    for path in sorted((PACKAGE / "experimental").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("trl_ada")):
                where = f"{path.name}:{node.lineno}"
                assert node.level == 0, f"{where}: a relative import; import from trl_ada's public modules"
                parts = node.module.split(".")
                assert not any(part.startswith("_") for part in parts), f"{where}: private module {node.module}"
                assert not node.module.startswith("trl_ada.experimental"), f"{where}: imports another plug-in"
                private = [alias.name for alias in node.names if alias.name.startswith("_")]
                assert not private, f"{where}: private names {private}"
            elif isinstance(node, ast.Import):
                assert not any(alias.name.startswith("trl_ada") for alias in node.names), path.name


def test_the_experimental_samplers_are_registered_by_entry_point_when_first_named():
    declared = {entry.name: entry.value for entry in entry_points(group="trl_ada.samplers")}
    assert {name: f"trl_ada.experimental.{module}" for name, module in EXPERIMENTAL_SAMPLERS.items()}.items() <= (
        declared.items()
    ), declared
    setup_py = (ROOT / "setup.py").read_text()
    for name, module in EXPERIMENTAL_SAMPLERS.items():
        assert f'"{name} = trl_ada.experimental.{module}"' in setup_py
    # In a fresh process, importing the core registers none of them; naming one imports its module.
    code = (
        "import sys; import trl_ada.samplers as s; from trl_ada.samplers.registry import SAMPLERS, sampler_class\n"
        f"names = {sorted(EXPERIMENTAL_SAMPLERS)!r}\n"
        "assert not set(names) & set(SAMPLERS), SAMPLERS\n"
        "assert not [m for m in sys.modules if m.startswith('trl_ada.experimental.')]\n"
        "assert set(names) <= set(s.sampler_names()), s.sampler_names()\n"
        "for name in names: assert sampler_class(name).__module__.startswith('trl_ada.experimental.'), name\n"
        "assert 'torch' not in sys.modules and 'trl' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
