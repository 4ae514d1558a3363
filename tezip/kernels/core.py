"""Shared pieces of the kernels: the numba decorators, constants, and scalar helpers that
are inlined into the loops (per-point quantization for each bound kind, the exact bound
check, context buckets, zigzag codes).

Kernels take the bound kind (``mode``) and the output type (``otype``) as compile-time
literals (``numba.literally``): each combination compiles to its own loop without
run-time branches on them."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
import sys
import threading

import numba
import numpy as np
from llvmlite import ir
from numba import typeof
from numba.core import types
from numba.extending import intrinsic

from . import fast_cache_load as _fast_cache_load
from . import inline_copy
from . import skip_blas_probe as _skip_blas_probe


def _arraymath_without_blas_probe() -> None:
    """Import ``numba.np.arraymath`` with scipy's BLAS module unimportable for the length
    of that import (see ``kernels.skip_blas_probe``), then importable again."""
    name = "scipy.linalg.cython_blas"
    if name in sys.modules or "numba.np.arraymath" in sys.modules:
        return
    sys.modules[name] = None        # an import of it raises ImportError
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]


if _skip_blas_probe and not _fast_cache_load:
    _arraymath_without_blas_probe()


def _load_without_refresh() -> None:
    """Let numba's disk cache load a kernel without refreshing the target context first
    (see ``kernels.fast_cache_load``). A miss, or any error on the way, goes to numba's
    own ``load_overload``, which refreshes and loads (or not) as before; where numba's
    cache lacks the methods used here, nothing changes."""
    try:
        from numba.core.caching import Cache
        from numba.core.runtime import rtsys
    except ImportError:
        return
    orig = Cache.load_overload
    if getattr(orig, "_tezip", False) or not hasattr(Cache, "_load_overload"):
        return

    def load_overload(self, sig, target_context):
        cres = None
        try:
            rtsys.initialize(target_context)     # the runtime (NRT) the kernels link to
            cres = self._load_overload(sig, target_context)
        except Exception:
            cres = None
        if cres is not None:
            return cres
        if _skip_blas_probe:        # the refresh below imports arraymath (a compilation)
            _arraymath_without_blas_probe()
        return orig(self, sig, target_context)

    load_overload._tezip = True  # type: ignore[attr-defined]
    Cache.load_overload = load_overload


if _fast_cache_load:
    _load_without_refresh()


def sources_stamp(folder: str) -> bytes:
    """A digest of every module in ``folder``: the regular files named ``*.py`` (an
    editor's lock file, such as Emacs's broken link ``.#core.py``, is not one). Where
    one cannot be read, a random digest: every kernel then compiles again rather than
    load what an unread edit may have made stale."""
    h = hashlib.sha256()
    try:
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if name.endswith(".py") and os.path.isfile(path):
                with open(path, "rb") as f:
                    h.update(name.encode() + b"\0" + f.read())
    except OSError:
        return os.urandom(32)
    return h.digest()


# numba's disk cache knows a kernel is stale when the file that defines it changes, but
# not when a helper it inlined from another file does (this module's above all): a
# kernel would load from the cache with the old helper compiled in. Each kernel's cache
# entry is stamped with every kernel module's source as well.
KERNELS_STAMP = sources_stamp(os.path.dirname(os.path.abspath(__file__)))


def _stamped(dispatcher):
    cache = getattr(dispatcher, "_cache", None)
    cache_file = getattr(cache, "_cache_file", None)
    if cache_file is not None and hasattr(cache_file, "_source_stamp"):
        cache_file._source_stamp = (cache_file._source_stamp, KERNELS_STAMP)
        _save_locked(cache, cache_file)
    _install_on_compile(dispatcher)
    return dispatcher


def _install_on_compile(dispatcher) -> None:
    """Install ``inline_copy`` when ``dispatcher`` first compiles (its compiler runs only
    where the disk cache has no entry: a load from the cache does not import numba's
    compiler for it)."""
    compiler = getattr(dispatcher, "_compiler", None)
    compile_ = getattr(compiler, "compile", None)
    if compile_ is None:
        return

    @functools.wraps(compile_)
    def compile_first(*args, **kwargs):
        inline_copy.install()
        compiler.compile = compile_         # (once: later compiles go straight through)
        return compile_(*args, **kwargs)

    compiler.compile = compile_first


# Processes that share numba's disk cache (the ranks of ``mpirun tezip prepare``, a test
# suite's workers) compile and save kernels at once. numba saves a kernel by reading the
# function's index, choosing a data file name not in it and writing both; two processes
# saving two signatures of one function at once can both choose the same name, and the
# index then names a data file that holds the other signature (a load failed in typing,
# or could run the other specialization's code). The save, and the compile of one
# signature, hold a lock across processes: byte 0 and one byte per signature of a file
# beside the function's index (POSIX record locks, ``fcntl.lockf``). A process that waited
# for another's compile loads its result from the cache instead of compiling it again.
# The save also drops the function's stale data files first (``_drop_stale_data``).
# Where there is no such lock (not POSIX, a file system without locks, a cache directory
# that cannot be written), nothing is locked, as before.
try:
    import fcntl
except ImportError:     # pragma: no cover (not POSIX)
    fcntl = None  # type: ignore[assignment]

_LOCK_FDS: dict[str, int] = {}     # one descriptor per lock file, never closed: closing
_LOCK_FDS_LOCK = threading.Lock()  # any descriptor of a file drops the process's locks


def _lock_path(cache_file) -> str | None:
    index = getattr(cache_file, "_index_path", None)
    return None if fcntl is None or not isinstance(index, str) else (
        os.path.splitext(index)[0] + ".lock")


@contextlib.contextmanager
def _file_lock(path: str | None, slot: int):
    """Byte ``slot`` of the file at ``path`` locked against other processes (threads of
    this one are serialized by the caller: numba's compiler lock, ``_ENTRY_LOCK``)."""
    fd = None
    if path is not None:
        with _LOCK_FDS_LOCK:
            fd = _LOCK_FDS.get(path)
            if fd is None:
                try:
                    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
                    _LOCK_FDS[path] = fd
                except OSError:
                    fd = None
    locked = False
    if fd is not None:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX, 1, slot)
            locked = True
        except OSError:
            pass
    try:
        yield
    finally:
        if locked:
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, slot)


