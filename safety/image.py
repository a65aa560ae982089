"""The image check, run on rank 0 after generation and before anything is stored.

Backends: NudeNet's detector (its ONNX model ships in its wheel: works offline out of the box) and a
Hugging Face image-classification model (e.g. a ViT NSFW classifier) from a Hub id or a local
directory, run in batches. Images come in as HxWx3 uint8 RGB arrays; one Verdict per image.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from safety.config import HFClassifierConfig, ImageCheckConfig, NudeNetConfig
from safety.custom import build_custom, import_backend
from safety.device import on_stream, own_stream, resolve_device, weights_mb
from safety.verdicts import SafetyLoadError, Verdict

log = logging.getLogger(__name__)


def _quiet_session(model_path: str, threads: int):
    """The detector's model in a session of `threads` threads that do not spin while idle (NudeNet
    builds its session with onnxruntime's defaults and takes no options)."""
    import onnxruntime  # installed with nudenet

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(model_path, sess_options=options, providers=["CPUExecutionProvider"])


class NudeNetCheck:
    name = "nudenet"

    def __init__(self, cfg: NudeNetConfig) -> None:
        nudenet = import_backend("nudenet", "safety.image.backend")
        known = set(getattr(nudenet.nudenet, "__labels"))
        unknown = sorted(set(cfg.labels) - known)
        if unknown:  # a misspelt label would never flag anything
            raise SafetyLoadError(f"safety.image.nudenet.labels: {', '.join(unknown)} are not NudeNet "
                                  f"labels (it detects {', '.join(sorted(known))})")
        try:
            self._detector = nudenet.NudeDetector(model_path=cfg.model_path)
            self._detector.onnx_session = _quiet_session(
                cfg.model_path or str(Path(nudenet.nudenet.__file__).with_name("320n.onnx")), cfg.threads)
        except Exception as e:
            raise SafetyLoadError(f"safety.image.nudenet: cannot load the detector: {e}") from e
        self._thresholds = {label: cfg.threshold for label in cfg.labels}

    def check(self, images: list[np.ndarray]) -> list[Verdict]:
        return [self._one(img) for img in images]

    def _one(self, rgb: np.ndarray) -> Verdict:
        # NudeNet reads arrays as OpenCV does, in BGR order; RGB would shift its scores.
        found = self._detector.detect(np.ascontiguousarray(rgb[..., ::-1]))
        scores = {label: 0.0 for label in self._thresholds}
        for det in found:
            if det["class"] in scores:
                scores[det["class"]] = max(scores[det["class"]], float(det["score"]))
        return Verdict.judge(self.name, scores, self._thresholds)


class HFImageCheck:
    name = "hf"

    def __init__(self, cfg: HFClassifierConfig, device: str) -> None:
        import torch
        from transformers import AutoImageProcessor, AutoModelForImageClassification

        try:
            self._processor = AutoImageProcessor.from_pretrained(cfg.model, revision=cfg.revision)
            model = AutoModelForImageClassification.from_pretrained(
                cfg.model, revision=cfg.revision, dtype=getattr(torch, cfg.dtype))
        except Exception as e:
            raise SafetyLoadError(f"safety.image.hf.model: cannot load {cfg.model!r}: "
                                  f"{type(e).__name__}: {e}") from e
        self._model = model.to(device).eval()
        self._stream = own_stream(device)
        labels = [model.config.id2label[i] for i in range(len(model.config.id2label))]
        unknown = sorted(set(cfg.flag_labels) - set(labels))
        if unknown:
            raise SafetyLoadError(f"safety.image.hf.flag_labels: {', '.join(unknown)} not among the "
                                  f"model's labels ({', '.join(labels)})")
        self._labels = labels
        self._multi_label = model.config.problem_type == "multi_label_classification"
        self._thresholds = {label: cfg.threshold for label in cfg.flag_labels}
        self._batch = cfg.batch_size
        self.name = f"hf:{cfg.model}"
        self.placement = f"on {device}, {weights_mb(self._model):.1f} MiB"

    def check(self, images: list[np.ndarray]) -> list[Verdict]:
        out = []
        for i in range(0, len(images), self._batch):
            out.extend(self._batch_scores(images[i:i + self._batch]))
        return out

    def _batch_scores(self, images: list[np.ndarray]) -> list[Verdict]:
        import torch

        inputs = self._processor(images=list(images), return_tensors="pt")
        with torch.inference_mode(), on_stream(self._stream):
            pixels = inputs["pixel_values"].to(self._model.device, self._model.dtype)
            logits = self._model(pixel_values=pixels).logits.float()
            probs = (logits.sigmoid() if self._multi_label else logits.softmax(-1)).cpu()
        return [Verdict.judge(self.name, {lab: float(p[j]) for j, lab in enumerate(self._labels)},
                              self._thresholds) for p in probs]


def build_image_check(cfg: ImageCheckConfig):
    """The configured image check, or None when switched off."""
    if cfg.backend == "off":
        return None
    if cfg.backend == "nudenet":
        return NudeNetCheck(cfg.nudenet)
    if cfg.backend == "hf":
        return HFImageCheck(cfg.hf, resolve_device(cfg.device))
    return build_custom(cfg.custom, "safety.image")
