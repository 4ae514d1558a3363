"""Compiled kernels (numba) for the hot loops of the codec.

Every kernel is a pure function over numpy arrays, compiled once per signature and cached
on disk (``cache=True``; numba falls back to a per-user cache directory where the package
is read-only). ``nogil=True``: windows are coded in parallel threads.

Arithmetic is reproducible: numba emits plain IEEE operations (no fused multiply-add, no
reassociation; checked in tests), so encoder and decoder compute the same predictions bit
for bit, and integer codes and the exact bound check carry the guarantee. Decoders never
read or write out of bounds whatever their input: a damaged stream gives wrong values,
caught by the per-window checksum, or an error flag, never a crash.
"""

from __future__ import annotations

from collections.abc import Callable

# Called once per process, from a timer thread, when compiling a kernel has taken
# SLOW_COMPILE seconds (the first use of a data type and bound kind on a machine: numba
# compiles for up to a minute, then loads from its disk cache). The command line sets it
# so that a user knows what the wait is; None (library use): silent.
on_slow_compile: Callable[[], None] | None = None
SLOW_COMPILE = 2.0

# Set by the command line, in its own process, before any kernel module is imported:
# numba's first compile or cache load imports ``numba.np.arraymath``, which imports
# scipy.linalg (installed with scikit-image) only to learn whether BLAS is there for
# np.dot and np.correlate; no tezip kernel uses them, and the import took 0.3-0.45 s
# of every coding command's 1.4 s here. ``core`` then imports arraymath with that probe
# failing (numba falls back to its own loops for those functions in this process). Off
# for library use: a user's own numba code keeps BLAS.
skip_blas_probe = False

# Set by the command line with ``skip_blas_probe``: numba loads a kernel from its disk cache
# without first building its compiler's tables (``BaseContext.refresh``: every typing and
# lowering registry, 0.1-0.15 s of each coding command's 0.7-1.0 s here), which only a
# compilation needs; a compilation (a kernel not in the cache) still builds them first.
# The loaded machine code is the same. Off for library use.
fast_cache_load = False