def _save_locked(cache, cache_file) -> None:
    path = _lock_path(cache_file)
    save = getattr(cache, "save_overload", None)
    if path is None or save is None:
        return

    def save_overload(sig, data):
        with _file_lock(path, 0):
            _drop_stale_data(cache_file)
            save(sig, data)

    cache.save_overload = save_overload


def _drop_stale_data(cache_file) -> None:
    """Remove the function's data files that its index does not name. numba numbers a
    function's data files anew once its sources change (the index is then stale, read as
    empty), and saves the index before the data: a process killed in between (Ctrl-C in
    a first use's compile, ``test_kill_compress``) left an index naming the data file of
    an older build, which later processes loaded as the new one (a dispatch failure,
    "can't unbox array", or the older kernel run). Without stale files, that index names
    a missing file, which numba takes for a miss and compiles again."""
    try:
        live = set(cache_file._load_index().values())
        base = cache_file._index_name[: -len(".nbi")] + "."
        folder = cache_file._cache_path
        for name in os.listdir(folder):
            if (name.startswith(base) and name.endswith(".nbc") and name not in live
                    and name[len(base):-4].isdigit()):
                os.unlink(os.path.join(folder, name))
    except Exception:       # (another layout of numba's cache, a file gone meanwhile)
        pass


def _compile_lock(kernel, sig: tuple):
    """The lock on compiling ``kernel`` for ``sig`` (see ``_save_locked``)."""
    path = _lock_path(getattr(getattr(kernel, "_cache", None), "_cache_file", None))
    h = hashlib.blake2b(repr(sig).encode(), digest_size=4).digest()
    return _file_lock(path, 1 + int.from_bytes(h, "little") % (1 << 30))


def jit(fn):
    """Compile ``fn`` once per signature, cached on disk (stamped with all the kernels'
    sources), without the GIL."""
    return _stamped(numba.njit(cache=True, nogil=True, error_model="numpy")(fn))


