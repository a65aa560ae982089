"""Which model a worker's next lease is of, on a fleet of several models: the claim's decision
(claims.py reads what it needs in one or two queries), kept apart from SQL to be tested on its own.

Affinity routing, in this order (within each: higher priority, then older):
1. a task of a model the worker would have to load that has waited `cold_wait_s` for a worker
   holding it: one cold model cannot starve behind a hot one. Unless some worker gained that model
   less than `cold_wait_s` ago: a backlog pulls in one more worker per `cold_wait_s`, not every
   worker at once;
2. a task of a model it holds resident;
3. a task of a model no live worker holds: waiting could not bring a warm worker, so a worker with
   nothing of its own to do loads it at once.
A task whose model some other worker holds, younger than `cold_wait_s`, is left for that worker.

FIFO routing (the baseline `make bench-models` compares against): the first task in lease order of
any model the worker serves, held or not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

Route = Literal["affinity", "fifo"]
OVERDUE, RESIDENT, UNHELD = 0, 1, 2


def changes(mine: Mapping[str, bool], resident: Sequence[str]) -> dict[str, bool]:
    """The rows to write when a worker says it holds `resident` now, against what the store has:
    model -> resident. Models it no longer holds stay listed as loadable."""
    held = set(resident)
    out = {m: True for m in held if not mine.get(m)}
    out.update({m: False for m, was in mine.items() if was and m not in held})
    return out


def pick(heads: Sequence[Mapping[str, Any]], mine: Mapping[str, bool], holders: Mapping[str, tuple[int, float]],
         now: float, cold_wait_s: float, route: Route = "affinity") -> str | None:
    """The model of the worker's next lease; None when no model it serves has a task for it now.
    `heads`: the first queued task of each model it serves (model, priority, seq, created_at);
    `mine`: model -> held resident by this worker; `holders`: model -> (live workers holding it,
    when the last of them gained it)."""
    best: tuple[tuple[int, int, int], str] | None = None
    for head in heads:
        model = head["model"]
        if route == "fifo":
            rank = RESIDENT
        elif (rank := _rank(head, mine.get(model, False), holders.get(model), now, cold_wait_s)) is None:
            continue
        key = (rank, -head["priority"], head["seq"])
        if best is None or key < best[0]:
            best = (key, model)
    return best[1] if best else None


def _rank(head: Mapping[str, Any], held: bool, holder: tuple[int, float] | None, now: float,
          cold_wait_s: float) -> int | None:
    if held:
        return RESIDENT
    warm, gained = holder or (0, None)
    if now - head["created_at"] >= cold_wait_s and (gained is None or now - gained >= cold_wait_s):
        return OVERDUE
    return UNHELD if not warm else None
