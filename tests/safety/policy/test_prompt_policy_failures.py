"""What stops start-up: lists that do not follow the format, config naming what does not exist.
What fails a task closed: a policy that raises."""

from __future__ import annotations

import pytest

from safety.config import PolicyConfig, SafetyConfig
from safety.guard import Guard
from safety.policy.prompt_policy import PromptPolicy
from safety.verdicts import CheckFailed, SafetyLoadError


def load(**cfg) -> PromptPolicy:
    # As the config loader gives them: TOML arrays as tuples.
    return PromptPolicy.load(PolicyConfig.model_validate({k: tuple(v) if isinstance(v, list) else v
                                                          for k, v in cfg.items()}))


def test_an_unknown_language_names_the_field():
    with pytest.raises(SafetyLoadError, match=r"safety.text.policy.languages: no list for 'xx'"):
        load(languages=["en", "xx"])


def test_an_unknown_category_names_the_field():
    with pytest.raises(SafetyLoadError, match=r"safety.text.policy.categories.violnce: no such category"):
        load(categories={"violnce": {"enabled": False}})


@pytest.mark.parametrize("setting", [{"enabled": False}, {"threshold": 2.0}])
def test_the_minors_rule_cannot_be_configured_away(setting):
    with pytest.raises(SafetyLoadError, match=r"categories.sexual_minors: .* whatever the config says"):
        load(categories={"sexual_minors": setting})


def test_no_language_at_all_is_a_config_error():
    with pytest.raises(ValueError, match="languages: name at least one"):
        PolicyConfig.model_validate({"languages": ()})


@pytest.mark.parametrize("body, message", [
    ("[sexual]\nstrong = 'porn'\n", r"sexual.strong: a list of non-empty strings"),
    ("[sexual]\nstrongg = ['x']\n", r"sexual.strongg: unknown key"),
    ("[weapons]\nstrong = ['rifle']\n", r"\[weapons\]: no such category"),
    ("[sexual]\nstrong = ['***']\n", r"sexual.strong: entry #1 normalises to nothing"),
    ("[sexual_minors]\nages = ['year old']\n", r"needs exactly one \{n\}"),
    ("[sexual_minors]\ndurations = ['{n} years {n} later']\n", r"sexual_minors.durations: .* needs exactly one \{n\}"),
    ("[sexual_minors]\nnumbers = ['twelve']\n", r"sexual_minors.numbers: a table of spelled-out number"),
    ("[sexual_minors.numbers]\ntwelve = 'x'\n", r"sexual_minors.numbers.'twelve': a number written in words"),
    ("[sexual\nstrong = []\n", r"cannot read the policy list"),
])
def test_a_malformed_list_of_ones_own_stops_start_up(tmp_path, body, message):
    path = tmp_path / "mine.toml"
    path.write_text(body)
    with pytest.raises(SafetyLoadError, match=message) as e:
        load(extra_lists=[str(path)])
    assert str(path) in str(e.value)


def test_a_combination_rule_naming_no_set_stops_start_up(monkeypatch):
    from safety.policy import lists

    real = lists._read

    def misspelt(path, where):
        data = real(path, where)
        if path.name == lists.MANIFEST:
            data["categories"]["hate"]["combine"] = [["grups", "attacks"]]
        return data

    monkeypatch.setattr(lists, "_read", misspelt)
    with pytest.raises(SafetyLoadError, match=r"categories.hate.combine: grups names no set or category"):
        load()


def test_no_context_excuses_a_minor_with_a_sexual_term(tmp_path):
    path = tmp_path / "mine.toml"
    # In any other category a benign context makes a contextual term innocent; not in this one.
    path.write_text('[sexual_minors]\ncontextual = ["zorblat"]\nbenign_context = ["beach"]\n')
    assert load(extra_lists=[str(path)]).judge("a zorblat at the beach").category == "sexual_minors"


def test_a_missing_list_of_ones_own_names_the_field(tmp_path):
    with pytest.raises(SafetyLoadError, match=r"safety.text.policy.extra_lists: .* is not a file"):
        load(extra_lists=[str(tmp_path / "absent.toml")])


def test_ones_own_list_adds_terms_and_marks_the_version(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('[violence]\nstrong = ["zorblat*"]\n[exempt]\nphrases = ["naked flame grill"]\n')
    base, mine = load(), load(extra_lists=[str(path)])
    assert mine.version.startswith(base.version + "+local.") and mine.version != base.version
    assert mine.judge("a zorblatted knight").category == "violence"
    assert not base.judge("a zorblatted knight").refused


def test_a_policy_that_raises_fails_the_prompt_closed():
    class Broken(PromptPolicy):
        def judge(self, prompt):
            raise RuntimeError("lists corrupted")

    policy = PromptPolicy.load(PolicyConfig())
    broken = Broken(policy.lexicon, PolicyConfig())
    guard = Guard(SafetyConfig.model_validate({"max_consecutive_errors": 2}), None, None, broken)
    for _ in range(2):
        with pytest.raises(CheckFailed, match="prompt policy raised RuntimeError: lists corrupted"):
            guard.screen_prompt("a lighthouse")
    assert guard.unhealthy() == "2 safety check failures in a row"
