"""MkDocs hook: pages of the site that live elsewhere in the repository, shown as they are there.

- `benchmarks.md` is BENCHMARKS.md (the full record stays at the repository's root), with every picture it shows
  (the PNGs under `benchmarks/results/`) copied into the site at the same relative path.
- `recipes.md` is recipes/README.md.

Links in those files are written for GitHub, relative to their own folder. Here a link to a page of the site (for
example `docs/scaling.md#...`) is pointed at that page; a link to another file of the repository, which the site does
not hold, becomes its path in code (`scripts/x.py`), so that `mkdocs build --strict` finds no broken link.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
PAGES = {"benchmarks.md": "BENCHMARKS.md", "recipes.md": "recipes/README.md"}
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
SITE_PAGES = {"README.md": "index.md", "BENCHMARKS.md": "benchmarks.md", "recipes/README.md": "recipes.md"}


def section_page(anchor: str) -> str | None:
    """The page of docs/ with a section of that anchor (a README section that moved to the site), if any."""
    for page in sorted((ROOT / "docs").glob("*.md")):
        for heading in re.findall(r"^#+ (.+?)\s*$", page.read_text(encoding="utf-8"), flags=re.MULTILINE):
            if re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", heading.lower())).strip("-") == anchor:
                return page.name
    return None


def repository_path(source: str, target: str) -> str:
    """`target`, a link in the repository file `source`, as a path from the repository's root."""
    return posixpath.normpath(posixpath.join(posixpath.dirname(source), target))


def site_link(source: str, target: str, docs: set[str]) -> str | None:
    """Where a link of `source` points in the site, or None when the site does not hold that file."""
    if re.match(r"[a-z]+:", target) or target.startswith("#"):
        return target
    path, _, anchor = target.partition("#")
    path = repository_path(source, path)
    page = SITE_PAGES.get(path) or (path[len("docs/") :] if path.startswith("docs/") else None)
    if path == "README.md" and anchor:  # the README's sections moved to the site's pages
        page = section_page(anchor)
        if page is None:
            return None
    if page in docs or (page is None and path in docs):
        return (page or path) + (f"#{anchor}" if anchor else "")
    return None


def rewrite(source: str, text: str, docs: set[str]) -> tuple[str, list[str]]:
    """The text of `source` with links pointed into the site, and the repository paths of its pictures."""
    pictures: list[str] = []

    def replace(match: re.Match[str]) -> str:
        bang, title, target = match.groups()
        if bang:
            path = repository_path(source, target)
            pictures.append(path)
            return f"![{title}]({path})"
        link = site_link(source, target, docs)
        return f"[{title}]({link})" if link else f"{title} (`{repository_path(source, target.split('#')[0])}`)"

    out, in_code = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            in_code = not in_code
        out.append(line if in_code else LINK.sub(replace, line))
    return "".join(out), pictures


def on_files(files: Files, config) -> Files:
    docs = {file.src_uri for file in files} | set(PAGES)
    for page, source in PAGES.items():
        text, pictures = rewrite(source, (ROOT / source).read_text(encoding="utf-8"), docs)
        files.append(File.generated(config, page, content=text))
        for picture in dict.fromkeys(pictures):
            if (ROOT / picture).is_file() and files.get_file_from_path(picture) is None:
                files.append(File.generated(config, picture, abs_src_path=str(ROOT / picture)))
    return files