_ENTRY: dict = {}
_ENTRY_LOCK = threading.Lock()


def _kind(a):
    """What decides an argument's numba type, cheaper to get than ``typeof`` (which costs
    tens of microseconds per array: a kernel call on a small sample paid more for its
    twenty arguments' types than for its work)."""
    if isinstance(a, np.ndarray):
        f = a.flags
        return (a.dtype, a.ndim, f.c_contiguous, f.f_contiguous, f.writeable, f.aligned)
    return type(a)


def call(kernel, literal: tuple[int, ...], *args):
    """Call ``kernel`` with the arguments at positions ``literal`` typed as literals.

    ``numba.literally`` alone would make every call from Python first try (and abandon)
    a compilation for plain ints; this resolves the literal signature once, compiles or
    loads it from the disk cache, and then calls the compiled entry point directly (about
    a microsecond). Safe from many threads."""
    key = (kernel, tuple(args[i] for i in literal), tuple(map(_kind, args)))
    ep = _ENTRY.get(key)
    if ep is None:
        sig = tuple(types.literal(a) if i in literal else typeof(a) for i, a in enumerate(args))
        with _ENTRY_LOCK:
            ep = _ENTRY.get(key)
            if ep is None:
                timer = _slow_compile_timer()
                try:
                    with _compile_lock(kernel, sig):
                        kernel.compile(sig)
                finally:
                    if timer is not None:
                        timer.cancel()
                ep = kernel.overloads[sig].entry_point
                _ENTRY[key] = ep
    return ep(*args)


_NOTICED = threading.Event()


def _slow_compile_timer() -> threading.Timer | None:
    """A timer that calls ``kernels.on_slow_compile`` (once per process) if the compile
    about to start takes ``kernels.SLOW_COMPILE`` seconds; a load from the disk cache ends
    well before."""
    from . import SLOW_COMPILE, on_slow_compile

    if on_slow_compile is None or _NOTICED.is_set():
        return None

    def fire() -> None:
        if not _NOTICED.is_set():
            _NOTICED.set()
            on_slow_compile()

    timer = threading.Timer(SLOW_COMPILE, fire)
    timer.daemon = True
    timer.start()
    return timer


def inline(fn):
    """A helper inlined into its callers by numba (IR inlining, typed anew at every call
    site): for helpers that take arrays (a call that passes an array costs two atomic
    reference-count updates) and for the small per-value steps of the loops (the
    decoders' rANS and bit reads, ``within``, ``to_out``, the grid-index Lorenzo's
    helpers), where an LLVM-inlined call measured up to 8% slower. Scalar helpers with
    more code go through ``scalar``."""
    return _stamped(numba.njit(cache=True, inline="always", error_model="numpy")(fn))


def outlined(fn):
    """A large helper that a kernel calls a few times per call (once per volume, each
    call site with its own constant arguments, which specialize it as literals), compiled
    as a function of its own per signature instead of inlined by numba. numba's IR
    inlining copies the callee's IR (``copy.deepcopy``) and runs its passes again at every
    call site, in the kernel's one large function: ``lorenzo.decode_pq``, which inlined
    ``_pq_dec_vol`` at four sites, compiled in 11.4 s a signature, 6.6 s with it outlined,
    and decoded 1.02-1.03x as fast (``kernel_ab.py``). Not for helpers called per row or
    per value: a call that passes arrays costs atomic reference-count updates."""
    return _stamped(numba.njit(cache=True, error_model="numpy")(fn))


def scalar(fn):
    """A helper of scalar arguments compiled once as a function of its own, which LLVM
    inlines into the kernels (no call is left in their loops). numba's IR inlining types
    a helper again at every call site, for every mode: the interpolation kernels, which
    call ``quantize`` and ``exact_value`` from two copies of their run loop, compiled in
    about a third of the time with these (352 s -> 122 s of the fast suite's first run),
    at the same speed within this machine's noise (``speed_ab_2026-11-26b.md``: encoding
    0.97-1.04x, decoding 0.98-1.16x)."""
    return _stamped(numba.njit(cache=True, error_model="numpy")(fn))


