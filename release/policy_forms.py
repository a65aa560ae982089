"""The inflected forms of the policy lists' words, from simplemma's dictionaries: `make policy-forms`.

A list names a word once ("nudo", "голый", "çıplak"); people write it in any of its forms ("nude",
"голую", "çıplaklar"). simplemma maps every form of a language to its lemma (dictionaries for 54
languages built from Wiktionary and other open data). For each language with a list and a simplemma
dictionary, this writes safety/policy/lists/forms/<code>.json: every form whose lemma is the lemma
of a word in that language's list, mapped to that lemma, both normalised as prompts are. The
policy matches a prompt twice: as written, and with each word replaced by its lemma, against
entries lemmatised the same way (safety/policy/prompt_policy.py).

Only the forms of the lists' own words are kept (kilobytes, against 1.2 GB and 20 s to load the
full dictionaries), so the worker needs neither simplemma nor its load time. The files are
rebuilt from the lists and the pinned simplemma: the same bytes each time. Beside them,
forms/card.toml records what each was built from (the list's words, simplemma's version, this
code and normalize.py, and the file's own digest): tests/safety/policy/test_built.py fails when a
file and its card disagree with the checkout, and rebuilds two languages byte for byte.
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

import regex

from release.policy_train import code_digest
from safety.policy import lists
from safety.policy.normalize import native, to_ascii, words

_NATIVE_WORD = regex.compile(r"[\p{L}\p{M}]+")
MAX_FORMS = 200  # a lemma with more forms than this is a function word or an error: left out
MIN_LEMMA = 4  # shorter lemmas are function words ("der" for das, dem, des): reading them only confuses
CARD = "card.toml"  # in forms/; not a .json, so neither the lists' digest nor the loader reads it
# The code that shapes a forms file's bytes, beside the list and simplemma.
SOURCES = ("release/policy_forms.py", "safety/policy/normalize.py")


def list_words(data: dict) -> set[str]:
    """The native words of every entry of a list file, stems (trailing *) left out."""
    out: set[str] = set()
    for section, body in data.items():
        if not isinstance(body, dict):
            continue
        for kind, entries in body.items():
            if kind in ("ages", "durations") or not isinstance(entries, list):  # patterns, not words
                continue
            for raw in entries:
                if raw.rstrip().endswith("*"):
                    continue
                out.update(w.lower() for w in _NATIVE_WORD.findall(native(raw)))
    return out


def ascii_word(word: str) -> str | None:
    ws = words(to_ascii(word), {})
    return ws[0] if len(ws) == 1 else None


def forms_for(code: str, vocabulary: set[str]) -> dict[str, str]:
    """ascii form -> ascii lemma, for the lemmas of `vocabulary` in language `code`."""
    from simplemma.strategies.dictionaries import DefaultDictionaryFactory

    table = DefaultDictionaryFactory(cache_max_size=1).get_dictionary(code)
    wanted = {table.get(w, w).lower() for w in vocabulary} | {
        table.get(w.capitalize(), w).lower() for w in vocabulary}  # German nouns are capitalised
    by_lemma: dict[str, set[str]] = defaultdict(set)  # the forms of the wanted lemmas only
    for form, lemma in table.items():
        if (lemma := lemma.lower()) in wanted:
            by_lemma[lemma].add(form.lower())
    out: dict[str, str] = {}
    for lemma in sorted(wanted):
        forms = by_lemma.get(lemma, set())
        base = ascii_word(lemma)
        if not forms or len(forms) > MAX_FORMS or base is None or len(base) < MIN_LEMMA:
            continue
        for form in sorted(forms | {lemma}):
            a = ascii_word(form)
            if a is not None and a != base and len(a) >= 3:
                out.setdefault(a, base)  # the first lemma in sorted order wins a shared form
    return dict(sorted(out.items()))


def supported() -> set[str]:
    import simplemma

    data = Path(simplemma.__file__).parent / "strategies" / "dictionaries" / "data"
    return {p.name.split(".")[0] for p in data.iterdir()}


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()[:16]


def built_from(folder: Path, code: str) -> dict[str, str]:
    """What the forms file of `code` in `folder` is built from, and its own digest, as the card
    records them."""
    vocabulary = list_words(tomllib.loads((folder / f"{code}.toml").read_text(encoding="utf-8")))
    return {"words": _sha("\n".join(sorted(vocabulary)).encode()), "simplemma": version("simplemma"),
            "code": code_digest(SOURCES), "forms": _sha((folder / lists.FORMS / f"{code}.json").read_bytes())}


def read_card(folder: Path) -> dict[str, dict[str, str]]:
    return read_card_file(folder / lists.FORMS / CARD)


def read_card_file(path: Path) -> dict[str, dict[str, str]]:
    return tomllib.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def write_card_file(path: Path, card: dict[str, dict[str, str]], header: str) -> None:
    """A card: a table per language of what its file was built from, under a comment line."""
    lines = [f"# {header}"]
    for code in sorted(card):
        lines += ["", f"[{code}]", *(f'{k} = "{v}"' for k, v in sorted(card[code].items()))]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def build(folder: Path, only: list[str] | None = None) -> dict[str, int]:
    out_dir = folder / lists.FORMS
    out_dir.mkdir(exist_ok=True)
    have = supported()
    written, card = {}, read_card(folder)
    for path in sorted(folder.glob("*.toml")):
        code = path.stem
        if path.name == lists.MANIFEST or code not in have or (only and code not in only):
            continue
        forms = forms_for(code, list_words(tomllib.loads(path.read_text(encoding="utf-8"))))
        text = json.dumps(forms, ensure_ascii=True, indent=0, sort_keys=True) + "\n"
        (out_dir / f"{code}.json").write_text(text, encoding="utf-8")
        card[code] = built_from(folder, code)
        written[code] = len(forms)
    write_card_file(folder / lists.FORMS / CARD, card,
                    "Written by `make policy-forms` (release/policy_forms.py): what each forms file was built from.")
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lang", action="append", help="only these languages (default: every list simplemma knows)")
    args = p.parse_args(argv)
    for code, n in build(lists.shipped_dir(), args.lang).items():
        print(f"{code}: {n} forms")
    print("now bump `version` in safety/policy/lists/policy.toml and set its digest", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
