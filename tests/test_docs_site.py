"""The documentation site as a reader meets it: built with `mkdocs build --strict`, served over HTTP and opened in a
headless Chromium (Debian's `chromium`; `bash .ci/docs_stage.sh` installs it and runs this file).

For the home page and two others (the samplers page with its SVG picture, the benchmarks page with its PNG plots):
the DOM Chromium renders has the page's title, its heading and every navigation entry of mkdocs.yml; every <img>
on the page loads (served, non-empty, and a file of the built site); the search index lists every page of the
navigation; and the screenshot taken with that DOM has the window's size, is not blank, and is closer to the page's
own reference picture (tests/docs_site_reference/, a 40 x 28 grayscale thumbnail: text becomes grey blocks, so a
change of fonts moves it little) than to any other page's, and within a tolerance of it (for the home and samplers
pages; the benchmarks page's first screen is BENCHMARKS.md's, which changes with each measurement). On every page, no
code in a table breaks mid-word, and the API reference shows no cross-reference as text.

The site comes from TRL_ADA_DOCS_SITE (a built `site/`, as the CI stage passes it) or is built here. Without mkdocs
(the `docs` extra) the file is skipped; without chromium it is skipped, except with CI=true, where it fails (like the
sandbox tests without bubblewrap). `TRL_ADA_UPDATE_DOCS_REFERENCE=1` rewrites the reference pictures.
"""

import html
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urljoin

import pytest
import yaml

pytest.importorskip(
    "mkdocs", reason="the docs tooling is not installed: pip install -c constraints/docs.txt -e '.[docs]'"
)
Image = pytest.importorskip("PIL.Image")

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "tests" / "docs_site_reference"
CI = os.environ.get("CI", "").lower() == "true"
CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser") if shutil.which(name)), None)
WINDOW = (1280, 900)
THUMBNAIL = (40, 28)
TOLERANCE = 5.5  # mean absolute difference of the grayscale thumbnails, out of 255 (two pages differ by 6.6-8.4)
# The pages opened: (file in the site, its <h1>, the <img> sources it must show).
PAGES = {
    "index.html": ("trl-ada", ["assets/sampling-loop.svg"]),
    "samplers.html": ("Samplers", ["assets/sampling-loop.svg"]),
    "benchmarks.html": ("Benchmarks", ["benchmarks/results/learning/learning_curves.png"]),
}
# The pages whose first screen is compared with a reference picture: the benchmarks page's top is BENCHMARKS.md's,
# which changes with every new measurement (its screenshot is still checked for size and content).
REFERENCE_PAGES = ("index.html", "samplers.html")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None and not CI, reason="chromium is not installed: apt-get install -y chromium (as root)"
)


