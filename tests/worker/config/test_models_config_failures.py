"""A worker of several models: what cannot work is refused at start, naming the field."""

import re

import pytest

from tests.harness import write_config
from tests.worker.config.test_models_config import TWO
from worker.config import ConfigError, load_config


@pytest.mark.parametrize("extra, message", [
    ('[models.flux]\nsource = "x"\n', "models.flux: is [model] already"),
    ('[models.other]\ndevice = "cuda"\n', "models.other.device: 'cuda', but [model] is on 'cpu'"),
    ('[models.other]\npriority = 0\n', "models.other.priority"),
])
def test_what_cannot_work_is_refused_naming_the_field(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(write_config(tmp_path, TWO + extra))



@pytest.mark.parametrize("overrides, message", [
    (["models.other.limits.max_side=512", "models.other.limits.default_width=512",
      "models.other.limits.default_height=512"], "models.other.warmup.sizes: 1360x768 is not a size the limits allow"),
    (["model.device=cuda", "model.dtype=bfloat16", "speed.fp8=true", "models.other.dtype=float32"],
     "speed.fp8: quantizes a bfloat16/float16 model; set models.other.dtype"),
    (["models.other.speed.fp8=true"], "models.other.speed.fp8: needs a CUDA device"),
])
def test_another_models_own_sections_are_checked_as_the_workers_are(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(write_config(tmp_path, TWO), ["models.other.source=x", *overrides])
