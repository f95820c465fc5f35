"""Every relative link in README.md and the pages under docs/ (docs/guide/, docs/reference/, ...) points to a file
of the repository (anchors are not checked), and the README links every page of docs/: a moved or renamed page must
not leave readers at a dead link."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# [text](target "title") and ![alt](target); reference definitions: [label]: target
INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
FENCE = re.compile(r"^\s{0,3}(```|~~~)")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")  # http:, https:, mailto:, ...


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every link outside code blocks and code spans."""
    out: list[tuple[int, str]] = []
    fence: str | None = None
    for no, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if opened:
            if fence is None:
                fence = opened.group(1)
            elif opened.group(1) == fence:
                fence = None
            continue
        if fence is not None:
            continue
        bare = CODE_SPAN.sub("``", line)
        out += [(no, m.group(1)) for m in INLINE.finditer(bare)]
        ref = REFERENCE.match(bare)
        if ref:
            out.append((no, ref.group(1)))
    return out


def broken(page: Path, root: Path = ROOT) -> list[str]:
    """Relative links of `page` whose file does not exist (or lies outside `root`), as 'page:line: target'."""
    bad = []
    for no, target in links(page.read_text(encoding="utf-8")):
        if EXTERNAL.match(target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0].split("?", 1)[0]
        resolved = (page.parent / path).resolve()
        if not resolved.is_relative_to(root.resolve()) or not resolved.exists():
            bad.append(f"{page.relative_to(root)}:{no}: {target}")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_point_to_files(page: Path) -> None:
    assert not broken(page), "links to files that do not exist (fix the path or the page):\n" + "\n".join(
        broken(page))


def test_the_readme_links_every_page_of_docs() -> None:
    readme = ROOT / "README.md"
    linked = {(ROOT / t.split("#", 1)[0]).resolve() for _, t in links(readme.read_text(encoding="utf-8"))
              if not EXTERNAL.match(t)}
    missing = [str(p.relative_to(ROOT)) for p in PAGES[1:] if p.resolve() not in linked]
    assert not missing, f"docs not linked from the README's Documentation list: {', '.join(missing)}"


def test_the_checker_finds_a_dead_link_and_skips_code_and_urls(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.md").write_text("# there\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "[ok](there.md#a-section) and [`code` text](./there.md) and ![img](there.md \"title\")\n"
        "[web](https://example.com/missing.md) [anchor](#here) `[not a link](gone.md)`\n"
        "```\n[in a fence](gone.md)\n```\n"
        "[dead](gone.md) and [up and out](../../outside.md)\n"
        "[ref]: missing-too.md\n",
        encoding="utf-8")
    assert broken(page, tmp_path) == [
        "docs/page.md:6: gone.md", "docs/page.md:6: ../../outside.md", "docs/page.md:7: missing-too.md"]
