"""Speed switches this device or config cannot honour stop the worker at start, naming the field."""

from __future__ import annotations

import pytest
import torch

from tests.harness import write_config
from worker.config import ConfigError, ParallelConfig, SpeedConfig, load_config
from worker.model.speed import SpeedConfigError, check

CPU = torch.device("cpu")


@pytest.mark.parametrize("speed, parallel, world, field", [
    (SpeedConfig(fp8=True), ParallelConfig(), 1, "speed.fp8: needs a CUDA device of compute capability 8.9"),
    (SpeedConfig(offload="model"), ParallelConfig(), 1, "speed.offload: needs a CUDA device"),
    (SpeedConfig(attention_backend="warp-drive"), ParallelConfig(), 1, "speed.attention_backend: unknown backend"),
    (SpeedConfig(compile_mode="max-autotune"), ParallelConfig(), 1, "speed.compile_mode: set speed.compile"),
    (SpeedConfig(compile_scope="blocks", compile_vae=True), ParallelConfig(), 1,
     "speed.compile_scope: set speed.compile as well"),
    (SpeedConfig(), ParallelConfig(mode="context"), 1, "parallel.mode: 'context' needs at least 2 ranks"),
    (SpeedConfig(), ParallelConfig(mode="context", context_kind="ring"), 2,
     "parallel.context_kind: ring needs an attention backend that returns LSE"),
])
def test_device_checks_name_the_field(speed, parallel, world, field):
    with pytest.raises(SpeedConfigError, match=field.replace(".", r"\.").replace("(", r"\(")):
        check(speed, parallel, CPU, world)


def test_a_backend_whose_kernels_are_missing_is_refused():
    with pytest.raises(SpeedConfigError, match=r"speed\.attention_backend: 'flash' cannot run here"):
        check(SpeedConfig(attention_backend="flash"), ParallelConfig(), CPU, 1)


@pytest.mark.parametrize("text, message", [
    ("[model]\ndevice = 'cpu'\n[speed]\nfp8 = true\n", "speed.fp8: needs a CUDA device (model.device is cpu)"),
    ("[model]\ndtype = 'float32'\n[speed]\nfp8 = true\n", "speed.fp8: quantizes a bfloat16/float16 model"),
    ("[parallel]\nmode = 'context'\n[speed]\noffload = 'model'\n", "speed.offload: cannot be combined"),
    ("[speed]\noffload = 'sequential'\ncompile = true\n", "speed.offload: 'sequential' streams weights"),
    ("[batch]\nmax_size = 0\n", "batch.max_size: Input should be greater than or equal to 1"),
    ("[parallel]\nmode = 'pipeline'\n", "parallel.mode: Input should be 'data' or 'context'"),
    ("[speed]\nturbo = true\n", "speed.turbo: unknown key"),
    ("[speed]\nfp8_scales = 'block'\n", "speed.fp8_scales: Input should be 'row' or 'tensor'"),
    ("[speed]\ncompile_scope = 'layers'\n", "speed.compile_scope: Input should be 'model' or 'blocks'"),
])
def test_config_refuses_combinations_that_cannot_work(tmp_path, text, message):
    with pytest.raises(ConfigError) as e:
        load_config(write_config(tmp_path, text))
    assert message in str(e.value)
