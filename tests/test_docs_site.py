"""The documentation site as a reader meets it: built with `mkdocs build --strict`, served over HTTP and opened in a
headless Chromium (Debian's `chromium`; `bash .ci/docs_stage.sh` installs it and runs this file).

For the home page and two others (the samplers page with its SVG picture, the benchmarks page with its PNG plots):
the DOM Chromium renders has the page's title, its heading and every navigation entry of mkdocs.yml; every <img>
on the page loads (served, non-empty, and a file of the built site); the search index lists every page of the
navigation; and the screenshot taken with that DOM has the window's size, is not blank, and is closer to the page's
own reference picture (tests/docs_site_reference/, a 40 x 28 grayscale thumbnail: text becomes grey blocks, so a
change of fonts moves it little) than to any other page's, and within a tolerance of it (for the home and samplers
pages; the benchmarks page's first screen is BENCHMARKS.md's, which changes with each measurement).

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
