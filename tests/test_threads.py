"""The encoder's and decoder's worker threads (``codec._ordered_map``): pools kept for the
life of the process, safe in a forked child, nested calls, nothing left running."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import numpy as np
import pytest
from conftest import smooth_stack

import tezip
from tezip import codec


def _compress_in_child(x: np.ndarray) -> bytes:
    return tezip.compress(x, mode="rel", bound=1e-3, predictor="classical", threads=2)


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="no fork here")
def test_a_forked_child_gets_its_own_worker_threads():
    """The parent's pools have no threads in a child forked after they were used (as
    DataLoader workers are): the child must not wait on them."""
    x = smooth_stack((40, 24, 24), np.float32, seed=3)
    want = _compress_in_child(x)                 # the parent's pool is now running
    with mp.get_context("fork").Pool(1) as pool:
        got = pool.apply_async(_compress_in_child, (x,)).get(timeout=120)
    assert got == want
    assert tezip.decompress(got, threads=2).tobytes() == tezip.decompress(want).tobytes()


def test_a_call_from_a_worker_thread_runs_one_item_after_another():
    """A task that waited on tasks of its own pool could wait forever: nested calls run
    inline, in order."""
    def inner(i: int) -> list[int]:
        return list(codec._ordered_map(lambda j: (i, j, threading.current_thread().name),
                                       iter(range(5)), 2))

    done: list = []
    t = threading.Thread(target=lambda: done.append(list(codec._ordered_map(
        inner, iter(range(6)), 2))))
    t.start()
    t.join(60)
    assert not t.is_alive(), "nested calls did not finish"
    (result,) = done
    assert [[(i, j) for i, j, _ in row] for row in result] == [
        [(i, j) for j in range(5)] for i in range(6)]
    for row in result:                              # each row ran in one worker thread
        assert len({name for _, _, name in row}) == 1


def test_no_call_is_still_running_when_the_map_ends_early():
    running = 0
    lock = threading.Lock()

    def fn(i: int) -> int:
        nonlocal running
        with lock:
            running += 1
        try:
            time.sleep(0.05)
            if i == 2:
                raise ValueError("item 2")
            return i
        finally:
            with lock:
                running -= 1

    with pytest.raises(ValueError, match="item 2"):
        list(codec._ordered_map(fn, iter(range(40)), 2))
    assert running == 0
    gen = codec._ordered_map(fn, iter(range(40)), 2)
    assert next(gen) == 0
    gen.close()                                    # the consumer stops early
    assert running == 0


def test_one_and_two_threads_and_many_callers_give_the_same_bytes():
    xs = [smooth_stack((48, 20, 28), np.float32, seed=s) for s in range(4)]
    want = [tezip.compress(x, mode="rel", bound=1e-3, threads=1) for x in xs]
    got: dict[int, bytes] = {}

    def call(k: int) -> None:
        got[k] = tezip.compress(xs[k % 4], mode="rel", bound=1e-3, threads=2)

    threads = [threading.Thread(target=call, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(got[k] == want[k % 4] for k in range(8))
