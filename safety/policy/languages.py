"""Which of the policy's languages a prompt is written in: py3langid (langid.py's model, shipped in
its wheel), limited to the languages whose lists are loaded. About 0.1 ms a prompt; the model loads
once per process, in about a second.

Image prompts are short and mix languages ("una ragazza nuda, 8k, cinematic"), so up to two
languages are read: the likeliest, and the next when it has at least `SECOND` of the probability.
"""

from __future__ import annotations

from functools import cache

SECOND = 0.2


@cache
def identifier(codes: tuple[str, ...]) -> "Identifier":
    """One per set of languages and process: it is read-only once narrowed."""
    return Identifier(codes)


class Identifier:
    def __init__(self, codes: tuple[str, ...]) -> None:
        from py3langid.langid import MODEL_DIR, MODEL_FILE, LanguageIdentifier

        # set_languages narrows the model's own tables, so each Identifier loads its own.
        self._model = LanguageIdentifier.from_modelpath(MODEL_DIR / MODEL_FILE, norm_probs=True)
        known = set(self._model.nb_classes)
        self.codes = tuple(c for c in codes if c in known)
        self._model.set_languages(list(self.codes))

    def of(self, text: str) -> list[str]:
        """The prompt's likeliest language, and the second when it is not far behind."""
        if not self.codes:
            return []
        ranked = self._model.rank(text)
        return [ranked[0][0]] + [c for c, p in ranked[1:2] if p >= SECOND]
