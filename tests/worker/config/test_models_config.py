"""A worker of several models: [model] is loaded at start, each [models.<id>] can be loaded on a
swap, named by its key and on [model]'s device unless it says."""

from tests.harness import write_config
from worker.config import load_config

TWO = """
[model]
name = "flux"
device = "cpu"
dtype = "float32"
priority = 2.0

[models.pixart]
source = "models/tiny-pixart"
memory_mb = 300

[swap]
memory_budget_mb = 1000
"""


def test_each_model_is_named_by_its_key_on_the_device_of_model(tmp_path):
    cfg = load_config(write_config(tmp_path, TWO))
    assert list(cfg.catalog) == ["flux", "pixart"]
    pixart = cfg.catalog["pixart"]
    assert (pixart.name, pixart.device, pixart.memory_mb, pixart.priority) == ("pixart", "cpu", 300, 1.0)
    assert cfg.catalog["flux"].priority == 2.0 and cfg.swap.memory_budget_mb == 1000


def test_one_model_is_a_catalog_of_one(tmp_path):
    cfg = load_config(write_config(tmp_path, ""))
    assert list(cfg.catalog) == ["flux.1-schnell"] and cfg.swap.memory_budget_mb == 0


OWN = TWO + """
[models.pixart.limits]
max_side = 512
default_width = 512
default_height = 512

[models.pixart.warmup]
sizes = [[512, 512]]
"""


def test_a_model_may_have_its_own_limits_warmup_and_speed_else_the_workers(tmp_path):
    cfg = load_config(write_config(tmp_path, OWN))
    assert cfg.limits_of("pixart").max_side == 512 and cfg.limits_of("flux").max_side == cfg.limits.max_side
    assert cfg.warmup_of("pixart").sizes == ((512, 512),) and cfg.warmup_of("flux") == cfg.warmup
    assert cfg.speed_of("pixart") == cfg.speed  # none of its own
