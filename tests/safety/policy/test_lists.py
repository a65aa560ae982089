"""The shipped lists: versioned, well-formed, and internally consistent."""

from __future__ import annotations

import tomllib

import pytest

from safety.policy import lists
from safety.policy.prompt_policy import PromptPolicy
from safety.config import PolicyConfig

SHIPPED = lists.shipped_dir()
LANGUAGES = sorted(p.stem for p in SHIPPED.glob("*.toml") if p.name != lists.MANIFEST)


def test_the_manifest_digest_matches_the_lists():
    """Changing a list without a new version would make refusals untraceable."""
    manifest = tomllib.loads((SHIPPED / lists.MANIFEST).read_text())
    assert manifest["digest"] == lists.digest(SHIPPED), (
        f"the lists changed: bump `version` in {SHIPPED / lists.MANIFEST} and set "
        f'digest = "{lists.digest(SHIPPED)}"')


def test_the_nineteen_languages_ship():
    assert set(PolicyConfig().languages) <= set(LANGUAGES) and len(PolicyConfig().languages) == 19


@pytest.mark.parametrize("code", LANGUAGES)
def test_each_language_loads_every_category(code):
    lex = lists.load((code,))
    found = {(e.category, e.kind) for e in lex.entries}
    for cat in ("sexual", "violence", "hate", "self_harm"):
        assert (cat, "strong") in found, f"{code}: no strong {cat} terms"
    assert ("sexual_minors", "minors") in found and ("exempt", "phrases") in found
    assert lex.ages, f"{code}: no age patterns"


@pytest.mark.parametrize("code", LANGUAGES)
def test_stems_are_long_enough_to_be_specific(code):
    short = [e.words for e in lists.load((code,)).entries if e.stem and len(e.words[-1]) < 4]
    assert not short, f"{code}: stems under 4 letters match too many words: {short}"


def test_no_exempt_phrase_hides_a_whole_strong_term():
    lex = lists.load(tuple(LANGUAGES))
    exempt = {e.words for e in lex.entries if e.category == "exempt"}
    clash = [e.words for e in lex.entries if e.kind == "strong" and e.words in exempt and e.category != "exempt"]
    assert not clash, f"exempt phrases equal to strong terms (they would never refuse): {clash}"


def test_no_list_entry_refuses_a_neutral_prompt():
    policy = PromptPolicy.load(PolicyConfig(languages=tuple(LANGUAGES)))
    assert not policy.judge("a lighthouse on a cliff at dawn").refused
