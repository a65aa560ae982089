"""The policy's lists: the manifest and the language files shipped in safety/policy/lists/, plus any
files of the operator's own, read, checked and compiled into one lexicon.

A list file that does not follow the format stops start-up with an error naming the file and the
key; a list is never half-loaded.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from pathlib import Path

from safety.policy.normalize import native, squeeze, to_ascii, words
from safety.verdicts import SafetyLoadError

# The kinds of entry a category section may hold, and what they add to its score.
SCORING = ("strong", "contextual", "weak")
SETS = ("minors", "groups", "attacks", "praise", "body", "injury")  # the sets `combine` rules read
KINDS = SCORING + SETS + ("benign_context", "ages", "durations", "numbers")
MANIFEST = "policy.toml"
FORMS = "forms"  # forms/<code>.json: inflected form -> lemma, built by `make policy-forms`
# homographs/<code>.json: the language's common words that other lists' entries must not read, built
# by `make policy-forms` (release/policy_homographs.py)
HOMOGRAPHS = "homographs"
_DIGEST_LINE = re.compile(r"^digest\s*=.*$", re.MULTILINE)


@dataclass(frozen=True)
class Category:
    name: str
    label: str
    combine: tuple[tuple[str, ...], ...] = ()
    always: bool = False
    context_cancels: str = "weak"


@dataclass(frozen=True)
class Entry:
    """One list entry as matched: the words after normalisation, `stem` when the last one is a
    prefix (written with a trailing *)."""

    category: str
    kind: str
    words: tuple[str, ...]
    stem: bool = False
    lang: str | None = None  # the list it came from


@dataclass
class Lexicon:
    version: str
    digest: str
    categories: dict[str, Category]
    weights: dict[str, float]
    leet: dict[str, str]
    entries: list[Entry] = field(default_factory=list)
    ages: list[re.Pattern] = field(default_factory=list)
    # Spans of time written like an age ("ten years later", "il y a 10 ans"): a number read by one of
    # these is a duration, not an age, whatever age pattern also reads it.
    durations: list[re.Pattern] = field(default_factory=list)
    # Spelled-out numbers, read as digits before the age patterns: "twelve year old", "十二岁".
    numbers: dict[tuple[str, ...], int] = field(default_factory=dict)
    languages: tuple[str, ...] = ()
    forms: dict[str, dict[str, str]] = field(default_factory=dict)  # language -> a word's form -> its lemma
    # language -> its common words that another language's entries spell the same ("sulle", "chamar")
    homographs: dict[str, frozenset[str]] = field(default_factory=dict)

    def lemma(self, entry: Entry, forms: dict[str, str]) -> Entry:
        """The entry with each word replaced by its lemma in one language's table (a stem's last
        word kept as written)."""
        last = len(entry.words) - 1
        ws = tuple(w if (entry.stem and i == last) else forms.get(w, w) for i, w in enumerate(entry.words))
        return entry if ws == entry.words else replace(entry, words=ws)


def shipped_dir() -> Path:
    return Path(str(resources.files("safety.policy") / "lists"))


def digest(folder: Path) -> str:
    """The content digest of the lists, their forms, the learned layer's training prompts and the
    teacher's embeddings of them (the manifest's own digest line left out)."""
    h = hashlib.sha256()
    # The learned layer is built from the training prompts and the teacher's embeddings: they are
    # versioned, its build output is not.
    training = sorted((folder.parent / "training").glob("*.jsonl"))
    training += sorted((folder.parent / "training" / "teacher").glob("*.*"))
    built = sorted((folder / FORMS).glob("*.json")) + sorted((folder / HOMOGRAPHS).glob("*.json"))
    for path in sorted(folder.glob("*.toml")) + built + training:
        data = path.read_bytes()
        if path.name == MANIFEST:
            data = _DIGEST_LINE.sub("", data.decode("utf-8")).encode()
        h.update(path.name.encode() + b"\0" + data + b"\0")
    return "sha256:" + h.hexdigest()[:16]


def load(languages: tuple[str, ...], extra: tuple[str, ...] = ()) -> Lexicon:
    folder = shipped_dir()
    manifest = _read(folder / MANIFEST, "safety/policy/lists")
    lex = _lexicon(manifest, folder / MANIFEST)
    for code in languages:
        path = folder / f"{code}.toml"
        if not path.is_file():
            known = sorted(p.stem for p in folder.glob("*.toml") if p.name != MANIFEST)
            raise SafetyLoadError(f"safety.text.policy.languages: no list for {code!r} (shipped: {', '.join(known)})")
        _add(lex, _read(path, str(path)), str(path), code)
        _add_forms(lex, code, folder / FORMS / f"{code}.json")
        _add_homographs(lex, code, folder / HOMOGRAPHS / f"{code}.json")
    lex.languages = tuple(languages)
    if extra:
        h = hashlib.sha256()
        for name in extra:
            path = Path(name)
            if not path.is_file():
                raise SafetyLoadError(f"safety.text.policy.extra_lists: {name} is not a file")
            h.update(path.read_bytes())
            _add(lex, _read(path, name), name)
        # The operator's own lists change what is refused: the version says so.
        lex.version += "+local." + h.hexdigest()[:8]
    return lex


def _read(path: Path, where: str) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise SafetyLoadError(f"{where}: cannot read the policy list: {e}") from e


def _lexicon(manifest: dict, where: Path) -> Lexicon:
    try:
        cats = {name: Category(name, c["label"], tuple(tuple(x) for x in c.get("combine", ())),
                               bool(c.get("always", False)), c.get("context_cancels", "weak"))
                for name, c in manifest["categories"].items()}
        for c in cats.values():
            if c.context_cancels not in ("weak", "weak+combine", "all"):
                raise ValueError(f"categories.{c.name}.context_cancels: one of weak, weak+combine, all")
            # A part naming nothing would make its rule silently never refuse.
            unknown = [p for combo in c.combine for p in combo if p not in SCORING + SETS and p not in cats]
            if unknown:
                raise ValueError(f"categories.{c.name}.combine: {', '.join(unknown)} names no set or category")
        return Lexicon(version=manifest["version"], digest=manifest["digest"], categories=cats,
                       weights=dict(manifest["weights"]), leet=dict(manifest["leet"]))
    except (KeyError, TypeError, ValueError) as e:
        raise SafetyLoadError(f"{where}: malformed manifest ({type(e).__name__}: {e})") from e


def _add(lex: Lexicon, data: dict, where: str, lang: str | None = None) -> None:
    for section, body in data.items():
        if section == "language":
            continue
        if not isinstance(body, dict):
            raise SafetyLoadError(f"{where}: {section}: a table of lists is expected")
        if section == "exempt":
            _entries(lex, "exempt", "phrases", body, where, lang)
            continue
        if section not in lex.categories:
            # A new category comes with its manifest entry: a list alone would refuse nothing.
            raise SafetyLoadError(f"{where}: [{section}]: no such category (known: {', '.join(lex.categories)})")
        for kind in body:
            if kind in ("ages", "durations"):
                getattr(lex, kind).extend(_age_pattern(p, f"{where}: {section}.{kind}") for p in _strings(body, kind, where, section))
            elif kind == "numbers":
                _numbers(lex, body[kind], f"{where}: {section}.numbers")
            elif kind in KINDS:
                _entries(lex, section, kind, body, where, lang)
            else:
                raise SafetyLoadError(f"{where}: {section}.{kind}: unknown key (one of {', '.join(KINDS)})")


def _add_forms(lex: Lexicon, code: str, path: Path) -> None:
    """A language's inflected forms, where simplemma has a dictionary for it."""
    if not path.is_file():
        return
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(table, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in table.items()):
            raise ValueError("an object of form -> lemma strings is expected")
    except (OSError, ValueError) as e:
        raise SafetyLoadError(f"{path}: cannot read the inflected forms: {e}") from e
    lex.forms[code] = table


