"""What a check says about one prompt or one image, and the errors of the checks themselves."""

from __future__ import annotations

from dataclasses import dataclass, field, replace


class SafetyLoadError(RuntimeError):
    """A check could not be loaded or failed its self-test: the worker must not become ready."""


class CheckFailed(RuntimeError):
    """A check raised or timed out on a task. The task fails as retryable: nothing passes unchecked."""


@dataclass(frozen=True)
class Verdict:
    """`refused` is True when some category's score reached its threshold; `category` and `score`
    then name the worst one (the highest score among those over their thresholds)."""

    refused: bool
    backend: str
    scores: dict[str, float] = field(default_factory=dict)
    category: str | None = None
    score: float | None = None
    policy: str | None = None  # the prompt policy's version, on every prompt verdict
    label: str | None = None  # the category in words, where the check has one

    def with_policy(self, version: str) -> "Verdict":
        return replace(self, policy=version)

    @classmethod
    def judge(cls, backend: str, scores: dict[str, float], thresholds: dict[str, float]) -> "Verdict":
        over = {k: s for k, s in scores.items() if k in thresholds and s >= thresholds[k]}
        if not over:
            return cls(False, backend, scores)
        worst = max(over, key=over.get)
        return cls(True, backend, scores, worst, over[worst])

    def describe(self) -> str:
        """Names the category, never the words that matched."""
        what = self.label or f"{self.category} scored {self.score:.3f}"
        by = self.category if self.label else self.backend  # the policy's category, or the classifier
        policy = f"; policy {self.policy}" if self.policy else ""
        return f"{what} ({by}{policy})"

    def details(self) -> dict:
        out = {"backend": self.backend, "category": self.category, "score": self.score,
               "scores": {k: round(v, 4) for k, v in self.scores.items()}}
        if self.policy:
            out["policy"] = self.policy
        return out