@intrinsic
def f64_bits(typingctx, x):
    """The IEEE bit pattern of a float64 as an int64 (a register move)."""
    if isinstance(x, types.Float) and x.bitwidth == 64:
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.IntType(64))
        return types.int64(types.float64), codegen
    return None


@intrinsic
def bits_f64(typingctx, x):
    """The float64 of an IEEE bit pattern held in an int64 (``f64_bits`` undone)."""
    if x == types.int64:
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.DoubleType())
        return types.float64(types.int64), codegen
    return None


@intrinsic
def mulhi(typingctx, a, b):
    """High 64 bits of the 128-bit product of two uint64 (one ``mul`` on x86-64)."""
    if a == types.uint64 and b == types.uint64:
        def codegen(context, builder, signature, args):
            i128 = ir.IntType(128)
            p = builder.mul(builder.zext(args[0], i128), builder.zext(args[1], i128))
            return builder.trunc(builder.lshr(p, ir.Constant(i128, 64)), ir.IntType(64))
        return types.uint64(types.uint64, types.uint64), codegen
    return None


@intrinsic
def bit_length(typingctx, a):
    """Number of significant bits of a uint64 (0 for 0)."""
    if a == types.uint64:
        def codegen(context, builder, signature, args):
            i64 = ir.IntType(64)
            lz = builder.ctlz(args[0], ir.Constant(ir.IntType(1), 0))
            return builder.sub(ir.Constant(i64, 64), lz)
        return types.int64(types.uint64), codegen
    return None


@intrinsic
def pick(typingctx, c, a, b):
    """``a if c else b`` for a boolean and two float64 as one ``select``: no branch, so
    the arrays a helper reads stay in one basic block and numba's reference-count
    pruning removes their updates (an inlined helper with a branch around an array read
    pays two atomic reference-count calls per value)."""
    if isinstance(c, types.Boolean) and a == types.float64 and b == types.float64:
        def codegen(context, builder, signature, args):
            return builder.select(args[0], args[1], args[2])
        return types.float64(types.boolean, types.float64, types.float64), codegen
    return None


@intrinsic
def ipick(typingctx, c, a, b):
    """``pick`` for two int64: one ``select``."""
    if isinstance(c, types.Boolean) and a == types.int64 and b == types.int64:
        def codegen(context, builder, signature, args):
            return builder.select(args[0], args[1], args[2])
        return types.int64(types.boolean, types.int64, types.int64), codegen
    return None


from .consts import (  # noqa: E402,F401 (re-exported for the kernels)
    ALPHABET,
    ESC,
    FC_SHIFT,
    FLAG,
    KMAX,
    MODE_FLOAT,
    MODE_INT,
    MODE_LOG,
    NB,
    OUT,
    OUT_F32,
    OUT_F64,
    OUT_INT,
    PREC,
    RANS_L,
    RUN_CHUNK,
    M,
)


@inline
def within(x, y, lim):
    """|x - y| <= lim, decided exactly (TwoSum error term where it matters)."""
    s = x - y
    a = abs(s)
    if a < lim:
        return True
    if a == lim:
        bb = s - x
        t = (x - (s - bb)) + (-y - bb)
        return t <= 0.0 if s > 0.0 else t >= 0.0
    return False


