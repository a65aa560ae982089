"""End to end, several images per task (input.num_images): a worker of two ranks makes image i of a
task with seed `seed + i`, as one unbatched rank makes that seed alone (a task's images are batched
together, so within one level per pixel, as test_parallel allows batching); the result lists every
image, its top level the first; the scheduler refuses more images than its live workers make."""

from __future__ import annotations

import io
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest
from PIL import Image

from tests.e2e import test_parallel as parallel

reference = parallel.reference  # the fixture: what one unbatched rank makes for an input
max_diff = parallel.max_diff

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)


def test_two_ranks_make_each_image_of_a_task_as_one_rank_makes_its_seed(make_stack, reference):
    stack = make_stack()
    stack.proc = stack.worker(nproc=2, overrides=["parallel.mode=data", "batch.max_size=2"])
    base = {"width": 192, "height": 128, "output_format": "png"}
    inps = [{"prompt": "a lighthouse in fog", "seed": 40, "num_images": 3, **base},
            {"prompt": "a tram in the rain", "seed": 7, **base},
            {"prompt": "two herons at dawn", "seed": 90, "num_images": 2, **base}]
    ids = [stack.client.submit(i)["id"] for i in inps]
    done = stack.client.wait(ids, 180, proc=stack.proc)
    for inp, task_id in zip(inps, ids):
        task = done[task_id]
        assert task["status"] == "succeeded", task["error"]
        result, n = task["result"], inp.get("num_images", 1)
        assert [(i["index"], i["seed"]) for i in result["images"]] == [(k, inp["seed"] + k) for k in range(n)]
        assert (result["uri"], result["seed"]) == (result["images"][0]["uri"], inp["seed"])
        names = [Path(urlparse(i["uri"]).path).name for i in result["images"]]
        assert names == [f"{task_id}.png"] + [f"{task_id}~{k}.png" for k in range(1, n)]
        made = []
        for image in result["images"]:
            data = Path(urlparse(image["uri"]).path).read_bytes()
            assert image["bytes"] == len(data) and image["withheld"] is None
            made.append(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
            alone = reference({**inp, "seed": image["seed"]})
            assert max_diff(made[-1], alone) <= 1, f"{task_id} image {image['index']}"
        assert all(max_diff(a, b) > 8 for a, b in zip(made, made[1:]))  # each its own seed
    # Once a worker is live, more images than it makes are refused at submission, naming the field.
    refused = stack.client.http.post("/v1/tasks", json={"input": {"prompt": "five cats", "num_images": 5}})
    assert refused.status_code == 422
    assert refused.json()["detail"] == "input.num_images: 5 is above every live worker's limit (4)"
