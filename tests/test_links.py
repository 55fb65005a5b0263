"""Every relative link in the documents leads somewhere: the README, ``docs/**/*.md`` and the HTML pages in ``docs/``.

A link leads somewhere when its file exists and its ``#anchor``, if any, is
a heading of the target Markdown file as a code host names it (GitHub's
rule, :func:`slug`) or an ``id``/``name`` in the target HTML page. Web
addresses (``https:``, ``mailto:``, ``data:``) are not checked; links inside
code are not links. The rendered walkthroughs (``docs/walkthroughs/``) are
checked as committed: their links were written for ``notebooks/`` and
``notebooks/render.py`` rewrites them (:func:`relink`, tested here too), so
a page links to its neighbours' rendered pages, never to a notebook.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]

#: Markdown code (fenced blocks, spans: skipped), a Markdown link or image target, an inline HTML href/src.
MD_LINK = re.compile(r"(^```.*?^```|`[^`\n]*`)|\]\(<?([^)\s>]+)|\b(?:href|src)=\"([^\"]+)\"", re.S | re.M)
HTML_LINK = re.compile(r"<[a-zA-Z][^>]*?\b(?:href|src)=\"([^\"]+)\"")
HTML_ID = re.compile(r"""\b(?:id|name)=(?:"([^"]+)"|'([^']+)')""")
WEB = re.compile(r"[A-Za-z][\w+.-]*:")  # a scheme: https:, mailto:, data:


def documents(root: Path = ROOT) -> list[Path]:
    """The files whose links are checked: README.md, every Markdown file under docs/, and the HTML pages there."""
    return sorted([root / "README.md", *root.glob("docs/**/*.md"), *root.glob("docs/**/*.html")])


def links(path: Path) -> Iterator[str]:
    """Every link target in a Markdown or HTML file, web addresses included, code left out."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".html":
        yield from (html.unescape(target) for target in HTML_LINK.findall(text))
        return
    for match in MD_LINK.finditer(text):
        if match.group(1) is None:
            yield match.group(2) or html.unescape(match.group(3))


def slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: its text, lower case, punctuation dropped, each space a ``-``.

    The text is what the heading shows: a link shows its text, code and
    emphasis lose their marks, HTML tags vanish.
    """
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](target) -> text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """The anchors a file offers: a Markdown file's heading slugs (repeats numbered -1, -2, ...) and explicit
    ``id``/``name`` attributes; an HTML page's ``id``/``name`` attributes."""
    text = path.read_text(encoding="utf-8")
    found = {unquote(html.unescape(a or b)) for a, b in HTML_ID.findall(text)}
    if path.suffix == ".html":
        return frozenset(found)
    seen: dict[str, int] = {}
    fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        heading = re.match(r" {0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$", line)
        if heading and not fence:
            anchor = slug(heading.group(1))
            found.add(f"{anchor}-{seen[anchor]}" if anchor in seen else anchor)
            seen[anchor] = seen.get(anchor, 0) + 1
    return frozenset(found)


def check(path: Path) -> tuple[int, list[str]]:
    """(how many relative links and anchors ``path`` has, those that lead nowhere, each with why)."""
    checked, dead = 0, []
    for target in links(path):
        if WEB.match(target):
            continue
        checked += 1
        file_part, _, anchor = target.partition("#")
        file = (path.parent / unquote(file_part.split("?")[0])).resolve() if file_part else path
        if not file.exists():
            dead.append(f"{target} (no such file)")
        elif anchor and file.suffix in (".md", ".html") and unquote(anchor) not in anchors(file):
            dead.append(f"{target} (no such anchor in {file.name})")
    return checked, dead


def test_slugs_are_githubs():
    """Against headings of this repository's kind, with the anchors github.com gives them."""
    assert slug("3. Importance scores") == "3-importance-scores"
    assert slug("14. Protocols: the published methods and bsi's tuned defaults") == \
        "14-protocols-the-published-methods-and-bsis-tuned-defaults"
    assert slug("01 · Reparameterization") == "01--reparameterization"  # the dot goes, both spaces stay
    assert slug("The `bsi` command, [in short](cli.md)") == "the-bsi-command-in-short"
    assert slug("snake_case and-hyphen") == "snake_case-and-hyphen"


