"""Each language's common words that another language's list spells the same: `make policy-forms`.

Prompts are matched as ASCII words (safety/policy/normalize.py), and every list is read in every
prompt, since prompts mix languages. So a common word of one language can be a list entry of
another once accents and scripts are folded away: Italian "sulle" (on the) is a Hindi slur written
in Latin letters, Portuguese "chamar" (to call) another, Polish "góry" (mountains) is English
"gory", Vietnamese "khách" (guest) is the Russian slur "хач" transliterated, Swedish "något"
(something) begins with the Polish stem "nago*" (naked), Spanish "el" is a Turkish hand.

For each language with a list, this writes safety/policy/lists/homographs/<code>.json: the words,
normalised as prompts are, that are common in that language (Zipf frequency of at least
`MIN_ZIPF` in wordfreq, once in a hundred thousand words or more), that a single-word entry or a
stem of another language's list reads as a category this language's own list does not read the
word (or the lemma it is a form of) as, and that are a word of this language more than of that one
(`MARGIN` higher on the Zipf scale: "sexy" in Swedish, "genocide" in French are the same word as
the English entry, and stay). Entries of the kinds that refuse or combine (`KINDS`) count; a
people's name does not. In a prompt whose likeliest language is this one, an entry of another
language does not match such a word, unless that language is also the prompt's
(safety/policy/prompt_policy.py).

wordfreq is used here only; the worker reads the files. Beside them, homographs/card.toml records
what they were built from (every list and forms file, wordfreq's version, this code and
normalize.py, each file's digest): tests/safety/policy/test_built.py fails when they disagree with the checkout, and
rebuilds one language byte for byte.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tomllib
from collections import defaultdict
from importlib.metadata import version
from pathlib import Path

from release.policy_forms import read_card_file, write_card_file
from release.policy_train import code_digest
from safety.policy import lists
from safety.policy.normalize import native, to_ascii, words

MIN_ZIPF = 4.0
MARGIN = 1.5
TOP = 40_000  # the most frequent words of a language read: past this they are under MIN_ZIPF
CARD = "card.toml"
SOURCES = ("release/policy_homographs.py", "safety/policy/normalize.py")
# Written without spaces between words: every character is a word of its own (normalize.CJK) and
# no Latin entry can meet one; wordfreq would also need a tokenizer (MeCab) to read them.
KINDS = lists.SCORING + ("attacks", "body", "injury", "minors")
UNSPACED = frozenset({"ja", "zh", "ko"})


def _fold(word: str) -> str | None:
    ws = words(to_ascii(native(word)), {})
    return ws[0] if len(ws) == 1 else None


def _list_files(folder: Path) -> dict[str, dict]:
    return {p.stem: tomllib.loads(p.read_text(encoding="utf-8"))
            for p in sorted(folder.glob("*.toml")) if p.name != lists.MANIFEST}


def _entries(data: dict) -> tuple[dict[str, dict[str, set[str]]], dict[str, set[str]]]:
    """A list's single-word entries of the kinds in `KINDS`: ASCII word -> category -> the native
    spellings that give it; and its stems: ASCII -> categories. Not a people's name: it is the same
    word in many languages ("arabic", "arabie"), which frequencies cannot tell from a homograph."""
    exact: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    stems: dict[str, set[str]] = defaultdict(set)
    for section, body in data.items():
        if section in ("language", "exempt") or not isinstance(body, dict):
            continue
        for kind, entries in body.items():
            if kind not in KINDS or not isinstance(entries, list):
                continue
            for raw in entries:
                stem = raw.rstrip().endswith("*")
                text = raw.rstrip().rstrip("*")
                if len(text.split()) != 1 or (a := _fold(text)) is None:
                    continue
                if stem:
                    stems[a].add(section)
                else:
                    exact[a][section].add(text.lower())
    return exact, stems


def _categories(word: str, exact: dict[str, dict[str, set[str]]], stems: dict[str, set[str]]) -> set[str]:
    """The categories a list's entries read `word` in."""
    out = set(exact.get(word, ()))
    for stem, categories in stems.items():
        if word.startswith(stem):
            out |= categories
    return out


