"""Every relative link in README.md and docs/ points at a file (and heading) in this repository."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def prose(text: str) -> str:
    """The page without its fenced code blocks and inline code (links there are examples)."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    headings = re.findall(r"^#{1,6}\s+(.*)$", FENCE.sub("", page.read_text()), re.M)
    return {slug(h) for h in headings}


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text()))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto: ...


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or ROOT not in (dest, *dest.parents):
            broken.append(f"{target} (no such file in the repository)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    assert not broken, broken


def test_no_page_points_outside_the_repository() -> None:
    offenders = [str(p.relative_to(ROOT)) for p in PAGES if "../shared" in p.read_text()]
    assert not offenders, offenders


def test_the_checker_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "a.md"
    page.write_text("# Top\n\n[ok](a.md#top) [bad](missing.md) ![img](b.png) `[x](no.md)`\n"
                    "```\n[in code](nowhere.md)\n```\n[web](https://example.com)\n")
    assert links(page) == ["a.md#top", "missing.md", "b.png"]
    assert anchors(page) == {"top"}
    assert slug("Will it fit, and how fast? (`ggufdesk probe`, `plan`)") == \
        "will-it-fit-and-how-fast-ggufdesk-probe-plan"
