"""Prompt text to the form the policy's lists are matched in.

Each step undoes one way of writing a word so that a keyword list misses it:

    mojibake and compatibility forms  ftfy, Unicode NFKC          ｎｕｄｅ, ð§ -> nude, §
    invisible marks                   regex \\p{Cf} \\p{Cc}         nu\\u200bde
    combining marks on Latin letters  regex \\p{M} after \\p{Latin}  n̶u̶d̶e̶ (other scripts keep theirs:
                                                                   Devanagari vowels, kana voicing)
    look-alike letters in a word      Unicode's confusables table  nudе with a Cyrillic е, Greek ν
      that has Latin letters                                       (a Russian word stays Russian)
    ideographs, kana, hangul          one word per character, kept 裸体 -> 裸 体 (no spaces to split on;
                                        as written                 read as pinyin, 强奸 and 强健 would meet)
    Arabic ع and hamza, Hindi nukta   letters, not word breaks     عارية -> earyh (as Arabizi's 3arya)
    letters of other scripts spaced   joined before they are       ж.и.д.и, ا ل ش و ا ذ, मु.स.ल.मा.न
                                        transliterated
    other scripts and accents         anyascii (transliteration)   décapité -> decapite, ß -> ss
    case                              str.lower
    leetspeak                         the lists' own table          n4k3d, p0rn, $ex
    letters spaced out                                             n u d e, n.u.d.e, n-u-d-e

Words are then the runs of letters and digits. A word with a letter repeated three times or more
(nuuuude) is also tried with every run squeezed to one letter, matched against terms squeezed
the same way. List entries go through the same steps, so lists are written in plain language.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from functools import cache

import ftfy
import regex
from anyascii import anyascii

_INVISIBLE = regex.compile(r"[\p{Cf}\p{Cc}]")
_LATIN_MARKS = regex.compile(r"(?<=[\p{Latin}\p{Common}]\p{M}*)\p{M}+")  # zalgo, strike-through on Latin text
# A word written with letters of more than one script: Latin letters with look-alikes among them.
_MIXED_WORD = regex.compile(r"\w*[a-zA-Z]\w*[^\W\p{Latin}\d_]\w*|\w*[^\W\p{Latin}\d_]\w*[a-zA-Z]\w*")
# Scripts written without spaces between words: each character is a word of its own, kept as it is
# (the comma is a word break that the spaced-letters rule below does not join across).
CJK = r"\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}\u30fc"
_EACH_CHAR = regex.compile(f"([{CJK}])")
# What anyascii would make a word break: Arabic ع (Arabizi writes 3, read as e) and the hamza
# carriers; the Devanagari nukta.
_LETTERS = str.maketrans({"ع": "e", "أ": "a", "إ": "i", "ؤ": "w", "ئ": "y", "ء": "", "\u093c": ""})
# Words, with `*` kept inside one where it stands for a hidden letter (p*rn); the matcher resolves it.
_WORD = regex.compile(f"[a-z0-9]+(?:\\*+[a-z0-9]+)*|[{CJK}]")
# A token that mixes letters with digits or symbols that stand for letters: the candidates for
# undoing leetspeak. All-digit tokens (ages, sizes, "4k") stay as they are.
_LEET_TOKEN = regex.compile(r"[a-z0-9@$!|+*€£]*[a-z][a-z0-9@$!|+*€£]*|[0-9@$!|+€£]+[a-z][a-z0-9@$!|+*€£]*")
# Three or more single letters separated by one kind of separator: n u d e, n.u.d.e, n-u-d-e.
_SPACED = regex.compile(r"(?<![a-z0-9])[a-z](?:([ ._\-*~/\\|]+)[a-z](?![a-z0-9]))(?:\1[a-z](?![a-z0-9])){1,}")
_REPEAT3 = regex.compile(r"([a-z])\1{2,}")
# The same, in a script that is neither Latin nor written without spaces: ж.и.д.и, ا ل ش و ا ذ,
# मु.स.ल.मा.न (a letter with its marks). Joined before transliteration, where one letter may become
# two (ж -> zh, ش -> sh) and the rule above no longer sees single letters; the joined word starts
# with `_JOINED`, which transliteration keeps, so that `split` still counts it as disguised.
_LETTER = f"(?:(?![\\p{{Latin}}{CJK}])\\p{{L}})\\p{{M}}*"
_NATIVE_SPACED = regex.compile(f"(?<![\\p{{L}}\\p{{M}}\\p{{N}}]){_LETTER}(?:([ ._\\-*~/\\\\|]+){_LETTER}(?![\\p{{L}}\\p{{M}}\\p{{N}}]))"
                               f"(?:\\1{_LETTER}(?![\\p{{L}}\\p{{M}}\\p{{N}}])){{1,}}")
_JOINED = "\x01"
_PLAIN = regex.compile(f"[a-z0-9]+|[{CJK}]")
# A number with a unit or suffix (4k, 3d, 35mm, 1920s, 12yo, 21st) is not leetspeak.
_QUANTITY = regex.compile(r"\d+(?:[a-z]{1,2}|mm|px|fps|yrs?)?")
_RUNS = regex.compile(r"([a-z])\1+")


def native(text: str, repair: bool = True) -> str:
    """The text repaired and stripped of what hides letters, still in its own script. `repair=False`
    leaves out ftfy's repairs of mojibake and markup (for the lists' own entries, written as UTF-8)."""
    if not repair:
        text = unicodedata.normalize("NFKC", text)
    elif text.isascii() and "&" not in text and "\x1b" not in text:
        return _INVISIBLE.sub("", text)  # nothing for ftfy or Unicode to repair (most prompts): 0.1 ms saved
    else:
        text = ftfy.fix_text(text, normalization="NFKC")
    text = _LATIN_MARKS.sub("", unicodedata.normalize("NFKD", _INVISIBLE.sub("", text)))
    return unicodedata.normalize("NFC", text)


def to_ascii(text: str, prepared: bool = False) -> str:
    """Steps up to and including case: the form age patterns and list entries are compared in.
    ASCII, but for ideographs, kana and hangul, each kept as a word of its own."""
    if not prepared:
        text = native(text)
    table = _confusables()
    text = _NATIVE_SPACED.sub(lambda m: _JOINED + regex.sub(r"[^\p{L}\p{M}]", "", m.group(0)), text)
    text = _MIXED_WORD.sub(lambda m: m.group(0).translate(table), text).translate(_LETTERS)
    parts = _EACH_CHAR.split(text)  # odd items are the characters kept
    return "".join(f",{p}," if i % 2 else anyascii(p) for i, p in enumerate(parts)).lower()


def squeeze(word: str) -> str:
    """Every run of one letter squeezed to a single letter: the form elongated words match in."""
    return _RUNS.sub(r"\1", word)


@dataclass(frozen=True)
class Words:
    """A prompt's words, and which of them were disguised: written in leetspeak, spaced out,
    elongated or with a hidden letter. A disguised word counts as strong evidence: nobody writes
    s3xy or n.u.d.e but to get past a filter."""

    words: list[str]
    disguised: frozenset[int] = frozenset()
    elongated: frozenset[int] = frozenset()


def words(text: str, leet: dict[str, str]) -> list[str]:
    """The words of an ASCII, lower-case text after leetspeak and spaced-out letters are undone."""
    return split(text, leet).words


def split(text: str, leet: dict[str, str]) -> Words:
    if _JOINED in text:  # letters to_ascii joined: not words as written
        joined = set(regex.findall(f"{_JOINED}([a-z0-9]+)", text))
        text = text.replace(_JOINED, "")
        plain = set(_PLAIN.findall(text)) - joined
    else:
        plain = set(_PLAIN.findall(text))
    text = _SPACED.sub(_join, text)
    text = _LEET_TOKEN.sub(lambda m: _unleet(m.group(0), leet), text)
    out, disguised, long = [], set(), set()
    for i, word in enumerate(_WORD.findall(text)):
        if _REPEAT3.search(word) and len(set(word)) > 1:  # "kkk" is a term and "kkkk" laughter: kept as typed
            long.add(i)
            word = _REPEAT3.sub(r"\1", word)  # nuuuude -> nude; kiiiill -> kill is left to squeeze()
        if word not in plain or i in long:
            disguised.add(i)
        out.append(word)
    return Words(out, frozenset(disguised), frozenset(long))


def _join(m: regex.Match) -> str:
    letters = regex.sub(r"[^a-z]", "", m.group(0))
    if letters[0] in "ai" and m.group(1).isspace():
        # "a n u d e": the first letter may be the article; both readings are kept, the joined one
        # first so that it still follows the word before ("k i l l  a l l").
        return f"{letters} {letters[0]} {letters[1:]}"
    return letters


def _unleet(token: str, leet: dict[str, str]) -> str:
    if token.isalpha() or _QUANTITY.fullmatch(token):
        return token
    plain = "".join(leet.get(ch, ch) for ch in token)
    if "1" in token:  # 1 stands for i (s1n) or l (ki11): both readings are kept
        return f"{plain} {''.join(leet.get(ch, ch) if ch != '1' else 'l' for ch in token)}"
    return plain


@cache
def _confusables() -> dict[int, str]:
    """Non-ASCII characters that look like one Latin letter, mapped to it (from the Unicode
    confusables table shipped by confusable_homoglyphs). Built once per process."""
    from confusable_homoglyphs.confusables import confusables_data

    table: dict[int, str] = {}
    for char, glyphs in confusables_data.items():
        if len(char) != 1 or char.isascii():
            continue
        latin = [g["c"] for g in glyphs if len(g["c"]) == 1 and g["c"].isascii() and g["c"].isalpha()]
        if latin:
            table[ord(char)] = min(latin, key=str.isupper).lower()  # a lower-case look-alike first
    return table
