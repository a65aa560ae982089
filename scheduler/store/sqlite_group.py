"""Group commit for the SQLite store (sqlite.py): the calls one event loop makes within a turn of
it share one transaction.

synchronous=FULL makes every COMMIT an fsync, and under a fleet's load (four transactions per task)
the fsyncs were a third of the scheduler's time. So the first call of a turn opens a transaction,
each call is a SAVEPOINT in it (atomic on its own: a call that fails undoes only itself), and one
COMMIT, at the loop's next turn, makes them all durable at once. No call returns before that
COMMIT: an answer a client gets is on disk. The busier the loop, the more calls share an fsync.

The COMMIT runs on a thread of its own: its fsync (some 0.4 ms on an SSD, up to a sixth of the loop's
time under a fleet's load) no longer stops the event loop, which parses, admits and answers other
requests meanwhile. Store calls made during it wait for it and then form the next group together.

Locks (docs/architecture.md, "Threads, locks and the event loop"). `write` guards the write
connection: a thread holds it for its own transaction; the loop's group holds it from its BEGIN
until the committer thread's COMMIT, across turns of the loop. So the loop thread takes it only to
open a group (never while its own group is open), and nothing else ever waits for it on the loop.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class LoopGroup:
    def __init__(self, db: sqlite3.Connection, write: threading.Lock) -> None:
        self._db = db  # the store's write connection
        self._write = write  # its lock
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop whose calls share transactions
        self._loop_thread: int | None = None
        self._group: asyncio.Future | None = None  # the open group's
        self._joined: asyncio.Future | None = None  # the group the current call wrote in, if any
        self._committing: asyncio.Future | None = None  # the last group's COMMIT, on the committer thread
        self._committer: ThreadPoolExecutor | None = None
        self.commits = 0

    def on_loop(self) -> bool:
        """Whether the caller is the event loop's thread, between open and close."""
        return self._loop_thread == threading.get_ident()

    def is_open(self) -> bool:
        return self._group is not None

    async def open(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="sqlite-commit")

    async def close(self) -> None:
        while (pending := self._group or self._committing) is not None:  # an open group, a COMMIT in flight
            await asyncio.wait({pending})
        self._loop_thread = None
        if self._committer is not None:
            self._committer.shutdown()
            self._committer = None

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn` on the event loop; once it wrote, after the COMMIT that makes it durable."""
        while (prior := self._committing) is not None:  # not raised here: the prior group's failure is its own
            await _settled(prior)
        self._joined = None
        result = fn(*args)
        group, self._joined = self._joined, None
        if group is not None:
            await asyncio.shield(group)  # a cancelled request does not cancel the others' commit
        return result

    def savepoint(self) -> Iterator[sqlite3.Connection]:
        """A savepoint in the loop's open group transaction (opened here if none is)."""
        if self._group is None:
            # Held until the group commits: threads' transactions wait for it. Free, or held by a
            # thread's transaction or the last group's COMMIT (call waited for that), both of which
            # end without the loop.
            self._write.acquire()
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except BaseException:
                self._write.release()
                raise
            self._group = self._loop.create_future()
            self._loop.call_soon(self._commit_group)
        self._joined = self._group
        self._db.execute("SAVEPOINT call")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK TO call")
            self._db.execute("RELEASE call")
            raise
        self._db.execute("RELEASE call")

    def _commit_group(self) -> None:
        """At the loop's turn after the group opened: its COMMIT, handed to the committer thread."""
        group, self._group = self._group, None
        self._committing = done = self._loop.run_in_executor(self._committer, self._commit)
        done.add_done_callback(lambda f: self._committed(f, group))  # before any waiter's: they resume after

    def _commit(self) -> None:
        """On the committer thread. The lock, held since the group's BEGIN, is released before the
        loop hears of it: the next group can open as soon as it resumes."""
        try:
            self._db.execute("COMMIT")
        except BaseException:  # the disk full or gone: every call of the group fails
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise
        finally:
            self._write.release()

    def _committed(self, done: asyncio.Future, group: asyncio.Future) -> None:
        if self._committing is done:
            self._committing = None
        if (error := done.exception()) is not None:
            group.set_exception(error)
        else:
            group.set_result(None)
            self.commits += 1


async def _settled(fut: asyncio.Future) -> None:
    """Once `fut` is done, however it ended, as asyncio.wait({fut}) waits but for less (no sets, no
    callbacks to remove); the caller's cancel does not reach `fut`."""
    waiter = fut.get_loop().create_future()
    fut.add_done_callback(lambda _: waiter.done() or waiter.set_result(None))
    await waiter
