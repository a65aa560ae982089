"""Statements as values. The hot paths (submit, claim, a round's reports) are written once as plans:
generators that yield their statements and receive the rows. database.py carries them out on
blocking connections (tests, tools, SQLite) or inside one transaction; postgres.py also on the event
loop, without a thread (psycopg's async pool)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Write:
    """A plan's step: one statement that is atomic on its own; its RETURNING rows come back."""
    sql: str
    args: tuple


@dataclass(frozen=True)
class WriteEach:
    """A plan's step: one statement per set of arguments, each atomic on its own, sent together
    (PostgreSQL: one pipelined round trip); the RETURNING rows of all of them come back."""
    sql: str
    args: list[tuple]


@dataclass(frozen=True)
class Read:
    """A plan's step: one read; its rows come back."""
    sql: str
    args: tuple


Step = Write | WriteEach | Read
Plan = Generator[Step, list, Any]


def drive(plan: Plan, do: Callable[[Step], list]) -> Any:
    """Runs `plan`, each step by `do`; the plan's result."""
    try:
        step = next(plan)
        while True:
            step = plan.send(do(step))
    except StopIteration as done:
        return done.value


def one(db: Any, step: Write) -> Any:
    """`step` on the handle `db` (in its transaction); its first row, or None."""
    return db.execute(step.sql, step.args).fetchone()