def test_the_checker_finds_dead_files_and_anchors(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Top\n\n## Top\n\n```\n# not a heading\n```\n<a id=\"here\"></a>\n")
    (tmp_path / "docs" / "p.html").write_text('<h1 id="Top-Heading">x</h1><a href="#Top-Heading">¶</a>'
                                              '<a href="#gone">x</a><script src="p.js"></script>')
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md#top) [ok](docs/a.md#top-1) [ok](docs/a.md#here) [web](https://example.org/x#y)\n"
        "[dead](docs/b.md) [dead](docs/a.md#not-a-heading) `[code](docs/none.md)` [ok](docs/p.html#Top-Heading)\n"
        "[dead](docs/p.html#top-heading) <a href=\"docs/a.md#top-2\">dead</a> [mail](mailto:a@b)\n")
    assert [d.name for d in documents(tmp_path)] == ["README.md", "a.md", "p.html"]
    checked, dead = check(tmp_path / "README.md")
    assert checked == 8 and dead == ["docs/b.md (no such file)", "docs/a.md#not-a-heading (no such anchor in a.md)",
                                     "docs/p.html#top-heading (no such anchor in p.html)",
                                     "docs/a.md#top-2 (no such anchor in a.md)"]
    assert check(tmp_path / "docs" / "p.html") == (3, ["#gone (no such anchor in p.html)", "p.js (no such file)"])


@pytest.mark.parametrize("document", documents(), ids=[str(d.relative_to(ROOT)) for d in documents()])
def test_every_relative_link_and_anchor_leads_somewhere(document):
    _, dead = check(document)
    assert not dead, f"{document.relative_to(ROOT)} links to what does not exist: {dead}"


def test_the_walkthroughs_link_to_each_others_rendered_pages():
    """A code host shows a notebook's plotly figures blank: a rendered page's "Next:" opens the next rendered page."""
    pages = sorted((ROOT / "docs" / "walkthroughs").glob("[0-9][0-9]_*.[mh][dt]*"))
    assert pages, "no rendered walkthroughs"
    for page in pages:
        notebooks = [t for t in links(page) if t.split("#")[0].endswith(".ipynb")]
        assert not notebooks, f"{page.name} links to notebooks: {notebooks}"
        siblings = [t for t in links(page) if re.fullmatch(r"\d\d_\w+\.\w+(#.*)?", t)]
        assert all(t.split("#")[0].endswith(page.suffix) for t in siblings), f"{page.name}: {siblings}"
    assert any(re.fullmatch(r"\d\d_\w+\.md", t) for p in pages for t in links(p))  # the "Next:" links are there


def _render():
    return load_script(ROOT / "notebooks" / "render.py", "notebook_render")


def test_relink_rewrites_notebook_links_for_the_rendered_copies():
    relink = _render().relink
    text = ("See [§3](../docs/method.md#3-importance-scores), ![a figure](../docs/img/x.png), "
            "[the code](../bsi/method/layers.py), [a source](src/01_reparameterization.py), [up](../docs/).\n"
            "Next: [02 · Scoring](02_importance_scoring.ipynb#the-end).\n"
            "Kept: [web](https://arxiv.org/abs/2605.01627), [mail](mailto:a@b), [here](#a-heading), "
            "`[code](../docs/x.md)`, <a href=\"../README.md\">raw HTML</a>\n```\n[fenced](../docs/y.md)\n```\n")
    assert relink(text, "md") == (
        "See [§3](../method.md#3-importance-scores), ![a figure](../img/x.png), "
        "[the code](../../bsi/method/layers.py), [a source](../../notebooks/src/01_reparameterization.py), [up](../).\n"
        "Next: [02 · Scoring](02_importance_scoring.md#the-end).\n"
        "Kept: [web](https://arxiv.org/abs/2605.01627), [mail](mailto:a@b), [here](#a-heading), "
        "`[code](../docs/x.md)`, <a href=\"../../README.md\">raw HTML</a>\n```\n[fenced](../docs/y.md)\n```\n")
    assert "(02_importance_scoring.html#the-end)" in relink(text, "html")
    assert "(02_importance_scoring.ipynb#the-end)" in relink(text, "ipynb")  # JupyterLab opens the executed copy
    page = '<a href="../docs/method.md#x">m</a> <code>[c](../docs/z.md)</code> <img src="../docs/img/x.png">'
    assert relink(page, "html", html_text=True) == \
        '<a href="../method.md#x">m</a> <code>[c](../docs/z.md)</code> <img src="../img/x.png">'
    # each rewritten link leads where the original did: resolved from notebooks/ and from docs/walkthroughs/
    targets = re.compile(r"\]\(([^)#\s]+)")
    for before, after in zip(targets.findall(text)[:5], targets.findall(relink(text, "md"))):
        assert (ROOT / "notebooks" / before).resolve() == (ROOT / "docs" / "walkthroughs" / after).resolve()