def _add_homographs(lex: Lexicon, code: str, path: Path) -> None:
    """A language's words that other languages' entries must not read, where wordfreq knows it."""
    if not path.is_file():
        return
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(found, list) or not all(isinstance(w, str) for w in found):
            raise ValueError("a list of words is expected")
    except (OSError, ValueError) as e:
        raise SafetyLoadError(f"{path}: cannot read the homographs: {e}") from e
    lex.homographs[code] = frozenset(found)


def _numbers(lex: Lexicon, table: object, where: str) -> None:
    if not isinstance(table, dict):
        raise SafetyLoadError(f"{where}: a table of spelled-out number = value is expected")
    for raw, value in table.items():
        ws = _entry_words(raw, tuple(sorted(lex.leet.items())))
        if not ws or isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 999:
            raise SafetyLoadError(f"{where}.{raw!r}: a number written in words and a value from 0 to 999 is expected")
        lex.numbers[ws] = value


def _strings(body: dict, kind: str, where: str, section: str) -> list[str]:
    value = body[kind]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise SafetyLoadError(f"{where}: {section}.{kind}: a list of non-empty strings is expected")
    return value


def _entries(lex: Lexicon, category: str, kind: str, body: dict, where: str, lang: str | None) -> None:
    for raw in _strings(body, kind, where, category):
        stem = raw.rstrip().endswith("*")
        ws = _entry_words(raw.rstrip().rstrip("*"), tuple(sorted(lex.leet.items())))
        if not ws or (stem and len(ws[-1]) < 3):
            raise SafetyLoadError(f"{where}: {category}.{kind}: entry #{body[kind].index(raw) + 1} "
                                  "normalises to nothing matchable (a stem needs 3 letters or more)")
        lex.entries.append(Entry(category, kind, ws, stem, lang))


@cache
def _entry_words(text: str, leet: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """An entry normalised as a prompt is, leetspeak included ("r34" is read as a prompt's "r34" is;
    kept for the process: each load of the lists reads the same ten thousand entries)."""
    return tuple(words(to_ascii(native(text, repair=False), prepared=True), dict(leet)))


def _age_pattern(pattern: str, where: str) -> re.Pattern:
    if pattern.count("{n}") != 1:
        raise SafetyLoadError(f"{where}: {pattern!r} needs exactly one {{n}} for the number")
    plain = " ".join(words(to_ascii(pattern.replace("{n}", " 0000 ")), {}))
    # Spaces optional: "12 yo", "12yo", "12-year-old" are all written.
    body = r" ?".join(re.escape(w) if w != "0000" else r"(\d{1,3})" for w in plain.split())
    return re.compile(r"(?<![a-z0-9])" + body + r"(?![a-z0-9])")


def squeezed(entry: Entry) -> str | None:
    """The squeezed form of a one-word entry, for elongated words (nuuuude)."""
    return squeeze(entry.words[0]) if len(entry.words) == 1 and not entry.stem else None
