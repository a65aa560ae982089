import pytest

from launch.local import REPO
from tests.harness import write_config
from worker.config import ConfigError, load_config


@pytest.mark.parametrize("name", ["tiny.toml", "flux-schnell.toml", "flux-schnell-gcs.toml", "flux-models.toml"])
def test_shipped_configs_load(name):
    cfg = load_config(REPO / "configs" / name)
    assert cfg.limits.default_steps == 4


def test_production_config_matches_the_model_card():
    cfg = load_config(REPO / "configs" / "flux-schnell.toml")
    assert cfg.model.source == "black-forest-labs/FLUX.1-schnell" and cfg.model.dtype == "bfloat16"
    assert (cfg.limits.default_width, cfg.limits.default_height) == (1360, 768)
    assert cfg.model.guidance_scale == 0.0 and cfg.model.max_sequence_length == 256
    assert cfg.distributed.serve_timeout_s == 120.0 and cfg.queue.heartbeat_interval_s == 30.0


def test_defaults_from_an_empty_file(tmp_path):
    cfg = load_config(write_config(tmp_path, ""))
    assert cfg.model.name == "flux.1-schnell" and cfg.storage.kind == "local"


def test_unknown_key_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"queue\.lease_wiat_s: unknown key"):
        load_config(write_config(tmp_path, "[queue]\nlease_wiat_s = 3\n"))


def test_unknown_section_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"modle: unknown key"):
        load_config(write_config(tmp_path, "[modle]\nsource = 'x'\n"))


def test_mistyped_value_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"queue\.max_tasks: Input should be a valid integer"):
        load_config(write_config(tmp_path, "[queue]\nmax_tasks = '4'\n"))


def test_bad_choice_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.dtype"):
        load_config(write_config(tmp_path, "[model]\ndtype = 'fp8'\n"))


def test_all_errors_are_reported_together(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(write_config(tmp_path, "[queue]\nmax_tasks = 0\n[model]\nsteps = 4\n"))
    assert "queue.max_tasks" in str(e.value) and "model.steps: unknown key" in str(e.value)


def test_sizes_must_be_multiples_of_16(tmp_path):
    with pytest.raises(ConfigError, match="default_width must be a multiple of 16"):
        load_config(write_config(tmp_path, "[limits]\ndefault_width = 1000\n"))


def test_followers_must_not_time_out_while_rank0_waits(tmp_path):
    with pytest.raises(ConfigError, match="serve_timeout_s"):
        load_config(write_config(tmp_path, "[queue]\nlease_wait_s = 60\n"))


def test_overrides(tmp_path):
    cfg = load_config(write_config(tmp_path, ""), ["queue.url=http://q:1", "queue.max_tasks=4",
                                            "warmup.sizes=[[512, 512]]"])
    assert cfg.queue.url == "http://q:1" and cfg.queue.max_tasks == 4 and cfg.warmup.sizes == ((512, 512),)


def test_bad_override_is_named(tmp_path):
    with pytest.raises(ConfigError, match="expected section.key=value"):
        load_config(write_config(tmp_path, ""), ["queue.url"])
    with pytest.raises(ConfigError, match=r"queue\.nope: unknown key"):
        load_config(write_config(tmp_path, ""), ["queue.nope=1"])


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write_config(tmp_path, "[queue\n"))


def test_a_file_extends_another_and_sets_only_what_differs(tmp_path):
    (tmp_path / "base.toml").write_text("[queue]\nmax_tasks = 3\ntimeout_s = 4.0\n[model]\nname = 'm'\n")
    (tmp_path / "top.toml").write_text("extends = 'base.toml'\n[queue]\nmax_tasks = 5\n")
    cfg = load_config(tmp_path / "top.toml")
    assert (cfg.queue.max_tasks, cfg.queue.timeout_s, cfg.model.name) == (5, 4.0, "m")


def test_extends_loops_and_missing_bases_are_named(tmp_path):
    (tmp_path / "a.toml").write_text("extends = 'a.toml'\n")
    with pytest.raises(ConfigError, match="extends itself"):
        load_config(tmp_path / "a.toml")
    (tmp_path / "b.toml").write_text("extends = 'missing.toml'\n")
    with pytest.raises(ConfigError, match="missing.toml: cannot read"):
        load_config(tmp_path / "b.toml")


@pytest.mark.parametrize("body, message", [
    ("[storage]\nkind = 'gcs'\n", "storage: gcs: kind 'gcs' needs a [gcs] section"),
    ("[storage]\nkind = 'gcs'\n[storage.gcs]\nbucket = 'bkt'\nobject_name = '{prefix}/x.png'\n",
     "storage.gcs: object_name: must contain {task_id}"),
    ("[storage]\nkind = 'gcs'\n[storage.gcs]\nbucket = 'bkt'\nobject_name = '{task_id}{when}'\n",
     "object_name: unknown field(s) when"),
    ("[storage]\nkind = 'gcs'\n[storage.gcs]\nbucket = 'bkt'\n[storage.quarantine]\nkind = 'gcs'\n"
     "[storage.quarantine.gcs]\nbucket = 'bkt'\n", "quarantine: must not be the results location"),
])
def test_gcs_settings_are_checked(tmp_path, body, message):
    with pytest.raises(ConfigError) as e:
        load_config(write_config(tmp_path, body))
    assert message in str(e.value)


def test_adapters_are_refused_beside_what_would_bypass_them(tmp_path):
    lora = '[lora]\nallow = ["https://hub.example/loras/"]\n'
    with pytest.raises(ConfigError, match=r"speed.fuse_qkv: the fused projection would bypass adapters"):
        load_config(write_config(tmp_path, lora + "[speed]\nfuse_qkv = true\n"))
    assert load_config(write_config(tmp_path, lora + "[speed]\ncompile = true\n")).lora.accepted == 3  # slots
    with pytest.raises(ConfigError, match=r"lora.allow.*must end in /|lora.allow.*then a path ending in /"):
        load_config(write_config(tmp_path, '[lora]\nallow = ["https://hub.example/loras"]\n'))
    with pytest.raises(ConfigError, match=r"speed.fp8: LoRA adapters cannot be loaded into torchao's float8"):
        load_config(write_config(tmp_path, lora + '[model]\ndevice = "cuda"\ndtype = "bfloat16"\n[speed]\nfp8 = true\n'))
    with pytest.raises(ConfigError, match=r"deadlines.fetch_s \(60\) must be at least lora.fetch_timeout_s \(120\)"):
        load_config(write_config(tmp_path, lora + "[deadlines]\nfetch_s = 60\n"))
    # Without a source, adapters are off and every speed-up stays available.
    assert load_config(write_config(tmp_path, "[speed]\nfuse_qkv = true\ncompile = true\n")).lora.accepted == 0
