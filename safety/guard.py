"""Rank 0's safety checks as one object: load and self-test, bounded calls, health.

Fail closed: a check that cannot load stops start-up (SafetyLoadError); a check that raises or
runs past `timeout_s` raises CheckFailed, which fails the task as retryable. Only an explicit config
key switches a check off, and that is logged here and reported in every heartbeat.
Runs of failures point at a broken device or model rather than at one task: `unhealthy()` says so,
and the worker exits for its supervisor to restart it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

import numpy as np

from safety import quality
from safety.config import SafetyConfig
from safety.image import build_image_check
from safety.policy.prompt_policy import PromptPolicy
from safety.text import build_text_check
from safety.verdicts import CheckFailed, SafetyLoadError, Verdict

log = logging.getLogger(__name__)

SELF_TEST_PROMPT = "a lighthouse on a cliff at dawn"


class Guard:
    def __init__(self, cfg: SafetyConfig, text_check, image_check, policy: PromptPolicy | None = None) -> None:
        self.cfg = cfg
        self.policy = policy  # the lists, before the text check; None only in tests of the others
        self.text_check = text_check  # None: switched off by config
        self.image_check = image_check
        self.warnings = cfg.disabled()
        self._errors = 0  # checks that raised or timed out, in a row
        self._corrupt = 0  # corrupt outputs, in a row
        self._lanes: dict[str, _Lane] = {}
        self._lock = threading.Lock()  # the serve loop and the post pool's threads share the guard

    @classmethod
    def load(cls, cfg: SafetyConfig) -> "Guard":
        t0 = time.perf_counter()
        guard = cls(cfg, build_text_check(cfg.text), build_image_check(cfg.image), PromptPolicy.load(cfg.text.policy))
        guard.self_test()
        for warning in guard.warnings:
            log.warning("SAFETY CHECK OFF: %s", warning)
        log.info("safety checks: %s (loaded and self-tested in %.1fs)", guard.describe(),
                 time.perf_counter() - t0)
        return guard

    def describe(self) -> str:
        q = self.cfg.quality
        auto_none = self.text_check is None and self.cfg.text.backend != "off"
        text = "none after the policy (auto)" if auto_none else _named(self.text_check)
        return ", ".join([
            f"prompt {self.policy.describe() if self.policy else 'policy OFF'}",
            f"text={text}",
            f"image={_named(self.image_check)}",
            f"quality={'min_std ' + str(q.min_std) if q.enabled else 'OFF'}",
        ])

    def self_test(self) -> None:
        """One call of each check on neutral input: a model that loads but cannot run (wrong
        processor, missing kernels, bad custom backend) must stop start-up, not fail every task."""
        grey = np.full((64, 64, 3), 128, np.uint8)
        try:
            self.screen_prompt(SELF_TEST_PROMPT)
            self.screen_image(grey)
        except CheckFailed as e:
            raise SafetyLoadError(f"safety self-test failed: {e}") from e

    # ------------------------------------------------------------ per task

    @property
    def policy_version(self) -> str | None:
        return self.policy.version if self.policy else None

    def screen_prompt(self, prompt: str) -> Verdict | None:
        """One prompt: its verdict, or None when both checks are off. Raises CheckFailed."""
        outcome = self.screen_prompts([prompt])[0]
        if isinstance(outcome, CheckFailed):
            raise outcome
        return outcome

    def screen_prompts(self, prompts: list[str]) -> list[Verdict | None | CheckFailed]:
        """Each prompt's outcome, in order: the policy lists, then the text check on those the lists
        pass, checked together (a burst costs one model call per `text.batch_size` distinct prompts,
        not one per prompt). The first refusal, the text check's pass (None when both are off), or
        the CheckFailed that fails the prompt as retryable. Every verdict names the policy's version."""
        outcomes: list[Verdict | None | CheckFailed] = [self._policy_outcome(p) for p in prompts]
        if self.text_check is None:
            return outcomes
        todo = {p: None for p, o in zip(prompts, outcomes) if o is None or (isinstance(o, Verdict) and not o.refused)}
        checked = self._checked(list(todo))
        return [checked[p] if p in checked else o for p, o in zip(prompts, outcomes)]

    def _checked(self, prompts: list[str]) -> dict[str, Verdict | CheckFailed]:
        """The text check's verdict on each distinct prompt, one bounded call per batch; a call that
        fails fails its batch's prompts."""
        out: dict[str, Verdict | CheckFailed] = {}
        size = self.cfg.text.batch_size
        for i in range(0, len(prompts), size):
            batch = prompts[i:i + size]
            try:
                verdicts = self._bounded("text", self.text_check.check, batch)
            except CheckFailed as e:
                out.update((p, e) for p in batch)
                continue
            version = self.policy.version if self.policy else None
            out.update((p, v.with_policy(version) if version else v) for p, v in zip(batch, verdicts))
        return out

    def _policy_outcome(self, prompt: str) -> Verdict | None | CheckFailed:
        try:
            return self._screen_policy(prompt)
        except CheckFailed as e:
            return e

    def _screen_policy(self, prompt: str) -> Verdict | None:
        """Inline: dictionary lookups and the learned layer, about a millisecond; 20-70 ms more for a
        prompt the encoder reads (about one in twenty of the labelled sets). An error fails closed."""
        if self.policy is None:
            return None
        try:
            verdict = self.policy.judge(prompt)
        except Exception as e:
            self._record(ok=False)
            raise CheckFailed(f"prompt policy raised {type(e).__name__}: {e}") from e
        return verdict

    def screen_image(self, pixels: np.ndarray) -> Verdict | None:
        """None when the image check is off. Raises CheckFailed."""
        return self.screen_images([pixels])[0]

    def screen_images(self, images: list[np.ndarray]) -> list[Verdict | None]:
        """One verdict per image, in one call of the check (None each when it is off). Raises
        CheckFailed."""
        if self.image_check is None:
            return [None] * len(images)
        return self._bounded("image", self.image_check.check, list(images))

    def inspect(self, pixels: np.ndarray, nonfinite: int) -> quality.Quality:
        q = self.cfg.quality
        if not q.enabled:
            return quality.Quality(True, None, float("nan"))
        verdict = quality.inspect(pixels, nonfinite, q.min_std)
        with self._lock:
            self._corrupt = 0 if verdict.ok else self._corrupt + 1
        return verdict

    def unhealthy(self) -> str | None:
        if self._corrupt >= self.cfg.quality.max_consecutive:
            return f"{self._corrupt} corrupt outputs in a row"
        if self._errors >= self.cfg.max_consecutive_errors:
            return f"{self._errors} safety check failures in a row"
        return None

    def _bounded(self, what: str, fn, items: list) -> list[Verdict]:
        """Runs one check on its lane's thread so that a hung model cannot hang rank 0 (or keep the
        process from exiting); a timed-out call is abandoned with its thread, not interrupted."""
        with self._lock:
            lane = self._lanes.get(what) or self._lanes.setdefault(what, _Lane(f"safety-{what}"))
        box, done = lane.submit(fn, items)
        if not done.wait(self.cfg.timeout_s):
            with self._lock:
                if self._lanes.get(what) is lane:
                    del self._lanes[what]  # the next call gets a fresh thread
            self._record(ok=False)
            raise CheckFailed(f"{what} check timed out after {self.cfg.timeout_s:.1f}s")
        if "error" in box:
            self._record(ok=False)
            err = box["error"]
            raise CheckFailed(f"{what} check raised {type(err).__name__}: {err}") from err
        value = box["value"]
        if not isinstance(value, list) or len(value) != len(items):
            self._record(ok=False)
            raise CheckFailed(f"{what} check returned {type(value).__name__}, not one verdict per input")
        self._record(ok=True)
        return value

    def _record(self, ok: bool) -> None:
        with self._lock:
            self._errors = 0 if ok else self._errors + 1


def _named(check) -> str:
    """A check's name, and where it runs and what it takes when it says (e.g. detoxify on a GPU)."""
    if check is None:
        return "OFF"
    placement = getattr(check, "placement", None)
    return f"{check.name} ({placement})" if placement else check.name


class _Lane:
    """One daemon thread running calls in turn. Kept, not spawned per call: thread start-up and
    per-thread library state (BLAS pools, sklearn's config) would add about a millisecond a call."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def submit(self, fn, arg) -> tuple[dict, threading.Event]:
        box, done = {}, threading.Event()
        self._calls.put((fn, arg, box, done))
        return box, done

    def _loop(self) -> None:
        while True:
            fn, arg, box, done = self._calls.get()
            try:
                box["value"] = fn(arg)
            except BaseException as e:  # reported to the caller, never swallowed
                box["error"] = e
            finally:
                done.set()
