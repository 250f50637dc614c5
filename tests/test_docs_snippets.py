"""Every snippet of the documentation marked runnable runs as it stands, offline, on CPU.

A page marks a code block runnable with an HTML comment on its own line before the block (invisible on the site and
on GitHub)::

    <!-- runnable -->

    ```python
    ...
    ```

A run that must be shorter in the test than on the page says so in the marker, as `old -> new` replacements separated
by `;` (`<!-- runnable: max_steps=50 -> max_steps=2 -->`): the page shows what a user runs, the marker what the test
changes. Python blocks run as a script, bash blocks with `bash -euo pipefail`, console blocks' `$ ` lines as bash; each
in an empty folder of its own with the Hub offline (`HF_HUB_OFFLINE=1`), so a block must use the model shipped in
trl-ada or a file it makes. Every page of docs/ that shows code has one, except the pages listed in `WITHOUT_RUNNABLE`,
each with the reason (the README's quick start is run by tests/test_docs.py, with 2 steps).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(
    r"^<!-- runnable(?::(?P<changes>.*?))? -->\n(?:[ \t]*\n)*```(?P<language>[a-z]+)\n(?P<code>.*?)^```",
    flags=re.MULTILINE | re.DOTALL,
)
# Pages with code but no block that can run on a CPU without a download, and why.
WITHOUT_RUNNABLE = {
    "vllm.md": "vLLM needs a GPU",
    "scaling.md": "many GPUs and nodes",
    "development.md": "the commands run the test suite and CI stages",
    "agents.md": "its Calculator trains a Hub model; tests/test_environments.py trains it with a tiny tool model",
    "async.md": "the asynchronous trainer generates with a vLLM server",
}
LANGUAGES = ("python", "bash", "console")


@dataclass(frozen=True)
class Snippet:
    page: str
    line: int
    language: str
    code: str

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def apply_changes(code: str, changes: str | None, where: str) -> str:
    """The block with the marker's `old -> new` replacements made; each `old` must occur in the block."""
    for change in filter(None, (part.strip() for part in (changes or "").split(";"))):
        old, new = (side.strip() for side in change.split("->"))
        assert old in code, f"{where}: the marker replaces {old!r}, which the block does not hold"
        code = code.replace(old, new)
    return code


def runnable_snippets(path: Path, root: Path = ROOT) -> list[Snippet]:
    text = path.read_text()
    page = path.relative_to(root).as_posix()
    snippets = []
    for match in MARKER.finditer(text):
        line = text.count("\n", 0, match.start("code"))
        where = f"{page}:{line}"
        assert match["language"] in LANGUAGES, f"{where}: a runnable block must be one of {LANGUAGES}"
        snippets.append(Snippet(page, line, match["language"], apply_changes(match["code"], match["changes"], where)))
    markers = len(re.findall(r"^<!-- runnable\b", text, flags=re.MULTILINE))
    assert markers == len(snippets), f"{page}: a runnable marker is not directly above a code block"
    return snippets


SNIPPETS = [snippet for page in PAGES for snippet in runnable_snippets(page)]


def script_of(snippet: Snippet) -> tuple[list[str], str]:
    if snippet.language == "python":
        return [sys.executable, "snippet.py"], snippet.code
    if snippet.language == "bash":
        return ["bash", "-euo", "pipefail", "snippet.sh"], snippet.code
    commands = [line[2:] for line in snippet.code.splitlines() if line.startswith("$ ")]
    assert commands, f"{snippet.name}: a console block shows its commands as `$ ` lines"
    return ["bash", "-euo", "pipefail", "snippet.sh"], "\n".join(commands) + "\n"


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[snippet.name for snippet in SNIPPETS])
def test_every_runnable_snippet_runs_offline(snippet, tmp_path):
    command, script = script_of(snippet)
    (tmp_path / command[-1]).write_text(script)
    env = {
        **os.environ,
        # `python`, `trl-ada` and `accelerate` are this environment's, as in an activated virtualenv.
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
    }
    env.pop("PYTHONPATH", None)
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{snippet.name}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"


def test_every_page_with_code_has_a_runnable_snippet():
    with_code = {
        path.name
        for path in PAGES[1:]
        if re.search(r"^```(python|bash|console)$", path.read_text(), flags=re.MULTILINE)
    }
    marked = {Path(snippet.page).name for snippet in SNIPPETS}
    assert set(WITHOUT_RUNNABLE) <= with_code, set(WITHOUT_RUNNABLE) - with_code
    assert not marked & set(WITHOUT_RUNNABLE), marked & set(WITHOUT_RUNNABLE)  # a listed page that has one now
    assert with_code - set(WITHOUT_RUNNABLE) <= marked, with_code - set(WITHOUT_RUNNABLE) - marked


def test_a_marker_must_sit_above_a_block_and_its_replacements_must_apply(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- runnable: max_steps=50 -> max_steps=2 -->\n\n```python\nrun(max_steps=50)\n```\n")
    (snippet,) = runnable_snippets(page, tmp_path)
    assert snippet.code == "run(max_steps=2)\n" and snippet.language == "python"
    page.write_text("<!-- runnable: steps=9 -> steps=2 -->\n\n```python\nrun(max_steps=50)\n```\n")
    with pytest.raises(AssertionError, match="steps=9"):
        runnable_snippets(page, tmp_path)
    page.write_text("<!-- runnable -->\n\ntext\n\n```python\nrun()\n```\n")
    with pytest.raises(AssertionError, match="not directly above"):
        runnable_snippets(page, tmp_path)
