"""The README is a front door (at most 150 lines, its tour of the cockpit at most 30) and the guides in docs/ hold the rest: every relative
link of README.md, CHANGELOG.md, ARCHITECTURE.md, CONTRIBUTING.md and docs/*.md points at a file that exists (and at a
heading that exists, for a #fragment), and the generated key table is current."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "ARCHITECTURE.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    fence, out = False, set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


def test_the_readme_is_short_and_links_every_guide():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150  # issue 54: a newcomer reads it in five minutes
    tour = readme[readme.index("\n## The cockpit\n") + 1 :]
    tour = tour[: tour.index("\n## ")]
    assert len(tour.splitlines()) <= 30, "the README's tour of the cockpit is over 30 lines: the rest belongs in docs/cockpit.md"
    for guide in sorted((ROOT / "docs").glob("*.md")):
        assert f"](docs/{guide.name})" in readme, f"README does not link docs/{guide.name}"
    assert "](CHANGELOG.md)" in readme


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"(https?|mailto):", target):
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(target)
    assert not broken, f"{page.name}: {broken}"


def test_the_key_table_is_generated_and_current():
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "lf_keys_table.py"), "--check"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
