"""Each way of disguising a word is undone, and plain words are left alone."""

from __future__ import annotations

import pytest

from safety.policy.normalize import split, squeeze, to_ascii, words

LEET = {"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a", "$": "s", "!": "i", "|": "l"}


def norm(text: str) -> list[str]:
    return words(to_ascii(text), LEET)


@pytest.mark.parametrize("written", [
    "NuDe",                       # case
    "ｎｕｄｅ",                    # fullwidth (NFKC)
    "𝐧𝐮𝐝𝐞",                       # mathematical bold (NFKC)
    "nu\u200bde",                 # zero-width space
    "nu\u00adde",                 # soft hyphen
    "n\u0336u\u0336d\u0336e\u0336",  # combining strike-through
    "nud\u0435",                  # Cyrillic е
    "n\u03c5de",                  # Greek upsilon looks like u
    "nüdé",                       # accents
    "nud3", "nu\u0064\u0435",
    "n u d e", "n.u.d.e", "n-u-d-e", "n_u_d_e",
    "nuuuuude",
])
def test_disguises_come_back_to_the_word(written):
    assert "nude" in norm(written)


def test_mojibake_is_repaired_and_scripts_transliterated():
    assert to_ascii("dÃ©capitÃ©") == "decapite"
    assert to_ascii("Straße") == "strasse"
    assert to_ascii("niño") == "nino"


def test_leetspeak_only_in_words_that_mix_letters_and_digits():
    assert norm("s3x p0rn") == ["sex", "porn"]
    assert norm("a 12 year old, 12yo, 4 steps, 1920s, 4k, 3d, 35mm") == [
        "a", "12", "year", "old", "12yo", "4", "steps", "1920s", "4k", "3d", "35mm"]


def test_a_one_reads_as_i_and_as_l():
    assert "kill" in norm("ki11")
    assert "himself" in norm("h1mself")


def test_a_spelled_out_word_after_the_article_is_read_both_ways():
    assert norm("a n u d e woman") == ["anude", "a", "nude", "woman"]
    assert norm("k i l l  a l l") == ["kill", "all", "a", "ll"]


def test_a_hidden_letter_is_kept_for_the_matcher():
    assert norm("p*rn and *nude*") == ["p*rn", "and", "nude"]


def test_which_words_were_disguised():
    ws = split(to_ascii("a s3xy nuuude woman"), LEET)
    assert ws.words == ["a", "sexy", "nude", "woman"]
    assert ws.disguised == {1, 2} and ws.elongated == {2}
    assert squeeze("kiiiill") == squeeze("kill") == "kil"


def test_plain_prompts_are_unchanged():
    text = "A cinematic photo of a lighthouse on a cliff at dawn, 35mm, 8k"
    ws = split(to_ascii(text), LEET)
    assert ws.words == ["a", "cinematic", "photo", "of", "a", "lighthouse", "on", "a", "cliff", "at", "dawn",
                        "35mm", "8k"]
    assert not ws.disguised and not ws.elongated


def test_other_scripts_stay_readable():
    # A Russian word is transliterated, not mapped letter by letter to Latin look-alikes (порно is
    # not "popno"); a look-alike inside a Latin word still is.
    assert norm("порно голая") == ["porno", "golaya"]
    assert norm("nudе") == ["nude"]  # a Cyrillic е
    # Devanagari keeps its vowel signs; the nukta joins its letter rather than breaking the word.
    assert norm("नग्न महिला") == ["ngn", "mhila"]
    assert len(norm("लड़की")) == 1
    # Arabic ع and the hamza are letters, not word breaks.
    assert len(norm("عارية")) == 1 and len(norm("أطفال")) == 1


def test_ideographs_kana_and_hangul_are_words_of_one_character_as_written():
    assert norm("裸体的女人") == ["裸", "体", "的", "女", "人"]
    assert norm("强奸") != norm("强健")  # the same in toneless pinyin
    assert norm("グロー") == ["グ", "ロ", "ー"] and norm("グロ") == ["グ", "ロ"]
    assert norm("nude girl, 水着, 8k") == ["nude", "girl", "水", "着", "8k"]


def test_a_single_letter_repeated_is_kept_as_typed():
    """KKK is a term and Brazilian "kkkk" is laughter: neither is squeezed."""
    assert norm("kkk rally") == ["kkk", "rally"] and norm("kkkk") == ["kkkk"]
    assert norm("k k k rally") == ["kkk", "rally"]


@pytest.mark.parametrize("spaced, plain", [
    ("ж.и.д.и", "жиди"),                  # Cyrillic: ж is "zh", no single letter once transliterated
    ("ا ل ش و ا ذ", "الشواذ"),            # Arabic: ش is "sh"
    ("मु.स.ल.मा.न", "मुसलमान"),            # Devanagari: a letter with its vowel sign
    ("х-а-ч", "хач"),
])
def test_spaced_letters_of_other_scripts_are_joined_and_count_as_disguised(spaced, plain):
    ws = split(to_ascii(f"poster {spaced} now"), LEET)
    assert ws.words == ["poster", *words(to_ascii(plain), LEET), "now"]
    assert ws.disguised == frozenset({1})


def test_words_of_other_scripts_as_written_are_left_alone():
    ws = split(to_ascii("на стене граффити, кот спит"), LEET)
    assert ws.words == words(to_ascii("на стене граффити кот спит"), LEET) and not ws.disguised
