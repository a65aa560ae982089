"""The front door and the docs hold: README short, its two commands, every relative link and anchor
resolving, docs/config.md what the settings trees say, and the project speaking of itself."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from release.config_doc import OUT, render

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 350
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def test_readme_is_a_front_door_with_the_two_commands():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    assert "make demo" in text and "make test" in text


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    out, seen, fenced = set(), {}, False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(page: Path) -> list[str]:
    out, fenced = [], False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out += LINK.findall(re.sub(r"`[^`]*`", "", line))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            broken.append(f"{target}: no heading #{anchor} in {where.relative_to(REPO)}")
    assert broken == []


def test_config_page_is_what_the_settings_trees_say():
    assert OUT.read_text() == render(), "docs/config.md is stale: run `make docs`"


SPOKEN_OF = ["README.md", "docs", "worker", "scheduler", "safety", "client", "protocol", "launch", "bench", "release", "configs",
             "tests"]


# Spelled in two pieces so that this file does not match itself (a plain `grep -r` finds nothing either).
TRACKER = "iss" + "ue"
SPOKEN = rf"the {TRACKER}|{TRACKER} [0-9]+"


@pytest.mark.integration
def test_the_project_speaks_of_itself_not_of_its_tracker():
    found = subprocess.run(["git", "grep", "-n", "-i", "-I", "-E", SPOKEN, "--", *SPOKEN_OF], cwd=REPO,
                           capture_output=True, text=True).stdout
    assert found == ""
