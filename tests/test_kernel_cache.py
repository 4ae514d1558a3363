"""numba's disk cache stamps a kernel with the file that defines it only; a kernel
inlines helpers from other kernel modules (``kernels/core.py`` above all), so an edit
there must make every kernel compile again, not load with the old helper inside."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tezip
from tezip.kernels import bits, core, entropy, interp, lorenzo, nn, sample

PROBE = (
    "import numpy as np\n"
    "from tezip.kernels import entropy as K\n"
    "K.varint_encode(np.arange(5, dtype=np.int64))\n"
    "s = K.varint_encode.stats\n"
    "print(sum(s.cache_hits.values()), sum(s.cache_misses.values()))\n"
)


def test_every_kernel_cache_entry_carries_the_stamp_of_all_kernel_sources():
    kernels = [f for m in (bits, core, entropy, interp, lorenzo, nn, sample)
               for f in vars(m).values() if hasattr(f, "_cache") and hasattr(f, "py_func")]
    assert len(kernels) > 20
    for k in kernels:
        stamp = k._cache._cache_file._source_stamp
        assert isinstance(stamp, tuple) and stamp[1] == core.KERNELS_STAMP, k


def test_the_stamp_changes_with_any_kernel_module(tmp_path):
    src = Path(core.__file__).parent
    for f in src.glob("*.py"):
        shutil.copy(f, tmp_path / f.name)
    before = core.sources_stamp(str(tmp_path))
    assert before == core.KERNELS_STAMP
    # an editor's lock file (Emacs: a broken link) and a directory named like a module
    # are not modules: they change nothing, and hide no edit
    os.symlink("user@host.1234:1700000000", tmp_path / ".#core.py")
    (tmp_path / "old.py").mkdir()
    assert core.sources_stamp(str(tmp_path)) == before
    with open(tmp_path / "core.py", "a") as f:
        f.write("# an edit\n")
    assert core.sources_stamp(str(tmp_path)) != before


def test_a_module_that_cannot_be_read_makes_every_kernel_compile(tmp_path, monkeypatch):
    (tmp_path / "core.py").write_text("x = 1\n")
    real_open = open

    def refuse(path, *args, **kwargs):
        if str(path).endswith("core.py"):
            raise PermissionError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", refuse)
    assert core.sources_stamp(str(tmp_path)) != core.sources_stamp(str(tmp_path))


def test_an_edit_to_core_alone_recompiles_a_cached_kernel_of_another_module(tmp_path):
    pkg = tmp_path / "tree"
    shutil.copytree(Path(tezip.__file__).parent, pkg / "tezip",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(pkg)}
    env.pop("NUMBA_CACHE_DIR", None)

    def probe() -> tuple[int, int]:
        out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=tmp_path,
                             capture_output=True, text=True, check=True).stdout.split()
        return int(out[0]), int(out[1])

    assert probe() == (0, 1)            # compiled, written to the tree's cache
    assert probe() == (1, 0)            # loaded from it
    with open(pkg / "tezip" / "kernels" / "core.py", "a") as f:
        f.write("# an edit to a helper's module\n")
    assert probe() == (0, 1)            # stale: compiled again


FAST_PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
from tezip import kernels
kernels.fast_cache_load = sys.argv[2] == "1"
import tezip.kernels.core  # noqa: F401  (installs the fast load when asked)
import numpy as np
from numba.core import base
from numba.core.caching import Cache
refreshes = []
orig = base.BaseContext.refresh
base.BaseContext.refresh = lambda self: (refreshes.append(1), orig(self))[1]
import probe_mod
out = probe_mod.f(np.arange(10.0))
s = probe_mod.f.stats
print(out, sum(s.cache_hits.values()), sum(s.cache_misses.values()), len(refreshes),
      getattr(Cache.load_overload, "_tezip", False))
"""