def nav_entries(nav=None) -> list[tuple[str, str | None]]:
    """(title, page) of every entry of mkdocs.yml's navigation, sections included (page None)."""
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"] if nav is None else nav
    entries = []
    for item in nav:
        ((title, target),) = item.items()
        if isinstance(target, list):
            entries += [(title, None), *nav_entries(target)]
        else:
            entries.append((title, target))
    return entries


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    given = os.environ.get("TRL_ADA_DOCS_SITE")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def server(site):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(site)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(base, timeout=2).close()
                break
            except OSError:
                time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def opened(server, tmp_path_factory) -> dict[str, tuple[str, Path]]:
    """Each page as Chromium renders it: (the DOM after its scripts ran, the screenshot taken at the same time)."""
    assert CHROMIUM, "chromium is not installed (CI=true): apt-get install -y chromium"
    shots = tmp_path_factory.mktemp("screenshots")
    pages = {}
    for page in PAGES:
        shot = shots / page.replace(".html", ".png")
        result = subprocess.run(
            [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run"]
            + ["--force-device-scale-factor=1", f"--window-size={WINDOW[0]},{WINDOW[1]}"]
            + ["--virtual-time-budget=5000", f"--screenshot={shot}", "--dump-dom", server + page],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0 and shot.is_file(), result.stderr[-3000:]
        pages[page] = (result.stdout, shot)
    return pages


def text_of(markup: str) -> str:
    """The visible text of some HTML, whitespace collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", markup)).split())


def primary_nav(dom: str) -> str:
    start = dom.index('<nav class="md-nav md-nav--primary"')
    return dom[start : dom.index("</nav>", dom.rindex("md-nav__link", start, dom.index("md-sidebar--secondary")))]


@pytest.mark.parametrize("page", PAGES)
def test_each_page_shows_its_title_heading_and_the_whole_navigation(opened, page):
    dom, _ = opened[page]
    heading, _ = PAGES[page]
    (title,) = re.findall(r"<title>(.*?)</title>", dom, flags=re.DOTALL)
    assert html.unescape(title).strip() == (heading if page == "index.html" else f"{heading} - trl-ada")
    (h1,) = re.findall(r"<h1[^>]*>(.*?)</h1>", dom, flags=re.DOTALL)
    assert text_of(h1).rstrip("¶ ").strip() == heading
    nav = text_of(primary_nav(dom))
    missing = [title for title, _ in nav_entries() if title not in nav]
    assert not missing, (missing, nav)
    assert 'data-md-component="search-query"' in dom  # the search box is on the page


@pytest.mark.parametrize("page", PAGES)
def test_every_picture_on_the_page_loads(opened, server, site, page):
    dom, _ = opened[page]
    article = dom[dom.index("<article") : dom.index("</article>")]
    sources = re.findall(r'<img[^>]*\ssrc="([^"]+)"', article)
    assert set(PAGES[page][1]) <= set(sources), sources
    for source in sources:
        url = urljoin(server + page, html.unescape(source))
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200, url
            assert len(response.read()) > 100, url
        if url.startswith(server):
            path = site / url[len(server) :]
            assert path.is_file() and path.stat().st_size > 100, path


def test_the_search_index_lists_every_page_of_the_navigation(site):
    index = json.loads((site / "search" / "search_index.json").read_text())
    locations = {doc["location"].split("#")[0] for doc in index["docs"]}
    pages = {page.replace(".md", ".html") for _, page in nav_entries() if page}
    assert pages - {"index.html"} <= locations and ("" in locations or "index.html" in locations), pages - locations
    titles = {text_of(doc["title"]) for doc in index["docs"]}
    assert {"Which sampler should I use", "AdaGRPOTrainer", "Sandbox"} <= titles


def thumbnail(path: Path) -> list[int]:
    with Image.open(path) as image:
        return list(image.convert("L").resize(THUMBNAIL, Image.Resampling.BOX).tobytes())


def distance(a: list[int], b: list[int]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a)


def test_screenshots_show_the_pages(opened):
    shots = {}
    for page, (_, shot) in opened.items():
        with Image.open(shot) as image:
            assert image.size == WINDOW, (page, image.size)
            pixels = list(image.convert("L").tobytes())
        mean = sum(pixels) / len(pixels)
        spread = (sum((p - mean) ** 2 for p in pixels[::7]) / len(pixels[::7])) ** 0.5
        assert spread > 20, (page, spread)  # not a blank (or single-colour) page
        shots[page] = thumbnail(shot)
    if os.environ.get("TRL_ADA_UPDATE_DOCS_REFERENCE") == "1":
        REFERENCE.mkdir(exist_ok=True)
        for page, pixels in shots.items():
            image = Image.new("L", THUMBNAIL)
            image.frombytes(bytes(pixels))
            image.save(REFERENCE / page.replace(".html", ".png"))
    references = {page: thumbnail(REFERENCE / page.replace(".html", ".png")) for page in PAGES}
    for page in REFERENCE_PAGES:
        pixels = shots[page]
        distances = {other: distance(pixels, reference) for other, reference in references.items()}
        assert distances[page] <= TOLERANCE, (page, distances)
        assert min(distances, key=distances.get) == page, (page, distances)


class Browser:
    """Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: JSON messages ended by a
    NUL byte, read on its fd 3 and written on its fd 4), so a test can wait for what a page's scripts do."""

    def __init__(self) -> None:
        import fcntl

        reads, self._to_browser = os.pipe()
        self._from_browser, writes = os.pipe()
        # Moved above the fds bash may use, then given to Chromium as its fds 3 and 4.
        high_reads, high_writes = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (reads, writes))
        os.close(reads)
        os.close(writes)
        binary = os.path.realpath(CHROMIUM)
        if Path("/usr/lib/chromium/chromium").is_file():  # Debian's /usr/bin/chromium is a wrapper script
            binary = "/usr/lib/chromium/chromium"
        command = f'exec 3<&{high_reads} 4>&{high_writes} {high_reads}<&- {high_writes}>&-; exec "$0" "$@"'
        self.process = subprocess.Popen(
            ["bash", "-c", command, binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run"]
            + ["--remote-debugging-pipe", "about:blank"],
            pass_fds=(high_reads, high_writes),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(high_reads)
        os.close(high_writes)
        self._id, self._buffer = 0, b""

    def call(self, method: str, session: str | None = None, **params):
        self._id += 1
        message = {"id": self._id, "method": method, "params": params, **({"sessionId": session} if session else {})}
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                chunk = os.read(self._from_browser, 1 << 16)
                assert chunk, "chromium closed its DevTools pipe"
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                assert "error" not in reply, reply["error"]
                return reply["result"]

    def open(self, url: str) -> str:
        target = self.call("Target.createTarget", url=url)["targetId"]
        return self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def evaluate(self, session: str, expression: str):
        return self.call("Runtime.evaluate", session, expression=expression, returnByValue=True)["result"].get("value")

    def close(self) -> None:
        self.process.kill()
        self.process.wait(timeout=30)
        os.close(self._to_browser)
        os.close(self._from_browser)


def test_search_works_with_the_site_opened_from_disk(site):
    """Opened from disk (file://, no server, no network), a page's search finds pages: the web worker it needs is the
    site's own iframe-worker shim, not a CDN's (which left it on "Initializing search")."""
    assert CHROMIUM, "chromium is not installed (CI=true): apt-get install -y chromium"
    for page in sorted(site.rglob("*.html")):
        sources = re.findall(r'<script[^>]*\ssrc="([^"]+)"', page.read_text())
        assert not [source for source in sources if "//" in source], (page, sources)  # every script is the site's
    browser = Browser()
    try:
        session = browser.open((site / "reference" / "samplers.html").as_uri() + "?q=sandbox")
        meta, found = "", 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not found:
            time.sleep(0.5)
            # Until the search widget has rendered (slow on a loaded machine) its element is missing: read it as empty.
            meta, found = browser.evaluate(
                session,
                "[(document.querySelector('.md-search-result__meta') || {textContent: ''}).textContent.trim(),"
                " document.querySelectorAll('.md-search-result__item').length]",
            ) or ("", 0)
    finally:
        browser.close()
    assert found > 0 and "matching document" in meta, meta


# The code spans of a page's tables that a line break splits between two word characters (`seq_balanc` / `e`); a
# break at a space, a hyphen or a slash is the browser's ordinary wrapping.
BROKEN_CODE = """
[...document.querySelectorAll('article table code')].filter(code => {
  if (code.getClientRects().length < 2) return false;
  const texts = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
  let top = null, previous = '';
  for (let node = texts.nextNode(); node; node = texts.nextNode()) {
    for (let i = 0; i < node.length; i++) {
      const range = document.createRange();
      range.setStart(node, i);
      range.setEnd(node, i + 1);
      const rect = range.getClientRects()[0];
      if (!rect) continue;
      if (top !== null && rect.top > top + 1 && /\\w/.test(previous) && /\\w/.test(node.data[i])) return true;
      top = rect.top;
      previous = node.data[i];
    }
  }
  return false;
}).map(code => code.textContent)
"""


def test_identifiers_in_tables_never_break_mid_word(site):
    """Material lets inline code break anywhere, and a table narrowed its column of sampler names until `seq_balance`
    showed as `seq_balanc` over `e`; at the screenshots' width and a narrow one, no code span in any page's tables is
    split between two word characters."""
    assert CHROMIUM, "chromium is not installed (CI=true): apt-get install -y chromium"
    pages = sorted(page for page in site.rglob("*.html") if "<table" in page.read_text())
    assert site / "samplers.html" in pages
    browser = Browser()
    broken = {}
    try:
        session = browser.open("about:blank")
        for width in (WINDOW[0], 800):
            metrics = dict(width=width, height=WINDOW[1], deviceScaleFactor=1, mobile=False)
            browser.call("Emulation.setDeviceMetricsOverride", session, **metrics)
            for page in pages:
                browser.call("Page.navigate", session, url=page.as_uri())
                deadline = time.monotonic() + 30
                while (
                    browser.evaluate(session, "document.readyState") != "complete"
                    or browser.evaluate(session, "document.URL") != page.as_uri()
                ):
                    assert time.monotonic() < deadline, f"{page} did not load"
                    time.sleep(0.05)
                found = browser.evaluate(session, BROKEN_CODE)
                if found:
                    broken[f"{page.relative_to(site).as_posix()} at {width} px"] = found
    finally:
        browser.close()
    assert not broken, broken


# A reference left as text: bracketed code (Markdown resolved no link), the docstring's own syntax, or the autorefs
# syntax the hook writes, where mkdocstrings renders a docstring's text as code (e.g. an argument's type).
UNRESOLVED_REFERENCE = re.compile(r"\[<code>~?[\w.]+</code>\]|\[`~?[\w.]+`\]|\]\[trl_ada\.[\w.]+\]")


def test_the_api_reference_links_every_cross_reference(site):
    """The docstrings' TRL-style references (``[`Sandbox`]``, ``[`~trl.GRPOTrainer`]``) render as links to their
    entries (or as code, for another library's), never as bracketed text, also in an argument's type."""
    unresolved = {}
    for page in sorted(site.rglob("*.html")):
        found = UNRESOLVED_REFERENCE.findall(page.read_text())
        if found:
            unresolved[page.relative_to(site).as_posix()] = found
    assert not unresolved, unresolved
    sandbox_page = (site / "reference" / "sandbox.html").read_text()
    assert 'href="#trl_ada.rewards.sandbox.SANDBOX_UIDS"' in sandbox_page  # Sandbox's docstring links the uids
    # A reference in an argument's type (TRL's `name ([`~Type`], *optional*):`) links from the argument's row.
    trainers_page = (site / "reference" / "trainers.html").read_text()
    row = trainers_page[trainers_page.index("<code>pass_rate_estimator</code>") :].split("</tr>", 1)[0]
    assert row.count('href="samplers.html#trl_ada.samplers.tracker.PassRateEstimator"') == 2, row


def test_an_unresolved_cross_reference_fails_the_strict_build(tmp_path):
    """A reference to an object the reference does not render, or to no object at all, stops `mkdocs build
    --strict`, naming it; rendered, the same reference is a link."""
    package = tmp_path / "demo"
    package.mkdir()
    source = 'def shown():\n    """Calls [`helper`]."""\n\n\ndef helper():\n    """Helps."""\n'
    (package / "__init__.py").write_text(source)
    (tmp_path / "docs").mkdir()
    config = {
        "site_name": "demo",
        "strict": True,
        "docs_dir": "docs",
        "plugins": [
            {
                "mkdocstrings": {
                    "handlers": {
                        "python": {
                            "paths": ["."],
                            "options": {
                                "extensions": [
                                    {f"{ROOT}/docs/hooks/cross_references.py:CrossReferences": {"package": "demo"}}
                                ]
                            },
                        }
                    }
                }
            }
        ],
    }
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))

    def build(page: str) -> subprocess.CompletedProcess:
        (tmp_path / "docs" / "index.md").write_text(page)
        return subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        )

    missing = build("# Demo\n\n::: demo.shown\n")
    assert missing.returncode != 0 and "demo.helper" in missing.stderr, missing.stderr[-2000:]
    linked = build("# Demo\n\n::: demo.shown\n\n::: demo.helper\n")
    assert linked.returncode == 0, linked.stderr[-2000:]
    assert 'href="#demo.helper"' in (tmp_path / "site" / "index.html").read_text()
    # In an argument's type, which mkdocstrings renders as code, the reference still becomes a link.
    typed = 'def typed(fallback: int = 0):\n    """Falls back.\n\n    Args:\n        fallback ([`~demo.helper`], *optional*): Last.\n    """\n'
    (package / "__init__.py").write_text(f"{source}\n\n{typed}")
    linked = build("# Demo\n\n::: demo.typed\n\n::: demo.helper\n")
    assert linked.returncode == 0, linked.stderr[-2000:]
    page = (tmp_path / "site" / "index.html").read_text()
    link = '<a class="autorefs autorefs-internal" href="#demo.helper"><code>helper</code></a>'
    assert f"({link}, <em>optional</em>)" in page, page
    assert "][demo." not in page  # the rewritten reference is nowhere as text (the page's source shows the original)
    (package / "__init__.py").write_text(source + '\n\ndef typo():\n    """Calls [`nowhere`]."""\n')
    typo = build("# Demo\n\n::: demo.shown\n\n::: demo.helper\n")
    assert typo.returncode != 0 and "[`nowhere`]" in typo.stderr, typo.stderr[-2000:]
