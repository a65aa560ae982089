"""The [safety] section: on by default, off only by explicit keys, errors naming the field."""

from __future__ import annotations

import pytest

from safety.config import NUDENET_EXPLICIT, SafetyConfig
from worker.config import ConfigError, load_config
from tests.harness import write_config


def test_defaults_check_everything():
    cfg = SafetyConfig()
    assert (cfg.text.backend, cfg.image.backend, cfg.quality.enabled) == ("detoxify", "nudenet", True)
    assert cfg.image.nudenet.labels == NUDENET_EXPLICIT and cfg.disabled() == []


def test_a_section_left_out_keeps_its_check_on(tmp_path):
    cfg = load_config(write_config(tmp_path, "[safety.text]\nbackend = 'profanity'\n"))
    assert cfg.safety.image.backend == "nudenet" and cfg.safety.quality.enabled


def test_explicit_keys_switch_checks_off():
    cfg = SafetyConfig.model_validate({"text": {"backend": "off"}, "quality": {"enabled": False}})
    assert cfg.disabled() == ['safety.text.backend = "off": prompts are checked by the policy lists alone',
                              "safety.quality.enabled = false: corrupt outputs are not caught"]


@pytest.mark.parametrize("body, field", [
    ("[safety.text]\nbackend = 'none'\n", "safety.text.backend"),
    ("[safety.text.detoxify]\nthresholds = { toxicity = 1.5 }\n", "safety.text.detoxify: thresholds.toxicity"),
    ("[safety.text.detoxify]\nthresholds = {}\n", "safety.text.detoxify: thresholds: name at least one"),
    ("[safety.image]\nbackend = 'custom'\n", "safety: image.custom: backend 'custom' needs"),
    ("[safety.image.custom]\nfactory = 'no colon'\n", "safety.image.custom.factory"),
    ("[safety.image.hf]\nthreshold = -0.1\n", "safety.image.hf.threshold"),
    ("[safety]\ntimeout_s = 40.0\n", "safety.timeout_s + queue.report_deadline_s"),
    ("[safety.quality]\nmin_std = 'low'\n", "safety.quality.min_std"),
])
def test_errors_name_the_field(tmp_path, body, field):
    with pytest.raises(ConfigError) as e:
        load_config(write_config(tmp_path, body))
    assert field in str(e.value)


def test_quarantine_must_not_be_the_results_location(tmp_path):
    body = "[storage.local]\nroot = 'out'\n[storage.quarantine.local]\nroot = 'out'\n"
    with pytest.raises(ConfigError, match="storage: quarantine: must not be the results location"):
        load_config(write_config(tmp_path, body))
    cfg = load_config(write_config(tmp_path, "[storage.quarantine.local]\nroot = 'quarantine'\n"))
    assert cfg.storage.quarantine.local.root == "quarantine"
