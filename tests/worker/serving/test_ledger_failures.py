"""The ledger under the races the worker has: late and repeated calls, notices about attempts whose
fate is already decided, and every thread telling it at once. None of them may raise: an
IllegalTransition is a bug in a caller, never a state of the world."""

from __future__ import annotations

import random
import threading

from worker.serving.ledger import Counter, Fate, Ledger, Stage
from tests.worker.serving.test_ledger import Clock, task


def test_the_reporter_ending_an_attempt_the_watchdog_is_failing_changes_nothing_more():
    clock = Clock()
    led = Ledger(clock=clock)
    t = task()
    led.hold(t, Stage.STORE)
    clock.now += 1000
    [held] = led.overdue()
    led.end(t)  # the post stage finished meanwhile: dropped and ended
    led.end(held.task)  # the watchdog's failure report ends it again
    assert led.fate(t) is Fate.DONE and led.held() == [] and led.abandon_all() == []


def test_notices_about_attempts_whose_fate_is_decided_are_ignored():
    clock = Clock()
    led = Ledger(clock=clock)
    late, gone = task("late"), task("gone")
    led.hold(late, Stage.STORE)
    led.hold(gone)
    led.end(gone)
    clock.now += 1000
    led.overdue()
    assert led.mark_cancelled(["late", "gone"]) == []  # being failed already; no longer held
    led.mark_lost(["late", "gone"])
    assert led.fate(late) is Fate.OVERDUE and led.fate(gone) is Fate.DONE
    assert led.counters.get(Counter.LEASES_LOST) == 1  # the lease of the one still held


def test_every_thread_telling_it_at_once_leaves_each_attempt_done():
    clock = Clock()
    led = Ledger(clock=clock)
    tasks = [task(f"t{i % 20}", attempt=i) for i in range(200)]  # ten attempts of each of twenty tasks
    errors: list[BaseException] = []

    def life(t) -> None:
        rng = random.Random(t.lease.attempt)
        try:
            led.hold(t)
            for stage in (Stage.READY, Stage.GENERATE, Stage.CHECK, Stage.STORE, Stage.REPORT):
                led.advance(t, stage)
                if rng.random() < 0.1:
                    break
            led.end(t)
        except BaseException as e:
            errors.append(e)

    def heartbeat_and_watchdog(stop: threading.Event) -> None:
        rng = random.Random(0)
        try:
            while not stop.is_set():
                ids = rng.sample([f"t{i}" for i in range(20)], 5)
                led.mark_lost(ids[:2])
                led.mark_cancelled(ids[2:])
                clock.now += rng.choice((0, 0, 50))
                led.overdue()
                led.in_flight()
        except BaseException as e:
            errors.append(e)

    stop = threading.Event()
    noise = threading.Thread(target=heartbeat_and_watchdog, args=(stop,))
    noise.start()
    workers = [threading.Thread(target=lambda chunk=tasks[i::4]: [life(t) for t in chunk]) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    stop.set()
    noise.join(30)
    assert errors == []
    assert {led.fate(t) for t in tasks} == {Fate.DONE} and led.held() == [] and led.in_flight() == []
