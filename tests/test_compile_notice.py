"""A first use of a data type on a machine compiles kernels for up to a minute: the command
line says so (once per process) instead of looking stuck; a load from the disk cache is
quiet."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import tezip.kernels as K
from tezip import cli
from tezip.kernels import core


@core.jit
def _twice(a):
    return a * 2.0


class _Slow:
    """A kernel whose compile takes ``delay`` seconds (as a real first compile does)."""

    def __init__(self, kernel, delay: float) -> None:
        self.kernel, self.delay = kernel, delay
        self.overloads = kernel.overloads

    def compile(self, sig):
        time.sleep(self.delay)
        return self.kernel.compile(sig)


@pytest.fixture
def notices(monkeypatch):
    seen: list[float] = []
    fired = threading.Event()

    def note() -> None:
        seen.append(time.perf_counter())
        fired.set()

    monkeypatch.setattr(K, "on_slow_compile", note)
    monkeypatch.setattr(K, "SLOW_COMPILE", 0.05)
    monkeypatch.setattr(core, "_NOTICED", threading.Event())
    return seen, fired


def test_a_slow_compile_is_announced_once(notices):
    seen, fired = notices
    x = np.arange(3.0)
    assert np.array_equal(core.call(_Slow(_twice, 0.5), (), x), 2 * x)
    assert fired.wait(5) and len(seen) == 1
    core.call(_Slow(_twice, 0.5), (), x.astype(np.float32))   # another compile: quiet
    assert len(seen) == 1


def test_a_quick_compile_or_cache_load_is_quiet(notices, monkeypatch):
    seen, fired = notices
    monkeypatch.setattr(K, "SLOW_COMPILE", 5.0)
    core.call(_Slow(_twice, 0.0), (), np.arange(4, dtype=np.int64))
    assert not fired.wait(0.2) and seen == []


def test_the_command_line_sets_the_notice_shown_where_progress_is(monkeypatch, capsys):
    monkeypatch.setattr(K, "on_slow_compile", None)
    monkeypatch.delenv("TEZIP_PROGRESS", raising=False)
    assert cli.main(["--version"]) == 0
    capsys.readouterr()
    assert K.on_slow_compile is not None
    K.on_slow_compile()                              # stderr is not a terminal here
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("TEZIP_PROGRESS", "1")
    K.on_slow_compile()
    err = capsys.readouterr().err
    assert err.startswith("tezip: compiling kernels") and "first use" in err
