"""The prompt policy: normalise, find the lists' terms, score each category, refuse at a threshold.

Matching is greedy longest-first over the prompt's words, so a longer entry wins over the words it
contains: "chicken breast" (exempt) hides "breast", "bloody corpse" counts once, not three times.
Each distinct entry found counts once. The lists are dictionary lookups on a few dozen words: 0.2
to 0.5 ms a prompt on one slow core, normalisation included; the learned layer adds about 0.2 ms,
and the encoder, asked only where the layer is unsure and nothing else refused, 10-60 ms. It runs
inline on the intake thread.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

import regex

from safety.config import PolicyConfig
from safety.policy import languages, lists
from safety.policy.learned import LearnedLayer, content
from safety.policy.lists import Entry, Lexicon
from safety.policy.normalize import CJK, Words, native, split, squeeze, to_ascii
from safety.verdicts import SafetyLoadError, Verdict

MINOR_AGE = 18
LEARNED_MIN_WORDS = 4
# Beside a weak listed term the model must be surer than its threshold: "a woman in lingerie" (0.5
# sexual) and "blood on the floor" (0.78 violence) pass, as one weak term alone does.
LEARNED_WITH_WEAK = 0.85
# Where the lists found only weak terms of a category, the encoder refuses it from here; not in sexual,
# where it reads lingerie and swimwear as sexual (_second_opinion). A weak term and the encoder's
# reading are two signs: from 0.7 rather than 0.85, over heldout-1 to heldout-19 violence rose
# 0.953 -> 0.957 and self-harm 0.955 -> 0.962, benign passed 0.960 -> 0.959.
ENCODER_WITH_WEAK = 0.7
ENCODER_OVER_WEAK = frozenset({"violence", "hate", "self_harm"})
# A short prompt (at most ENCODER_FEW_WORDS words, from ENCODER_MIN_WORDS) in which the lists found
# a term of any kind and nothing refused is read by the encoder whatever the layer leaned: the
# layer reads too little of it ("los discapacitados sobran", "avucumda bir sürü hap, sonsuz uyku"),
# and under LEARNED_MIN_WORDS it does not read it at all. With this rule and ENCODER_WITH_WEAK the
# band (safety.config) is 0.43, so that the encoder still reads under 5% of the ordinary prompts
# (4.9%; docs/safety.md, the encoder).
ENCODER_MIN_WORDS = 2
ENCODER_FEW_WORDS = 5
# Where the encoder is on, a refusal in these categories that rests on the learned layer alone (no
# listed term would refuse) stands only if the encoder, reading the whole sentence, does not call
# the prompt benign: at least ENCODER_VETO_BENIGN benign and under ENCODER_VETO_UNDER in the
# category. The table reads word pieces, not how they bear on each other: a weather map of Jakarta
# (self-harm 0.64), a LinkedIn banner, a boxing photo, breastfeeding posters read unsafe to it, and
# benign (0.9 and more) to the encoder. With that check behind it, the layer proposes from
# LEARNED_MARGIN under its thresholds. Chosen on heldout-1 to heldout-17, every prompt's layer and
# encoder probabilities read once (each category's recall there held or rose, benign passed 0.961
# -> 0.965; heldout-17's 0.913 -> 0.953). Not in sexual: the encoder read a child undressing
# "with a suggestive air" as benign (0.87), and sexual content with a minor is the rule that must
# hold.
ENCODER_CONFIRMS = frozenset({"violence", "hate", "self_harm"})
ENCODER_VETO_BENIGN = 0.7
ENCODER_VETO_UNDER = 0.2
LEARNED_MARGIN = 0.1
LEARNED = ("<learned>",)  # the term the learned layer adds
_PLAIN_WORDS = regex.compile(f"[a-z0-9]+|[{CJK}]")
# A word as written, where the lists' normalisation makes one word of it: a character of a script
# written without spaces, or a run of letters, marks and digits.
_WRITTEN_WORD = regex.compile(f"[{CJK}]|(?:(?![{CJK}_])\\w)+")
_ONE_CJK = regex.compile(f"[{CJK}]")
_DIGIT = re.compile(r"[0-9]")
# Object pronouns written onto a gerund, an infinitive or an imperative (as the lists read them:
# ASCII, accents gone): Spanish "follándoselo", "corriéndose"; Italian "scoparla", "toccandola".
_ENCLITICS = {
    "es": regex.compile(r"(?P<verb>[a-z]{2,}(?:ando|iendo|yendo|ar|er|ir))(?:(?:se|me|te|nos|os)(?:lo|la|los|las|le|les)?|lo|la|los|las|le|les)"),
    "it": regex.compile(r"(?P<verb>[a-z]{2,}(?:ando|endo|ar|er|ir))(?:(?:me|te|se|ce|ve|glie)(?:lo|la|li|le|ne)|mi|ti|si|ci|vi|gli|lo|la|li|le|ne)"),
}
# Words that join spelled tens and units ("treinta y cinco", "vingt et un", "vinte e cinco").
_NUMBER_JOINS = frozenset({"and", "et", "y", "e", "i", "und", "en", "och", "va", "dan", "ve", "wa", "w"})


@dataclass(frozen=True)
class Found:
    """What one prompt contained, by category and kind of entry; never the words themselves."""

    kinds: dict[str, dict[str, int]]


class _Index:
    """Entries by their word tuples, with the stems, plural and squeezed forms the lookup tries."""

    def __init__(self, entries: list[Entry]) -> None:
        self.exact: dict[tuple[str, ...], list[Entry]] = defaultdict(list)
        self.stems: dict[tuple[tuple[str, ...], str], list[Entry]] = defaultdict(list)
        self.stem_lengths: set[int] = set()
        self.prefixes: set[tuple[str, ...]] = set()  # word tuples some longer entry starts with
        self.squeezed: dict[str, list[Entry]] = defaultdict(list)
        self.by_length: dict[int, list[tuple[str, list[Entry]]]] = defaultdict(list)
        for e in entries:
            if e.stem:
                self.stems[(e.words[:-1], e.words[-1])].append(e)
                self.stem_lengths.add(len(e.words[-1]))
            else:
                self.exact[e.words].append(e)
            for n in range(1, len(e.words)):
                self.prefixes.add(e.words[:n])
            if (sq := lists.squeezed(e)) is not None:
                self.squeezed[sq].append(e)
        for key, found in self.exact.items():
            if len(key) == 1:
                self.by_length[len(key[0])].append((key[0], found))
        self.longest = max((len(e.words) for e in entries), default=1)

    def lookup(self, key: tuple[str, ...], elongated: bool = False) -> list[Entry]:
        """Every entry the words match: exactly, without a plural s, or by a stem; for one
        elongated or masked word, squeezed or by its visible letters."""
        last, head = key[-1], key[:-1]
        hits = list(self.exact.get(key, ()))
        if last.endswith("s"):
            hits += self.exact.get(head + (last[:-1],), ())
        for k in self.stem_lengths:
            if len(last) >= k:
                hits += self.stems.get((head, last[:k]), ())
        if not hits and len(key) == 1:
            if elongated:
                hits = list(self.squeezed.get(squeeze(last), ()))
            elif "*" in last:
                hits = self._wildcard(last)
        return hits

    def _wildcard(self, word: str) -> list[Entry]:
        """p*rn, f**k: a star hides one letter; the first entry of that shape is taken."""
        pattern = _masked(word)
        for term, found in self.by_length.get(len(word), ()):
            if pattern.fullmatch(term):
                return found
        for (head, stem), found in self.stems.items():
            if not head and len(word) >= len(stem) and _masked(word[:len(stem)]).fullmatch(stem):
                return found
        return []


def _masked(word: str) -> re.Pattern:
    return re.compile(re.escape(word).replace(r"\*", "[a-z]"))


class PromptPolicy:
    name = "policy"

    def __init__(self, lexicon: Lexicon, cfg: PolicyConfig) -> None:
        self.lexicon = lexicon
        self.version = lexicon.version
        # Exempt phrases are found first and hide their words from the terms: "white power bank".
        self._exempt = _Index([e for e in lexicon.entries if e.category == "exempt"])
        self._index = _Index([e for e in lexicon.entries if e.category != "exempt"])
        # A second reading in the prompt's language: every word as its lemma, against that language's
        # entries (and the operator's) lemmatised with the same table. A form means different words
        # in different languages (German "ass" is a form of "essen"), so only the language the
        # prompt is in is read, and only its own entries: French "pédé" is no form of Portuguese
        # "pedir", whose "peça" would meet it there.
        self._lemma_indices: dict[str, tuple[_Index, _Index]] = {}
        for code, forms in lexicon.forms.items():
            # An entry none of whose words is a lemma here matches in the first reading or not at all.
            touched = set(forms).union(forms.values())  # a word that is a form or a lemma here
            lemmas = [lexicon.lemma(e, forms) for e in lexicon.entries
                      if e.lang in (code, None) and not touched.isdisjoint(e.words)]
            self._lemma_indices[code] = (_Index([e for e in lemmas if e.category == "exempt"]),
                                         _Index([e for e in lemmas if e.category != "exempt"]))
        self._lemmas = {code: frozenset(forms.values()) for code, forms in lexicon.forms.items()}
        self._languages = languages.identifier(tuple(lexicon.languages)) if lexicon.forms else None
        self._learned = (LearnedLayer.load(lists.shipped_dir(), lexicon.digest, cfg.learned_threshold,
                                           encoder=cfg.encoder, band=cfg.encoder_band, threads=cfg.encoder_threads)
                         if cfg.learned else None)
        self._thresholds = _thresholds(lexicon, cfg)
        self._ages = regex.compile("|".join(f"(?:{p.pattern})" for p in lexicon.ages) or r"(?!)")
        self._durations = regex.compile("|".join(f"(?:{p.pattern})" for p in lexicon.durations) or r"(?!)")
        self._number_starts = {k[0] for k in lexicon.numbers}
        self._number_longest = max(map(len, lexicon.numbers), default=0)

    @classmethod
    def load(cls, cfg: PolicyConfig) -> "PromptPolicy":
        return cls(lists.load(cfg.languages, cfg.extra_lists), cfg)

    def describe(self) -> str:
        on = [c for c in self.lexicon.categories if c in self._thresholds]
        learned = f", learned layer {self._learned.version}" if self._learned else ", learned layer OFF"
        if self._learned and self._learned.encoder:
            learned += f" + encoder from {self._learned.band:g}"
        return f"policy {self.version} ({'/'.join(self.lexicon.languages)}: {', '.join(on)}{learned})"

    @property
    def encoder_asked(self) -> int:
        """Prompts the encoder has read since start (0 without one)."""
        return self._learned.encoder.asked if self._learned is not None and self._learned.encoder else 0

    def check(self, prompts: list[str]) -> list[Verdict]:
        return [self.judge(p) for p in prompts]

    def judge(self, prompt: str) -> Verdict:
        kinds, meant, lean, words = self._read(prompt)
        scores = self.scores(_found(kinds))
        over = {c: s for c, s in scores.items() if c in self._thresholds and s >= self._thresholds[c]}
        if meant is not None:
            proposed = [c for c in over if c in ENCODER_CONFIRMS and self._on_learned_alone(c, kinds)]
            few = self._learned.band < 1.0 and words <= ENCODER_FEW_WORDS and _listed(kinds)
            if proposed or (not over and (lean >= self._learned.band or few)):
                probs = self._learned.encoder.probabilities(meant)
                for c in proposed:
                    if probs.get("benign", 0.0) >= ENCODER_VETO_BENIGN and probs.get(c, 0.0) < ENCODER_VETO_UNDER:
                        del over[c]
                if not over:
                    over = self._second_opinion(probs, kinds, scores)
        if not over:
            return Verdict(False, self.name, scores, policy=self.version)
        worst = next(c for c in self.lexicon.categories if c in over)  # the manifest's order
        return Verdict(True, self.name, scores, worst, over[worst], policy=self.version,
                       label=self.lexicon.categories[worst].label)

    def find(self, prompt: str) -> Found:
        """What the lists and the learned layer find (the encoder is never asked here)."""
        return _found(self._read(prompt)[0])

    def _read(self, prompt: str) -> tuple[dict[str, dict[str, set[tuple]]], str | None, float, int]:
        """The terms found, by category and kind; the text the encoder would read (None without
        one, or under ENCODER_MIN_WORDS words); the layer's highest unsafe probability (0 where
        it did not read the prompt); and the number of words the layer and the encoder see."""
        text = to_ascii(native(prompt), prepared=True)
        ws = split(text, self.lexicon.leet)
        langs = self._languages.of(prompt) if self._languages else []
        readings = []
        for code in langs:
            forms = self.lexicon.forms.get(code)
            lemmas = [forms.get(w) or self._enclitic(code, w) or w for w in ws.words] if forms else ws.words
            if lemmas != ws.words:
                readings.append((code, lemmas))
        # A term counts once by the words it covers, read as lemmas in the prompt's language: two
        # entries for one word ("gore" in four lists), or two forms of one word ("asesinado",
        # "asesinada"), are one term; the same word twice is one term too.
        keys = readings[0][1] if readings else ws.words
        kinds: dict[str, dict[str, set[tuple]]] = defaultdict(lambda: defaultdict(set))
        # A common word of the prompt's language that another language's entry spells the same is
        # this language's word ("sulle", "khách", "góry"), unless that language is the prompt's too.
        homographs = (self.lexicon.homographs.get(langs[0], frozenset()), frozenset(langs)) if langs else None
        hidden = self._scan(ws, self._exempt, self._index, kinds, keys, homographs)
        for code, lemmas in readings:
            self._scan(Words(lemmas, ws.disguised, ws.elongated), *self._lemma_indices[code], kinds, keys)
        if self._minor_age(text):
            kinds["sexual_minors"]["minors"].add(("<age>",))
        meant, lean, visible = None, 0.0, ws.words
        if self._learned is not None:
            # The layer reads what the prompt shows, without its quality tags and generator settings.
            said = content(prompt)
            if said is not prompt:
                ws = split(to_ascii(native(said), prepared=True), self.lexicon.leet)
                hidden = self._hide(ws, self._exempt)
            visible = [w for i, w in enumerate(ws.words) if i not in hidden]
            # The meaning is read from the prompt as written, or, where an exempt phrase hid words,
            # from the words left: "head cut off by the frame" is framing.
            meant = _without(said, ws.words, hidden) if hidden else said
            lean = self._learn(visible, meant, kinds)
            if self._learned.encoder is None or len(visible) < ENCODER_MIN_WORDS:
                meant = None
        return kinds, meant, lean, len(visible)

    def _enclitic(self, code: str, word: str) -> str | None:
        """The lemma of a verb that carries its object pronouns ("follándoselo", "chupándosela",
        "scoparla"), where the verb without them is a form or lemma of the lists' words; None
        otherwise. The lemma tables know the verb, not every pronoun it can carry."""
        pattern = _ENCLITICS.get(code)
        m = pattern.fullmatch(word) if pattern is not None else None
        if m is None:
            return None
        verb = m.group("verb") + ("e" if code == "it" and m.group("verb").endswith(("ar", "er", "ir")) else "")
        forms = self.lexicon.forms[code]
        if verb in forms:
            return forms[verb]
        return verb if verb in self._lemmas[code] else None

    def _learn(self, words: list[str], text: str, kinds: dict[str, dict[str, set[tuple]]]) -> float:
        """The learned layer, for what the lists have no words for: a category in which the lists
        found no term gets one contextual term (strong, unless the category's benign context is
        there) when the model's probability reaches its threshold; one in which they found only
        weak terms gets one more weak term when the probability also reaches `LEARNED_WITH_WEAK`
        (so a weak term and a sure model together refuse, unless the benign context cancels weak
        terms); where they found a strong or contextual term, they decide. It reads the words no
        exempt phrase hid ("Al Gore" is not gore), and `text` for its meaning. Fewer than
        `LEARNED_MIN_WORDS` words tell it too little: a style word alone ("poster") leans on what
        the training prompts around it were.
        Beside a people the lists name, "hate" counts from the card's higher `hate_with_group`: a
        Muslim family at Eid is not an attack. With an encoder to confirm them (`judge`), the
        categories of ENCODER_CONFIRMS count from LEARNED_MARGIN under their thresholds. Returns
        the layer's highest unsafe probability (0 where it did not read the prompt)."""
        if len(words) < LEARNED_MIN_WORDS:
            return 0.0
        probs = self._learned.probabilities(words, text)
        limits = self._learned.thresholds
        margin = LEARNED_MARGIN if self._learned.encoder is not None else 0.0
        named = {"hate": "hate_with_group"} if kinds.get("hate", {}).get("groups") else {}
        over = {c for c, p in probs.items()
                if p >= limits.get(named.get(c, c), 2.0) - (margin if c in ENCODER_CONFIRMS else 0.0)}
        if kinds.get("sexual_minors", {}).get("minors") and probs.get("sexual", 0.0) >= limits.get("sexual_with_minor", 2.0):
            over.add("sexual")  # a minor is named: the minors rule comes first, as a weak listed term does
        for category in over:
            found = kinds.get(category, {})
            if not any(found.get(k) for k in lists.SCORING):
                kinds[category]["contextual"].add(LEARNED)
            elif not found.get("strong") and not found.get("contextual") and probs[category] >= LEARNED_WITH_WEAK:
                kinds[category]["weak"].add(LEARNED)
        return max((p for c, p in probs.items() if c != "benign"), default=0.0)

    def _on_learned_alone(self, category: str, kinds: dict[str, dict[str, set[tuple]]]) -> bool:
        """Whether `category` is refused only by the learned layer's term: without it, the lists'
        terms score under the threshold."""
        found = kinds.get(category, {})
        if not any(LEARNED in found.get(k, ()) for k in ("contextual", "weak")):
            return False
        without = {c: {k: v - {LEARNED} for k, v in ks.items()} for c, ks in kinds.items()}
        return self.scores(_found(without)).get(category, 0.0) < self._thresholds[category]

    def _second_opinion(self, probs: dict[str, float], kinds: dict[str, dict[str, set[tuple]]],
                        scores: dict[str, float]) -> dict[str, float]:
        """The encoder's reading (`probs`), where nothing refused the prompt and the learned layer
        leaned to a category (under its threshold, silenced by a benign-context word, or its refusal
        vetoed by the encoder), or a short prompt holds a listed term:
        each category whose probability reaches the encoder's threshold refuses, at that
        probability, whatever context the lists saw (it reads the whole sentence, which they
        cannot). Where they found only weak terms of the category, it must be surer
        (`ENCODER_WITH_WEAK`): "torture in a cellar, pulling out his nails" has one weak term, and
        the encoder 0.97. Except in sexual, where the
        lists' rule stands (one weak term passes, two refuse): the encoder reads "a woman in red
        lingerie on a bed" as sexual (0.98). Beside a people named, hate counts from the encoder's
        `hate_with_group`; beside a minor, sexual refuses as sexual content with a minor from the
        lower of its `sexual` and `sexual_with_minor`. The encoder's reading weighs as one strong
        term beside what the lists found (`scores`): a category whose configured threshold is above
        1.0 needs listed terms too."""
        limits = self._learned.encoder.thresholds
        named = {"hate": "hate_with_group"} if kinds.get("hate", {}).get("groups") else {}
        over = {c: p for c, p in probs.items() if c in self._thresholds and p >= limits.get(named.get(c, c), 2.0)
                and (not _weak_only(kinds.get(c, {})) or (c in ENCODER_OVER_WEAK and p >= ENCODER_WITH_WEAK))}
        if (kinds.get("sexual_minors", {}).get("minors") and "sexual_minors" in self._thresholds
                and probs.get("sexual", 0.0) >= min(limits.get("sexual_with_minor", 2.0), limits.get("sexual", 2.0))):
            over["sexual_minors"] = probs["sexual"]
        strong = self.lexicon.weights["strong"]
        return {c: p for c, p in over.items() if scores.get(c, 0.0) + strong >= self._thresholds[c]}

    def _scan(self, ws: Words, exempt: _Index, index: _Index, kinds: dict[str, dict[str, set[tuple]]],
              keys: list[str], homographs: tuple[frozenset[str], frozenset[str]] | None = None) -> set[int]:
        """Matches one reading of the prompt into `kinds`; returns the positions exempt phrases hid.
        `homographs`: the words of the prompt's language that only its languages' entries read, and
        those languages."""
        hidden = self._hide(ws, exempt)
        i = 0
        while i < len(ws.words):
            n, hits = self._longest(index, ws, i, hidden)
            if n == 1 and homographs is not None and ws.words[i] in homographs[0] and i not in ws.disguised:
                hits = [e for e in hits if e.lang is None or e.lang in homographs[1]]
            disguised = any(j in ws.disguised for j in range(i, i + n))
            for e in hits:
                # A disguised weak term is no accident: it counts as strong.
                kind = "strong" if disguised and e.kind in lists.SCORING else e.kind
                kinds[e.category][kind].add(tuple(keys[i:i + n]))
            i += max(n, 1)
        return hidden

    def _hide(self, ws: Words, exempt: _Index) -> set[int]:
        """The positions of the words exempt phrases cover."""
        hidden: set[int] = set()
        i = 0
        while i < len(ws.words):
            n, _ = self._longest(exempt, ws, i, hidden)
            hidden.update(range(i, i + n))
            i += max(n, 1)
        return hidden

    def scores(self, found: Found) -> dict[str, float]:
        w = self.lexicon.weights
        out = {}
        for name, cat in self.lexicon.categories.items():
            ks = found.kinds.get(name, {})
            quiet = ks.get("benign_context", 0) > 0 and not cat.always  # no context excuses minors
            score = 0.0 if quiet and cat.context_cancels == "all" else ks.get("strong", 0) * w["strong"]
            if not quiet:
                score += ks.get("contextual", 0) * w["strong"] + ks.get("weak", 0) * w["weak"]
            combos_quiet = quiet and cat.context_cancels in ("all", "weak+combine")
            for combo in () if combos_quiet else cat.combine:
                if all(self._present(found, name, part, quiet) for part in combo):
                    score += 1.0
            out[name] = round(score, 3)
        return out

    def _present(self, found: Found, category: str, part: str, quiet: bool) -> bool:
        if part in self.lexicon.categories:  # any term of another category, benign context or not
            ks = found.kinds.get(part, {})
            return any(ks.get(k, 0) for k in lists.SCORING)
        if quiet and part in lists.SCORING:  # the category's own terms, made innocent by context
            return False
        return found.kinds.get(category, {}).get(part, 0) > 0

    @staticmethod
    def _longest(index: _Index, ws: Words, i: int, hidden: set[int]) -> tuple[int, list[Entry]]:
        best: tuple[int, list[Entry]] = (0, [])
        for n in range(1, min(index.longest, len(ws.words) - i) + 1):
            if i + n - 1 in hidden:
                break
            key = tuple(ws.words[i:i + n])
            if hits := index.lookup(key, n == 1 and i in ws.elongated):
                best = (n, hits)
            if key not in index.prefixes:
                break
        return best

    def _digits(self, ws: list[str]) -> list[str]:
        """The words with each spelled-out number the lists know replaced by its digits, longest
        first: "dix sept ans" -> "17 ans". Tens then units are one number, a joining word between
        them or not: "twenty five", "treinta y cinco", "vingt et un" are 25, 35, 21, never 5 or 1."""
        numbers, out, i = self.lexicon.numbers, [], 0
        tens_at = -1  # where in `out` the last spelled tens (20, 30, ... 90) went
        while i < len(ws):
            value, n = None, 1
            if ws[i] in self._number_starts:
                for n in range(min(self._number_longest, len(ws) - i), 0, -1):
                    if (value := numbers.get(tuple(ws[i:i + n]))) is not None:
                        break
            if value is None:
                out.append(ws[i])
                if not (tens_at == len(out) - 2 and ws[i] in _NUMBER_JOINS):
                    tens_at = -1
            elif tens_at >= 0 and value < 10:
                del out[tens_at + 1:]
                out[tens_at] = str(int(out[tens_at]) + value)
                tens_at = -1
            else:
                out.append(str(value))
                tens_at = len(out) - 1 if value >= 20 and value % 10 == 0 and value < 100 else -1
            i += n
        return out

    def _minor_age(self, text: str) -> bool:
        plain_words = _PLAIN_WORDS.findall(text)
        if self._number_starts:
            plain_words = self._digits(plain_words)
        plain = " ".join(plain_words)
        if not _DIGIT.search(plain):  # every age pattern has its number in digits
            return False
        # One pass for every pattern, overlapping matches included: each has its one number group.
        young = [m.span(m.lastindex) for m in self._ages.finditer(plain, overlapped=True)
                 if int(m.group(m.lastindex)) < MINOR_AGE]
        if not young:
            return False
        # "ten years later": the number a duration reads is no one's age.
        spans = {m.span(m.lastindex) for m in self._durations.finditer(plain, overlapped=True)}
        return any(span not in spans for span in young)


