"""The prompt check, run on rank 0 before any GPU work.

Backends: detoxify (per-category thresholds, loadable fully offline), a guard model of the Llama
Guard kind (safety/guard_model.py: the policy's categories, several languages; needs its weights)
and alt-profanity-check (English profanity; ships its model in its wheel). `auto` is detoxify where
its checkpoint exists, else none: the policy's lists and learned layer alone.
Each takes a batch of prompts and returns one Verdict per prompt.
"""

from __future__ import annotations

import logging
from pathlib import Path

from safety.config import DetoxifyConfig, ProfanityConfig, TextCheckConfig
from safety.custom import build_custom, import_backend
from safety.device import on_stream, own_stream, resolve_device, weights_mb
from safety.verdicts import SafetyLoadError, Verdict

log = logging.getLogger(__name__)


class DetoxifyCheck:
    name = "detoxify"

    def __init__(self, cfg: DetoxifyConfig, device: str) -> None:
        from detoxify import Detoxify  # heavy import (transformers), only when configured

        try:
            self._model = Detoxify(model_type=cfg.model_type, checkpoint=cfg.checkpoint, device=device,
                                   huggingface_config_path=cfg.huggingface_config_path)
        except Exception as e:
            hint = ""
            if cfg.checkpoint and not cfg.huggingface_config_path:
                hint = (" (offline, set safety.text.detoxify.huggingface_config_path and make the "
                        "checkpoint name that directory: `dit-worker detoxify-offline`)")
            raise SafetyLoadError(f"safety.text.detoxify: cannot load detoxify {cfg.model_type!r} from "
                                  f"{cfg.checkpoint or 'the release URL'}: {type(e).__name__}: {e}{hint}") from e
        unknown = sorted(set(cfg.thresholds) - set(self._model.class_names))
        if unknown:
            # A threshold on a category the model does not score would silently never refuse.
            raise SafetyLoadError(f"safety.text.detoxify.thresholds: {', '.join(unknown)} not scored by "
                                  f"this model (it scores {', '.join(self._model.class_names)})")
        self._thresholds = dict(cfg.thresholds)
        self._stream = own_stream(device)
        # Reported at start (Guard.describe): on rank 0's GPU this is memory the model cannot use.
        self.placement = f"{cfg.model_type} on {device}, {weights_mb(self._model.model):.1f} MiB"

    def check(self, prompts: list[str]) -> list[Verdict]:
        with on_stream(self._stream):
            raw = self._model.predict(list(prompts))
        # detoxify squeezes a batch of one to bare floats.
        columns = {k: v if isinstance(v, list) else [v] for k, v in raw.items()}
        return [Verdict.judge(self.name, {k: float(v[i]) for k, v in columns.items()}, self._thresholds)
                for i in range(len(prompts))]


class ProfanityCheck:
    name = "alt-profanity-check"

    def __init__(self, cfg: ProfanityConfig) -> None:
        self._predict = import_backend("profanity_check", "safety.text.backend").predict_prob
        self._thresholds = {"profanity": cfg.threshold}

    def check(self, prompts: list[str]) -> list[Verdict]:
        if not prompts:
            return []  # predict_prob raises on an empty list
        probs = self._predict(list(prompts))
        return [Verdict.judge(self.name, {"profanity": float(p)}, self._thresholds) for p in probs]


def build_text_check(cfg: TextCheckConfig):
    """The configured prompt check, or None when switched off."""
    backend = cfg.backend
    if backend == "off":
        return None
    if backend == "auto":
        ckpt = cfg.detoxify.checkpoint
        if not (ckpt and Path(ckpt).is_file()):
            # The policy's lists and learned layer are the check: alt-profanity-check (English
            # profanity) added nothing to them on the labelled sets, at 8 ms a prompt.
            log.info("safety.text.backend = auto: the policy alone (lists and learned layer): %s",
                     f"no detoxify checkpoint at {ckpt}" if ckpt else "no detoxify checkpoint configured")
            return None
        backend = "detoxify"
        log.info("safety.text.backend = auto: using detoxify (checkpoint %s)", ckpt)
    if backend == "detoxify":
        return DetoxifyCheck(cfg.detoxify, resolve_device(cfg.device))
    if backend == "profanity":
        return ProfanityCheck(cfg.profanity)
    if backend == "guard-model":
        from safety.guard_model import GuardModelCheck  # transformers, only when configured

        return GuardModelCheck(cfg.guard_model, resolve_device(cfg.device))
    return build_custom(cfg.custom, "safety.text")


def make_offline_checkpoint(src: str | Path, hf_dir: str | Path, dst: str | Path) -> Path:
    """A released detoxify checkpoint names a Hub model (e.g. bert-base-uncased) that detoxify
    fetches even with huggingface_config_path set. This copy names the local directory instead."""
    import torch

    loaded = torch.load(src, map_location="cpu", weights_only=False)
    hf_dir = Path(hf_dir).resolve()
    if not (hf_dir / "config.json").is_file():
        raise FileNotFoundError(f"{hf_dir}/config.json: the model's Hugging Face config is needed here")
    loaded["config"]["arch"]["args"]["model_type"] = str(hf_dir)
    torch.save(loaded, dst)
    return Path(dst)