_TOP = float(2 ** ((NB - 2) // 2))     # 16 r at the start of the top bucket, NB - 1
assert NB % 2 == 0


@inline
def bucket16(y):
    """Bucket of an activity ratio r >= 0 given as y = 16 r: 0 below 1/16 (and for
    y < 0.75, which is below 1/16 or in its upper half-octave, bucket 0 too), then two
    per octave, capped at NB - 1 (NaN too); read off the float's exponent and top
    mantissa bit (exact). The clamps come first, on the float (min/max: no branch), so
    the bits need no clamp after."""
    y = pick(y < _TOP, y, _TOP)          # NaN fails the test too: NB - 1
    y = pick(y > 0.75, y, 0.75)          # 0.75 = 1.5 x 2^-1: bucket 0
    return (f64_bits(y) >> 51) - 2045    # 1 + 2 x exponent + top mantissa bit


@inline
def bucket(r):
    """Bucket of an activity ratio r >= 0 (``bucket16`` of 16 r)."""
    return bucket16(r * 16.0)


@inline
def finite(v):
    return v if abs(v) < np.inf else 0.0


@inline
def to_out(v, otype, lo, hi):
    """Round a reconstruction into the output type (as float64)."""
    if otype == OUT_F32:
        return np.float64(np.float32(v))
    if otype == OUT_INT:
        r = np.floor(v + 0.5)       # a float (see ``quantize``), so NaN stays NaN here
        if math.isnan(r):
            r = 0.0
        return lo if r < lo else (hi if r > hi else r)
    return v


@inline
def pw_limit(eb, av):
    """The point-wise relative limit for |x| = ``av``: at or below the exact product
    eb * av (its rounding taken off; on a subnormal, whose rounding error is absolute, up
    to half a step of the subnormal grid, one step down)."""
    lim = eb * av
    lim = lim - lim * 2.3e-16
    if lim < 2.2250738585072014e-308:
        lim = max(lim - 5e-324, 0.0)
    return lim


@jit
def pw_limits(eb, av):
    """``pw_limit`` of every value of ``av`` (the checker's limits are the encoder's)."""
    a = av.ravel()
    out = np.empty(a.size, np.float64)
    for i in range(a.size):
        out[i] = pw_limit(eb, a[i])
    return out.reshape(av.shape)


@scalar
def quantize(mode, otype, xo, pt, step, inv, e_int, eb, lo, hi, sg):
    """One value ``xo`` against its prediction ``pt`` (log domain for MODE_LOG).
    Returns (code, output value, log-domain reconstruction, ok); not ok: an outlier.

    Floors are ``np.floor``, a float: ``math.floor`` returns an int64 here, and its
    conversions there and back sat on the path from one value to the next (Lorenzo), and
    turned a quotient of 2^63 or more into -2^63, whose ``abs`` overflows and passed the
    range check (a float32 value of 2^53 next to zeros under an absolute bound of 2^-11
    was given the code -2^63 and wrote a file that failed its own checksum)."""
    if mode == MODE_INT:
        if not (abs(pt) < 1e300):
            pt = 0.0
        pr = np.floor(pt + 0.5)
        # floor(v / step) of integers by a multiplication by the reciprocal (a division
        # would sit on the path from one value to the next in Lorenzo order)
        v = xo - pr + e_int
        if abs(v) < 1125899906842624.0:     # 2^50
            # (v + 1/2) / step is at least 1/(2 step) from an integer and the rounding
            # errors of (v + 1/2) x inv are below that: its floor is exact, and so is v
            # itself here (x and the rounded prediction are integers, and a difference
            # that rounded would be past 2^52): the value is within the bound
            kf = np.floor((v + 0.5) * inv)
            if abs(kf) <= KMAX:
                o = pr + kf * step
                o = lo if o < lo else (hi if o > hi else o)
                return np.int64(kf), o, o, True
            return np.int64(0), xo, xo, False
        # past 2^50 (a forecast base gone astray): floor(v x inv), off by at most one
        # next to a multiple, corrected exactly (the correction as float selects: the
        # same values as the booleans subtracted as integers, without conversions); v
        # itself may have rounded past 2^53, so the bound is checked (exact: integers in
        # the output type's range)
        kf = np.floor(v * inv)
        rem = v - kf * step
        kf += pick(rem >= step, 1.0, 0.0) - pick(rem < 0.0, 1.0, 0.0)
        if abs(kf) <= KMAX:
            o = pr + kf * step
            o = lo if o < lo else (hi if o > hi else o)
            if abs(o - xo) <= eb:
                return np.int64(kf), o, o, True
        return np.int64(0), xo, xo, False
    if mode == MODE_FLOAT:
        t = (xo - pt) * inv
        kf = np.floor(t + 0.5)
        if abs(kf) <= KMAX:
            o = to_out(pt + kf * step, otype, lo, hi)
            if abs(xo - o) < eb:        # (``within``'s first test)
                return np.int64(kf), o, o, True
            # at the bound or past it. A tie (t = n + 1/2, n >= 0) goes to n, toward 0,
            # as the negative ones do, where that is within the bound: integer values
            # under a bound of 1/2 tie wherever the prediction is a half-integer, and
            # rounded up each tie made a reconstruction off by the whole bound, whose
            # neighbours then missed theirs. (t may be a tie only after its rounding,
            # the residual past it: then n + 1, as before.) A tie whose code above is
            # inside the bound keeps it, as before 0.7.2: every tie at a level whose
            # step is under 2 eb (``ab``), and where the reconstruction's rounding
            # lands inside. Tested here, after the common case: tested first (0.7.2),
            # LLVM put the test of kf's sign first, a branch that went either way at
            # random (a quarter of iris's codes are positive), and encoding iris took
            # 2.5x as long in this kernel
            if kf - t == 0.5 and kf > 0.0:
                o1 = to_out(pt + (kf - 1.0) * step, otype, lo, hi)
                if within(xo, o1, eb):
                    return np.int64(kf - 1.0), o1, o1, True
            if within(xo, o, eb):
                return np.int64(kf), o, o, True
        return np.int64(0), xo, xo, False
    # MODE_LOG: |x - x'| <= eb |x|
    av = abs(xo)
    if av > 0.0 and av < np.inf:
        kf = np.floor((math.log2(av) - pt) * inv + 0.5)
        if abs(kf) <= KMAX:
            r = pt + kf * step
            o = to_out(sg * math.exp2(r), otype, lo, hi)
            if within(xo, o, pw_limit(eb, av)):
                return np.int64(kf), o, r, True
    return np.int64(0), xo, xo, False


@scalar
def reconstruct(mode, otype, k, pt, step, lo, hi, sg):
    """Decoder side of ``quantize``: (output value, log-domain reconstruction)."""
    if mode == MODE_INT:
        if not (abs(pt) < 1e300):
            pt = 0.0
        o = np.floor(pt + 0.5) + k * step
        o = lo if o < lo else (hi if o > hi else o)
        return o, o
    if mode == MODE_FLOAT:
        o = to_out(pt + k * step, otype, lo, hi)
        return o, o
    r = pt + k * step
    return to_out(sg * math.exp2(r), otype, lo, hi), r


@scalar
def log_of_exact(v, pt):
    """Log-domain reconstruction of a value stored exactly (log2|v| of a finite non-zero
    value, else the prediction, so that neighbours keep a usable prediction)."""
    av = abs(v)
    if av > 0.0 and av < np.inf:
        return math.log2(av)
    return pt


@scalar
def exact_value(mode, otype, v, p, pt, b, lo, hi):
    """A value stored exactly (an outlier), given the prediction ``p`` (``pt`` with the
    base ``b``): (what the output holds, what the prediction domain holds). A non-finite
    value leaves a finite placeholder, which the caller replaces afterwards: 0 in the log
    domain (the prediction domain keeps the prediction), else the prediction rounded into
    the output type. Encoders and decoders both store it so."""
    if abs(v) < np.inf:
        return v, (log_of_exact(v, p) if mode == MODE_LOG else v - b)
    if mode == MODE_LOG:
        return 0.0, p
    o = to_out(finite(pt), otype, lo, hi)
    return o, o - b


@inline
def unzigzag(z):
    return (z >> 1) ^ -(z & 1)


# --- decoding steps shared by the fused decoders -----------------------------------------
# Scalar only: the loops load from the arrays and pass values in (an array passed to an
# inlined helper costs two atomic reference-count updates per call).


@inline
def rans_next(x0, x1, slot, f, word, wp):
    """Advance the decoding state x0 past a symbol of frequency/cumulative ``f`` (freq
    << FC_SHIFT | cum) read at ``slot``; ``word`` is the next 16-bit word of the stream (used
    only when the state needs it). Returns the states swapped (x1 decodes next)."""
    f = np.int64(f)
    x0 = (f >> FC_SHIFT) * (x0 >> PREC) + slot - (f & ((1 << FC_SHIFT) - 1))
    if x0 < RANS_L:
        x0 = (x0 << 16) | word
        wp += 1
    return x1, x0, wp


@inline
def bits_at(a, b, bpos, n):
    """n (<= 63) bits at bit position ``bpos`` of a little-endian stream of 64-bit words,
    ``a`` the word holding bit ``bpos`` and ``b`` the next one. Returns (value, bpos + n)."""
    sh = np.uint64(bpos & 63)
    v = (a >> sh) | ((b << np.uint64(1)) << (np.uint64(63) - sh))
    return v & ((np.uint64(1) << np.uint64(n)) - np.uint64(1)), bpos + n


@inline
def dense_low(kbs):
    """Whether the decoders read every code's low bits without a branch on its class's
    count: where at least half the classes have low bits, the classes of successive
    codes alternate between none and some often enough (12-18% of codes on iris at
    1e-4) that the branch mispredicts more than the read of zero bits costs; where few
    have any (fewer than a quarter on the shared stacks at 1e-3), the branch predicts
    well and is the cheaper."""
    m = 0
    for c in range(kbs.size):
        m += kbs[c] > 0
    return 2 * m >= kbs.size


BITS_PER_POINT = 131   # the most bits of the bit stream one point reads: 62 low bits
#                        and an escape (6-bit length, up to 63 bits)


@inline
def run_start(wp, bpos, nw, nl, cnt):
    """The stream positions a decoder's run of ``cnt`` points starts from, bounded so
    that the run reads inside ``words`` (``nw`` of them; a point reads one, ahead) and
    ``lw`` (``nl``): the streams are padded for the longest run (``entropy.tables``), so
    the bounds never move a position of an intact stream (its word position is at most
    the stream's length, its bit position at most its bits), and a damaged stream's
    position, moved, stays past the stream's end (the end check fails). ``padded``
    checks the padding once per call."""
    wmax = nw - cnt
    bmax = 64 * (nl - 2) - BITS_PER_POINT * cnt
    return (wp if wp < wmax else wmax), (bpos if bpos < bmax else bmax)


@inline
def padded(words, lw, st, n):
    """Whether the streams carry the padding for runs of up to ``n`` points (the frame
    width, or RUN_CHUNK for wider frames: the decoders bound their positions again every
    RUN_CHUNK points, so the padding stays small): as
    ``entropy.tables`` records it in the decoder state (``st[4]``; an intact stream
    could fail its end check without it), and as their sizes allow (without which
    ``run_start``'s bounds would not keep the reads inside them)."""
    return st[4] >= n and words.size >= n + 2 and lw.size >= 3 * n + 2


@inline
def ctx_entries(cmap, kbs):
    """Per context, its class and the class's low bits in one entry, class << 8 | low
    bits (< 63; 16 bits): one load where the decoders made two, each waiting on the one
    before."""
    ce = np.empty(cmap.size, np.uint16)
    for j in range(cmap.size):
        c = np.int64(cmap[j])
        ce[j] = np.uint16((c << 8) | kbs[c])
    return ce


@jit
def escape_high(lw, bpos):
    """An escaped high part: 6-bit length, then that many bits (a real call: rare)."""
    nlw = lw.size - 2
    w = bpos >> 6
    w = w if w < nlw else nlw
    ln, bpos = bits_at(lw[w], lw[w + 1], bpos, 6)
    w = bpos >> 6
    w = w if w < nlw else nlw
    v, bpos = bits_at(lw[w], lw[w + 1], bpos, np.int64(ln))
    return np.uint64(ESC) + v, bpos


def words64(data: bytes, extra: int = 0) -> np.ndarray:
    """A bit stream as native uint64 words (little-endian order), padded with two zero
    words so that ``bits_at`` may always read the word after, and ``extra`` more."""
    n = (len(data) + 7) // 8
    w = np.zeros(n + 2 + extra, np.uint64)
    w.view(np.uint8)[:len(data)] = np.frombuffer(data, np.uint8)
    if sys.byteorder != "little":
        w.byteswap(inplace=True)
    return w