def homographs(folder: Path, only: list[str] | None = None) -> dict[str, list[str]]:
    """code -> the sorted ASCII words of that language that other lists' entries must not read."""
    import wordfreq

    files = _list_files(folder)
    entries = {code: _entries(data) for code, data in files.items()}
    have = set(wordfreq.available_languages("small"))  # with UNSPACED: their entries' zipf is 0
    out: dict[str, list[str]] = {}
    for code in sorted(files):
        if code in UNSPACED or code not in have or (only and code not in only):
            continue
        exact, stems = entries[code]
        forms = _forms(folder, code)
        found: set[str] = set()
        for word in wordfreq.top_n_list(code, TOP):
            z = wordfreq.zipf_frequency(word, code)
            if z < MIN_ZIPF:
                break
            a = _fold(word)
            if a is None or a in found:
                continue
            # What this language's own list reads the word as, or the lemma it is a form of
            # ("assassinatos"): another list reading it so is no collision. Italian "gola" is a body
            # part there, and Ukrainian "гола*" (naked) reads it as sexual: that is one.
            own = _categories(a, exact, stems) | _categories(forms.get(a, a), exact, stems)
            theirs = [_zipf(wordfreq, {w for ws in exact_o.get(a, {}).values() for w in ws} | {a}, other, have)
                      for other, (exact_o, stems_o) in entries.items()
                      if other != code and _categories(a, exact_o, stems_o) - own]
            # A word of this language first, to every list that reads it otherwise: a cognate
            # ("tortura", "porno") is as much a word of theirs, and stays theirs to read.
            if theirs and z >= max(theirs) + MARGIN:
                found.add(a)
        out[code] = sorted(found)
    return out


def _forms(folder: Path, code: str) -> dict[str, str]:
    path = folder / lists.FORMS / f"{code}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _zipf(wordfreq, spellings: set[str], code: str, have: set[str]) -> float:
    """How common the entry is as a word of its own language (0 where wordfreq cannot say, and for
    the Latin spellings of a language without spaces: romaji is no word of its lists')."""
    if code not in have or code in UNSPACED:
        return 0.0
    return max(wordfreq.zipf_frequency(w, code) for w in spellings)


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()[:16]


def built_from(folder: Path, code: str) -> dict[str, str]:
    """What the homographs file of `code` in `folder` is built from, as the card records it: every
    list and forms file (another list's entry makes a homograph here), wordfreq, the code, the file."""
    h = hashlib.sha256()
    for path in sorted(folder.glob("*.toml")) + sorted((folder / lists.FORMS).glob("*.json")):
        if path.name != lists.MANIFEST:
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return {"lists": "sha256:" + h.hexdigest()[:16], "wordfreq": version("wordfreq"),
            "code": code_digest(SOURCES), "homographs": _sha((folder / lists.HOMOGRAPHS / f"{code}.json").read_bytes())}


def supported() -> set[str]:
    """The languages wordfreq counts words of, less those written without spaces."""
    import wordfreq

    return set(wordfreq.available_languages("small")) - UNSPACED


def read_card(folder: Path) -> dict[str, dict[str, str]]:
    return read_card_file(folder / lists.HOMOGRAPHS / CARD)


def build(folder: Path, only: list[str] | None = None) -> dict[str, int]:
    out_dir = folder / lists.HOMOGRAPHS
    out_dir.mkdir(exist_ok=True)
    card = read_card(folder)
    written = {}
    for code, found in homographs(folder, only).items():
        (out_dir / f"{code}.json").write_text(json.dumps(found, ensure_ascii=True, indent=0) + "\n", encoding="utf-8")
        card[code] = built_from(folder, code)
        written[code] = len(found)
    write_card_file(out_dir / CARD, card, "Written by `make policy-forms` (release/policy_homographs.py): "
                    "what each homographs file was built from.")
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lang", action="append", help="only these languages (default: every list wordfreq knows)")
    args = p.parse_args(argv)
    for code, n in build(lists.shipped_dir(), args.lang).items():
        print(f"{code}: {n} homographs")
    print("now bump `version` in safety/policy/lists/policy.toml and set its digest", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
