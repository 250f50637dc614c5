"""MkDocs hook: the site's search works opened from disk (``file://``), with no network.

Browsers run no web worker from ``file://``; Material's ``offline`` plugin makes search work there with the
iframe-worker shim, which it loads from a CDN (``https://unpkg.com/iframe-worker/shim``). A machine without network,
or one that opens the site from disk to avoid it, then stays on "Initializing search". This hook points that script
at the copy shipped in ``docs/assets/javascripts/`` (the npm package's ``shim/index.js``, MIT), relative to each page.
"""

from __future__ import annotations

from mkdocs.utils import get_relative_url

CDN_SHIM = "https://unpkg.com/iframe-worker/shim"
LOCAL_SHIM = "assets/javascripts/iframe-worker-shim.js"


def on_post_page(output: str, page, config) -> str:
    return output.replace(f'src="{CDN_SHIM}"', f'src="{get_relative_url(LOCAL_SHIM, page.url)}"')


def on_post_template(output_content: str, template_name: str, config) -> str:
    """The same for the pages rendered from a template alone (``404.html``), whose links start at the site's root."""
    return output_content.replace(f'src="{CDN_SHIM}"', f'src="/{LOCAL_SHIM}"')
