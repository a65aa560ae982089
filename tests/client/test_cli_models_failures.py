"""`dit submit --model` with a model the fleet does not serve: refused, naming it."""

from __future__ import annotations

import pytest

from tests.client.test_cli import dit
from tests.client.test_cli_models import url  # noqa: F401 - the fixture: a scheduler serving two models

pytestmark = pytest.mark.integration  # starts processes or servers (tests/tiers.py)


def test_a_model_the_fleet_does_not_serve_is_refused_naming_it(url):
    run = dit(url, "submit", "a fox", "--model", "sana")
    assert run.returncode != 0 and "model: 'sana' is not one of this fleet's models (flux, pixart" in run.stderr