def _found(kinds: dict[str, dict[str, set[tuple]]]) -> Found:
    return Found({c: {k: len(v) for k, v in ks.items()} for c, ks in kinds.items()})


def _without(text: str, normalised: list[str], hidden: set[int]) -> str:
    """`text` without the words at `hidden` (positions among the lists' `normalised` words), in its
    own script: the encoder reads Russian as Russian, not as "palach pytaet", and Chinese as
    characters, not "恐 怖 电 影". Where the words as written do not pair one to one with the
    normalised ones (letters spaced out, leetspeak across symbols), the words left as the lists
    read them."""
    written = _WRITTEN_WORD.findall(native(text))
    kept = [w for i, w in enumerate(written if len(written) == len(normalised) else normalised) if i not in hidden]
    out = []
    for w in kept:  # no space between two characters of a script written without spaces
        if out and not (_ONE_CJK.fullmatch(w) and _ONE_CJK.fullmatch(out[-1])):
            out.append(" ")
        out.append(w)
    return "".join(out)


def _listed(kinds: dict[str, dict[str, set[tuple]]]) -> bool:
    """Whether the lists found any term in the prompt, a benign context aside (a people, a body
    part, a weak term: what a short prompt's meaning turns on)."""
    return any(terms for ks in kinds.values() for kind, terms in ks.items() if kind != "benign_context")


def _weak_only(found: dict[str, set[tuple]]) -> bool:
    return bool(found.get("weak")) and not found.get("strong") and not found.get("contextual")


def _thresholds(lexicon: Lexicon, cfg: PolicyConfig) -> dict[str, float]:
    """The categories that refuse and at what score; `always` ones cannot be changed."""
    out = {}
    for name, cat in lexicon.categories.items():
        over = cfg.categories.get(name)
        if cat.always and over is not None and (not over.enabled or over.threshold != 1.0):
            raise SafetyLoadError(f"safety.text.policy.categories.{name}: {cat.label} is refused whatever "
                                  "the config says; remove this entry")
        if over is None or over.enabled:
            out[name] = over.threshold if over is not None else 1.0
    unknown = sorted(set(cfg.categories) - set(lexicon.categories))
    if unknown:
        raise SafetyLoadError(f"safety.text.policy.categories.{unknown[0]}: no such category "
                              f"(known: {', '.join(lexicon.categories)})")
    return out
