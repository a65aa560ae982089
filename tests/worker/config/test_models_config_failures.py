"""A worker of several models: what cannot work is refused at start, naming the field."""

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
