"""One name per concept (docs/architecture.md, "Vocabulary"): no class or type alias is defined twice
in the product's packages unless both mean the same thing, listed here with why; the names renamed
away from a second meaning do not come back."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from launch.local import REPO

PRODUCT = ["protocol", "worker", "safety", "scheduler", "client", "launch"]
# The same concept on two sides of one HTTP API: the user's client library and the worker's queue
# client each raise these for the same answers (401/403, 429/5xx or no answer, 413/422).
SAME_MEANING = {"AuthError", "Unavailable", "InvalidRequest"}
# Names that meant two or three things: gone, or kept for one meaning in one home.
GONE = ("Outcome", "Pace")
ONE_HOME = {"Answer": "scheduler/api/answer.py", "Admission": "worker/serving/admission.py",
            "Store": "scheduler/store/base.py", "NotFound": "worker/serving/queue_client.py",
            "Conflict": "client/errors.py", "Backlog": "worker/serving/backlog.py",
            # The tests' and benchmarks' own client is bench/plain_client.py's PlainClient.
            "Client": "client/api.py"}


def definitions(text: str) -> list[str]:
    """Module-level classes and type aliases (an assignment of a capitalised name to a type)."""
    names = []
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
            if name[:1].isupper() and not name.isupper() and isinstance(value, (ast.Subscript, ast.BinOp)):
                names.append(name)
    return names


def where_defined() -> dict[str, list[str]]:
    found = defaultdict(list)
    for package in PRODUCT:
        for path in sorted((REPO / package).rglob("*.py")):
            for name in definitions(path.read_text()):
                found[name].append(str(path.relative_to(REPO)))
    return found


def test_no_name_is_defined_twice_with_two_meanings():
    twice = {name: paths for name, paths in where_defined().items() if len(paths) > 1}
    assert set(twice) - SAME_MEANING == set(), twice


def test_a_name_given_up_for_its_second_meaning_stays_in_its_one_home():
    found = where_defined()
    for name in GONE:
        assert name not in found, found.get(name)
    for name, home in ONE_HOME.items():
        assert found.get(name) == [home], (name, found.get(name))
    assert not (REPO / "scheduler" / "drain.py").exists()


def test_the_check_sees_a_class_and_a_type_alias():
    text = "from typing import Literal\nOutcome = Literal['a']\nclass Store:\n    pass\nLIMIT = 3\n"
    assert definitions(text) == ["Outcome", "Store"]