def test_fast_cache_load_loads_without_a_refresh_and_still_compiles_on_a_miss(tmp_path):
    """``kernels.fast_cache_load`` (the program's own process): a function in numba's disk
    cache loads without numba refreshing its compiler's tables, with the same result; one
    not in the cache compiles (after the refresh a compilation needs); off, nothing
    changes."""
    (tmp_path / "probe_mod.py").write_text(
        "import numba\n"
        "@numba.njit(cache=True)\n"
        "def f(a):\n"
        "    return (a * a).sum()\n")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}

    def run(fast: str) -> list[str]:
        p = subprocess.run([sys.executable, "-c", FAST_PROBE, str(tmp_path), fast],
                           capture_output=True, text=True, timeout=300, env=env)
        assert p.returncode == 0, p.stderr
        return p.stdout.split()

    out, hits, misses, refreshes, patched = run("1")        # not cached yet: compiles
    assert (out, hits, misses, patched) == ("285.0", "0", "1", "True") and int(refreshes) > 0
    out, hits, misses, refreshes, patched = run("1")        # cached: loads, no refresh
    assert (out, hits, misses, refreshes, patched) == ("285.0", "1", "0", "0", "True")
    out, hits, misses, refreshes, patched = run("0")        # off: numba's own load
    assert (out, hits, misses, patched) == ("285.0", "1", "0", "False") and int(refreshes) > 0


WAITER = (
    "import sys\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "import small_kernel as m\n"
    "from tezip.kernels.core import call\n"
    "print('ready', flush=True)\n"
    "assert call(m.k, (), 41) == 42\n"
    "s = m.k.stats\n"
    "print(sum(s.cache_hits.values()), sum(s.cache_misses.values()))\n"
)


def _small_kernel(tmp_path: Path, monkeypatch):
    """A kernel of a module in ``tmp_path`` (its cache beside it), imported here as the
    waiting process imports it (numba's cache entry names the module)."""
    (tmp_path / "small_kernel.py").write_text(
        "from tezip.kernels.core import jit\n\n\n@jit\ndef k(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "small_kernel", raising=False)
    import small_kernel
    return small_kernel.k


def _wait_blocked(lock, tmp_path: Path, seconds: float, meanwhile) -> list[str]:
    """Start the waiting process while ``lock`` is held; it must still be waiting after
    ``seconds``; then ``meanwhile()``, the lock released: the process's output."""
    with lock:
        p = subprocess.Popen([sys.executable, "-c", WAITER, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline().strip() == "ready"
            with pytest.raises(subprocess.TimeoutExpired):
                p.wait(timeout=seconds)
            meanwhile()
        except BaseException:
            p.kill()
            raise
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0
    return out.split()


def test_a_process_waits_for_anothers_compile_and_loads_it(tmp_path, monkeypatch):
    """The compile lock (``core._compile_lock``): a process that asks for a kernel while
    another compiles it waits, then loads the other's result from the disk cache."""
    k = _small_kernel(tmp_path, monkeypatch)
    sig = (core.typeof(41),)
    out = _wait_blocked(core._compile_lock(k, sig), tmp_path, 1.5, lambda: k.compile(sig))
    assert out == ["1", "0"]      # one load from the cache, no compile


def test_saves_of_one_kernel_hold_a_lock_across_processes(tmp_path, monkeypatch):
    """The save lock: a process cannot save a kernel's signature into the cache while
    another holds the lock on that kernel's index."""
    k = _small_kernel(tmp_path, monkeypatch)
    path = core._lock_path(k._cache._cache_file)
    assert path is not None and k._cache.save_overload.__name__ == "save_overload"

    def nothing_saved():
        assert not list(tmp_path.rglob("small_kernel.k-*.nbi"))

    assert _wait_blocked(core._file_lock(path, 0), tmp_path, 3, nothing_saved) == ["0", "1"]
    assert list(tmp_path.rglob("small_kernel.k-*.nbi"))


KILLED_SAVE = (
    "import os, sys\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "import small_kernel as m\n"
    "m.k._cache._cache_file._save_data = lambda *a: os._exit(9)   # killed after the index\n"
    "m.k(1.5)\n"
)
LOAD = (
    "import sys\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "import small_kernel as m\n"
    "print(m.k(1.5))\n"
)


def test_a_save_killed_after_the_index_leaves_no_stale_kernel_to_load(tmp_path, monkeypatch):
    """numba saves a kernel's index before its data, and numbers data files anew once
    the sources change: a process killed in between must not leave the index naming the
    data file of the older build (``core._drop_stale_data``)."""
    k = _small_kernel(tmp_path, monkeypatch)
    assert k(1) == 2                        # data file 1: the int64 build
    with open(tmp_path / "small_kernel.py", "a") as f:
        f.write("# an edit: the cache of the build above is stale\n")
    p = subprocess.run([sys.executable, "-c", KILLED_SAVE, str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 9, p.stderr
    p = subprocess.run([sys.executable, "-c", LOAD, str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.split() == ["2.5"], p.stderr
