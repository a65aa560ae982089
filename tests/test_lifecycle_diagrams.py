"""docs/architecture.md draws a task's lifecycles and a worker registration's as Mermaid state
diagrams; the code holds the same lifecycles as data. These tests fail when the two part ways: a state or a transition in the code that
the diagram lacks, or one the diagram shows that the code does not allow.

Each diagram names the table it draws in its first line, a Mermaid comment:
`%% transitions: package.module.NAME`, a dict from a state to the states it may move to.
"""

from __future__ import annotations

import importlib
import re
import typing
from enum import Enum
from pathlib import Path

import pytest

from protocol import RegistrationStatus, TaskStatus

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
EDGE = re.compile(r"^\s*(\[\*\]|\w+)\s*-->\s*(\[\*\]|\w+)\s*(?::.*)?$")
STATE = re.compile(r"^\s*state\s+\"[^\"]*\"\s+as\s+(\w+)|^\s*(\w+)\s*:\s")


def diagrams(text: str) -> dict[str, tuple[set[str], set[tuple[str, str]]]]:
    """Each diagram's table name -> (its states, its transitions), [*] left out."""
    found = {}
    for block in re.findall(r"```mermaid\n(.*?)```", text, re.S):
        lines = block.splitlines()
        named = [m.group(1) for line in lines if (m := re.match(r"\s*%% transitions: ([\w.]+)", line))]
        if not named:
            continue
        edges, states = set(), set()
        for line in lines:
            if m := EDGE.match(line):
                a, b = m.groups()
                states.update(s for s in (a, b) if s != "[*]")
                if "[*]" not in (a, b):
                    edges.add((a, b))
            elif (m := STATE.match(line)) and not line.lstrip().startswith("%%"):
                states.add(m.group(1) or m.group(2))
        found[named[0]] = (states, edges)
    return found


def table(name: str) -> tuple[set[str], set[tuple[str, str]]]:
    module, attr = name.rsplit(".", 1)
    transitions = getattr(importlib.import_module(module), attr)

    def label(state) -> str:
        return state.value if isinstance(state, Enum) else state

    states = {label(s) for s in transitions} | {label(t) for nxt in transitions.values() for t in nxt}
    return states, {(label(a), label(b)) for a, nxt in transitions.items() for b in nxt}


DRAWN = diagrams(DOC.read_text())
EXPECTED = ["scheduler.store.lifecycle.REGISTRATION_TRANSITIONS", "scheduler.store.lifecycle.TRANSITIONS",
            "worker.serving.ledger.TRANSITIONS"]


def test_every_lifecycle_is_drawn():
    assert sorted(DRAWN) == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_each_diagram_shows_exactly_the_states_and_moves_its_code_allows(name):
    states, edges = table(name)
    drawn_states, drawn_edges = DRAWN[name]
    assert states - drawn_states == set(), "states in the code, missing from the diagram"
    assert drawn_states - states == set(), "states in the diagram the code does not have"
    assert edges - drawn_edges == set(), "transitions the code allows, missing from the diagram"
    assert drawn_edges - edges == set(), "transitions drawn that the code does not allow"


def test_the_scheduler_diagram_covers_every_status_of_the_protocol():
    assert set(typing.get_args(TaskStatus)) == DRAWN["scheduler.store.lifecycle.TRANSITIONS"][0]


def test_the_rank_zero_diagram_covers_every_fate_and_names_every_stage():
    from worker.serving.ledger import Fate, Stage

    assert {f.value for f in Fate} == DRAWN["worker.serving.ledger.TRANSITIONS"][0]
    section = DOC.read_text().split("### On rank 0", 1)[1].split("\n## ", 1)[0]
    assert all(f"`{stage.value}`" in section for stage in Stage), "every Stage named in the rank-0 section"


def test_the_registration_diagram_covers_every_status_of_the_protocol():
    assert {s.value for s in RegistrationStatus} == DRAWN["scheduler.store.lifecycle.REGISTRATION_TRANSITIONS"][0]


@pytest.mark.parametrize("name, move", [("scheduler.store.lifecycle.TRANSITIONS", ("queued", "leased")),
                                        ("scheduler.store.lifecycle.REGISTRATION_TRANSITIONS", ("ready", "lost"))])
def test_a_diagram_that_lost_a_transition_is_caught(name, move):
    # The check itself: drop one drawn move and the comparison must see it.
    text = DOC.read_text()
    broken = re.sub(rf"(?m)^\s*{move[0]} --> {move[1]}\b.*\n", "", text, count=1)
    assert broken != text
    states, edges = table(name)
    assert edges - diagrams(broken)[name][1] == {move}


def test_a_diagram_with_a_planted_move_is_caught():
    # A move drawn that the code does not allow: a replaced registration serving again.
    name = "scheduler.store.lifecycle.REGISTRATION_TRANSITIONS"
    text = DOC.read_text()
    planted = text.replace("    drained --> [*]", "    replaced --> ready: planted\n    drained --> [*]", 1)
    assert planted != text
    states, edges = table(name)
    assert diagrams(planted)[name][1] - edges == {("replaced", "ready")}
