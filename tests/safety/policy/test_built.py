"""The policy's built data: the inflected forms and the homographs (release/policy_forms.py,
release/policy_homographs.py, committed with the lists) and the learned layer (release/policy_train.py,
built at install). The forms and one language's homographs are rebuilt here and must equal what is
there; the learned layer's card must name the prompts, lists and code of the checkout, and a build
must give the same bytes in any process. It never saw a prompt of the measured sets."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from safety.config import PolicyConfig
from safety.policy import lists
from safety.policy.prompt_policy import PromptPolicy
from safety.policy.learned import CARD, TOKENIZER, WEIGHTS, LearnedLayer, teacher_key
from safety.verdicts import SafetyLoadError
from launch.local import REPO
from release import policy_forms, policy_homographs, policy_teacher, policy_train

SHIPPED = lists.shipped_dir()
MEASURED = Path(__file__).resolve().parents[1] / "data"


LANGUAGES = {p.stem for p in SHIPPED.glob("*.toml") if p.name != lists.MANIFEST}
FORMED = sorted(LANGUAGES & policy_forms.supported())  # the lists simplemma has a dictionary for


def test_every_list_that_simplemma_can_read_has_its_forms():
    assert sorted(p.stem for p in (SHIPPED / lists.FORMS).glob("*.json")) == FORMED


@pytest.mark.parametrize("code", FORMED)
def test_each_forms_file_was_built_from_this_list_simplemma_and_code(code):
    """forms/card.toml, written by `make policy-forms`, against the checkout: a list's words, the
    pinned simplemma, the code that shapes the bytes, and the file itself, unchanged since."""
    card = policy_forms.read_card(SHIPPED).get(code)
    assert card == policy_forms.built_from(SHIPPED, code), \
        f"stale: {code}; run `make policy-forms` and bump the policy's version"


# Rebuilt here: German (its nouns looked up capitalised too) and English (the longest list). Each
# language's rebuild reads simplemma's dictionary for it, 43 CPU-seconds for all fifteen on the
# 2-core machine; the card above holds the others to the bytes a rebuild gave.
REBUILT = ("de", "en")


@pytest.mark.parametrize("code", REBUILT)
def test_the_inflected_forms_are_rebuilt_byte_for_byte(tmp_path, code):
    """`make policy-forms` after a list changes gives these bytes and this card entry again."""
    for path in SHIPPED.glob("*.toml"):
        shutil.copy(path, tmp_path / path.name)
    policy_forms.build(tmp_path, [code])
    built = (tmp_path / lists.FORMS / f"{code}.json").read_bytes()
    assert built == (SHIPPED / lists.FORMS / f"{code}.json").read_bytes(), \
        f"stale: {code}; run `make policy-forms` and bump the policy's version"
    assert policy_forms.read_card(tmp_path) == {code: policy_forms.read_card(SHIPPED)[code]}


def test_a_forms_file_changed_by_hand_or_a_list_changed_is_stale(tmp_path):
    for path in SHIPPED.glob("*.toml"):
        shutil.copy(path, tmp_path / path.name)
    shutil.copytree(SHIPPED / lists.FORMS, tmp_path / lists.FORMS)
    assert policy_forms.read_card(tmp_path)["de"] == policy_forms.built_from(tmp_path, "de")
    forms = tmp_path / lists.FORMS / "de.json"
    forms.write_text(forms.read_text(encoding="utf-8").replace("{", '{\n"nackig": "nackt",', 1), encoding="utf-8")
    assert policy_forms.read_card(tmp_path)["de"]["forms"] != policy_forms.built_from(tmp_path, "de")["forms"]
    de = tmp_path / "de.toml"
    text = de.read_text(encoding="utf-8")
    assert "\n[exempt]\nphrases = [" in text
    de.write_text(text.replace("\n[exempt]\nphrases = [", '\n[exempt]\nphrases = ["Nacktschnecke im Garten", '), encoding="utf-8")
    assert policy_forms.read_card(tmp_path)["de"]["words"] != policy_forms.built_from(tmp_path, "de")["words"]


COUNTED = sorted(LANGUAGES & policy_homographs.supported())  # the lists wordfreq counts words of


def test_every_list_that_wordfreq_counts_has_its_homographs():
    assert sorted(p.stem for p in (SHIPPED / lists.HOMOGRAPHS).glob("*.json")) == COUNTED


@pytest.mark.parametrize("code", COUNTED)
def test_each_homographs_file_was_built_from_these_lists_wordfreq_and_code(code):
    """homographs/card.toml against the checkout: every list and forms file (another language's
    entry makes a homograph here), the pinned wordfreq, the code, the file, unchanged since."""
    assert policy_homographs.read_card(SHIPPED).get(code) == policy_homographs.built_from(SHIPPED, code), \
        f"stale: {code}; run `make policy-forms` and bump the policy's version"


def test_the_homographs_are_rebuilt_byte_for_byte(tmp_path):
    """Swedish reads a Polish stem's matches among its commonest words (någon, något) and an
    English entry (slut); a rebuild gives these bytes again. One language's rebuild reads its
    wordfreq list and the entries' languages' (a few seconds)."""
    for path in SHIPPED.glob("*.toml"):
        shutil.copy(path, tmp_path / path.name)
    shutil.copytree(SHIPPED / lists.FORMS, tmp_path / lists.FORMS)
    policy_homographs.build(tmp_path, ["sv"])
    built = (tmp_path / lists.HOMOGRAPHS / "sv.json").read_bytes()
    assert built == (SHIPPED / lists.HOMOGRAPHS / "sv.json").read_bytes(), \
        "stale: sv; run `make policy-forms` and bump the policy's version"
    assert {"nagot", "nagon", "slut"} <= set(json.loads(built))
    assert policy_homographs.read_card(tmp_path) == {"sv": policy_homographs.read_card(SHIPPED)["sv"]}


def test_a_list_changed_makes_every_homographs_file_stale(tmp_path):
    for path in SHIPPED.glob("*.toml"):
        shutil.copy(path, tmp_path / path.name)
    shutil.copytree(SHIPPED / lists.FORMS, tmp_path / lists.FORMS)
    shutil.copytree(SHIPPED / lists.HOMOGRAPHS, tmp_path / lists.HOMOGRAPHS)
    assert policy_homographs.read_card(tmp_path)["vi"] == policy_homographs.built_from(tmp_path, "vi")
    pl = tmp_path / "pl.toml"
    pl.write_text(pl.read_text(encoding="utf-8").replace('"nago*"', '"nagi*"', 1), encoding="utf-8")
    assert policy_homographs.read_card(tmp_path)["vi"] != policy_homographs.built_from(tmp_path, "vi")


def test_the_learned_layer_was_built_from_these_prompts_lists_and_code():
    """`make install` built it (`make policy-model`) from what the checkout holds now."""
    card = json.loads((SHIPPED / CARD).read_text())
    assert card["policy_digest"] == lists.load(("en",)).digest, "stale lists: `make policy-model`"
    assert card["trained_on"]["digest"] == policy_train.data_digest(), "stale prompts: `make policy-model`"
    assert card["trained_on"]["teacher"] == policy_train.teacher_digest(), "stale teacher: `make policy-model`"
    assert card["built_by"] == policy_train.code_digest(), "stale code: `make policy-model`"


@pytest.mark.integration
def test_a_build_gives_the_same_bytes_in_another_process(tmp_path):
    """What makes the digests above enough: the same prompts, lists and code give the same bytes,
    whatever the process (its hash seed included). On a fortieth of the prompts every step still runs
    (features, five folds, thresholds, the final fit); the whole build is the minute that
    `make install` spends once."""
    sample = tmp_path / "training"
    sample.mkdir()
    for path in sorted(policy_train.TRAINING.glob("*.jsonl")):
        kept = [line for n, line in enumerate(path.read_text(encoding="utf-8").splitlines()) if n % 40 == 0]
        (sample / path.name).write_text("\n".join(kept) + "\n", encoding="utf-8")
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir(), there.mkdir()
    policy_train.build(here, folder=sample)
    subprocess.run([sys.executable, "-m", "release.policy_train", "--out", str(there), "--training", str(sample)],
                   cwd=REPO, check=True, capture_output=True, timeout=300,
                   env={**os.environ, "PYTHONHASHSEED": "12345"})
    for name in (CARD, WEIGHTS, TOKENIZER):
        assert (here / name).read_bytes() == (there / name).read_bytes(), f"{name} is not reproducible"


def test_the_teacher_embedded_every_training_prompt_as_it_is_now():
    """`make policy-teacher` after any change to the training prompts: the teacher's card names the
    digest of each file of prompts it embedded, and each prompt has its embedding."""
    assert policy_teacher.stale() == [], "stale teacher embeddings: run `make policy-teacher`"
    rows = policy_train.read() + policy_train.read(policy_train.TRAINING / "held-back")
    assert policy_train.teacher_embeddings(rows).shape == (len(rows), policy_teacher.read_card()["dims"])


def test_a_pruned_tokenizer_cuts_its_prompts_as_the_whole_one_does():
    """Pruning keeps every piece the prompts are cut into, so they are cut the same way; the
    committed tokenizer (pruned from the teacher's 250,002 pieces) stands in for the whole one."""
    from tokenizers import Tokenizer

    from safety.policy.learned import PREFIX

    whole = json.loads((policy_train.TEACHER / policy_train.TEACHER_TOKENIZER).read_text(encoding="utf-8"))
    prompts = [r["prompt"] for r in policy_train.read()][::40]
    pruned = Tokenizer.from_str(json.dumps(policy_teacher.pruned_tokenizer(whole, prompts)))
    reference = Tokenizer.from_str(json.dumps(whole))
    assert pruned.get_vocab_size() < reference.get_vocab_size() / 3
    for p in prompts:
        assert pruned.encode(PREFIX + p, add_special_tokens=False).tokens == \
            reference.encode(PREFIX + p, add_special_tokens=False).tokens, p


def test_the_teachers_embeddings_keep_their_values_in_int8_through_their_file(tmp_path):
    rng = np.random.default_rng(0)
    e = rng.normal(size=(50, 384)).astype(np.float32)
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    q, scale = policy_train.quantise(e)
    assert q.dtype == np.int8 and np.abs(q.astype(np.float32) * scale[:, None] - e).max() <= scale.max() / 2 + 1e-7
    rows = [{"prompt": f"prompt {i}"} for i in range(len(e))]
    keys = np.array([teacher_key(r["prompt"]) for r in rows], dtype=np.int64)
    policy_teacher.write_embeddings(tmp_path, "x.jsonl", keys, q, scale)
    read = policy_train.teacher_embeddings(rows, tmp_path)
    assert np.array_equal(read, (q.astype(np.float32) * scale[:, None]).astype(np.float64))


def test_embeddings_go_in_parts_no_file_over_2_mb(tmp_path, monkeypatch):
    monkeypatch.setattr(policy_teacher, "PART_LINES", 20)
    rng = np.random.default_rng(1)
    q, scale = policy_train.quantise(rng.normal(size=(50, 384)).astype(np.float32))
    rows = [{"prompt": f"prompt {i}"} for i in range(50)]
    keys = np.array([teacher_key(r["prompt"]) for r in rows], dtype=np.int64)
    (tmp_path / "x.e5.jsonl").write_text("stale\n")  # a one-part file before: replaced by the parts
    policy_teacher.write_embeddings(tmp_path, "x.jsonl", keys, q, scale)
    assert [p.name for p in policy_teacher.embeddings_paths(tmp_path, "x.jsonl")] == \
        ["x.1.e5.jsonl", "x.2.e5.jsonl", "x.3.e5.jsonl"]
    assert np.array_equal(policy_train.teacher_embeddings(rows, tmp_path),
                          (q.astype(np.float32) * scale[:, None]).astype(np.float64))
    shipped = sorted(policy_train.TEACHER.glob("*"))
    assert shipped and all(p.stat().st_size < 2 * 2**20 for p in shipped), shipped


def test_a_changed_file_of_prompts_makes_its_embeddings_stale(tmp_path):
    training = tmp_path / "training"
    shutil.copytree(policy_train.TRAINING, training)
    assert policy_teacher.stale(training, training / "teacher") == []
    with (training / "written-1.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps({"cat": "benign", "lang": "en", "tags": [], "prompt": "a heron at dusk"}) + "\n")
    assert policy_teacher.stale(training, training / "teacher") == ["written-1.jsonl"]
    with pytest.raises(SystemExit, match="no teacher embedding for 1 training prompts .*make policy-teacher"):
        policy_train.teacher_embeddings(policy_train.read(training), training / "teacher")


def test_a_missing_or_stale_learned_layer_stops_start_up(tmp_path):
    digest = lists.load(("en",)).digest
    with pytest.raises(SafetyLoadError, match=r"safety.text.policy.learned: no learned layer in .*make policy-model"):
        LearnedLayer.load(tmp_path, digest)
    for name in (CARD, WEIGHTS, TOKENIZER):
        shutil.copy(SHIPPED / name, tmp_path / name)
    assert LearnedLayer.load(tmp_path, digest).version
    with pytest.raises(SafetyLoadError, match=r"built for the policy sha256:\w+, not sha256:0"):
        LearnedLayer.load(tmp_path, "sha256:0")


def test_no_measured_prompt_is_in_the_training_data():
    # The prompts held back from the build (training/held-back) too: they are kept to train on.
    rows = policy_train.read() + policy_train.read(policy_train.TRAINING / "held-back")
    trained = {r["prompt"].strip().lower() for r in rows}
    for path in sorted(MEASURED.rglob("*.jsonl")):
        measured = {json.loads(line)["prompt"].strip().lower() for line in path.read_text().splitlines() if line.strip()}
        assert not trained & measured, f"{path.name}: {len(trained & measured)} prompts also in the training data"


def test_the_training_data_covers_every_language_and_category():
    rows = policy_train.read()
    for lang in PolicyConfig().languages:
        for cat in ("benign", "sexual", "violence", "hate", "self_harm"):
            assert sum(1 for r in rows if r["lang"] == lang and r["cat"] == cat) >= 20, (lang, cat)


@pytest.fixture(scope="module")
def policy():
    return PromptPolicy.load(PolicyConfig())


def test_the_learned_layer_loads_and_scores(policy):
    layer = LearnedLayer.load(SHIPPED, policy.lexicon.digest)
    probs = layer.probabilities(["a", "lighthouse", "on", "a", "cliff", "at", "dawn"], "a lighthouse on a cliff at dawn")
    assert abs(sum(probs.values()) - 1) < 1e-5 and max(probs, key=probs.get) == "benign"
    assert "learned layer" in policy.describe()
    assert "learned layer OFF" in PromptPolicy.load(PolicyConfig(learned=False)).describe()


def test_the_meaning_table_reproduces_the_teacher_on_prompts_it_was_not_fitted_on():
    """The build reads each training prompt's meaning with a table fitted without its fold and
    records how near that lies to the teacher's embedding (mean cosine): a change that loses what
    the teacher says (fewer pieces, a broken fit) fails here, without the teacher installed."""
    card = json.loads((SHIPPED / CARD).read_text())
    assert card["table"]["out_of_fold_cosine"] >= 0.9, card["table"]
    assert card["table"]["pieces"] == json.loads((policy_train.TEACHER / "card.json").read_text())["tokenizer"]["pieces"]


@pytest.mark.parametrize("lang, frame", [("it", "una fotografia di {} sulla spiaggia, luce del tramonto"),
                                         ("pl", "zdjęcie {} na plaży o zachodzie słońca"),
                                         ("pt", "uma fotografia de {} na praia ao pôr do sol")])
def test_a_form_the_list_does_not_name_is_read_as_its_lemma(policy, lang, frame):
    """The lists name a word once; simplemma's forms read its other forms, in the prompt's language.
    Every form of a strong sexual word that the lists alone miss is refused with the forms."""
    forms = policy.lexicon.forms[lang]
    without = PromptPolicy.load(PolicyConfig(learned=False))
    without.lexicon.forms.clear()
    without._lemma_indices.clear()
    words = {forms.get(e.words[0], e.words[0]) for e in policy.lexicon.entries
             if e.lang == lang and e.category == "sexual" and e.kind == "strong" and len(e.words) == 1 and not e.stem}
    unseen = [f for f, lemma in forms.items() if lemma in words and not without.judge(frame.format(f)).refused]
    assert unseen, f"{lang}: no form of a strong word that the lists miss"
    caught = [f for f in unseen if policy.judge(frame.format(f)).refused]
    assert len(caught) / len(unseen) >= 0.9, sorted(set(unseen) - set(caught))[:20]


def test_a_form_of_another_language_is_not_read(policy):
    """German "ass" is a form of "essen" (and "die" of "der"): an English prompt is read with
    English forms only."""
    assert policy._languages.of("kiss my ass, cartoon, in the style of a comic strip") == ["en"]
    assert policy.lexicon.forms["de"].get("ass") == "essen"
