"""Benchmark tezip against the established compressors on (T, H, W) stacks.

For every data set (a ``.npy`` file, loaded whole) and every bound, measured in one
process in one run:

- lossy bounds (a fraction of the value range ``max - min`` over the finite values):
  tezip (one row per predictor), SZ3 3-D (``pysz``, absolute bound), ZFP 3-D (``zfpy``,
  fixed-accuracy mode) and SPERR 3-D (``imagecodecs``, point-wise error mode);
- ``None`` = lossless: tezip, zstd level 3 and level 19 on the raw bytes, blosc2 (zstd
  level 5 after byte shuffle and after bit shuffle, one thread), JPEG-XL and JPEG-LS
  lossless frame by frame (``imagecodecs``; unsigned 8/16-bit data only), FFV1 and x265
  lossless through ``ffmpeg`` when it is on the PATH (unsigned 8/16-bit only; x265 takes at
  most 12 bits).

Each row holds the compression ratio (raw bytes / compressed bytes), encode and decode
speed in MB/s (1 MB = 1e6 bytes of raw input; wall time of the best of ``repeat`` runs,
which go in rounds over all codecs of a data set and bound, each round in another order,
so that a slow spell of the machine does not land on one codec's runs alone; a row whose
first run takes over ``REPEAT_MAX_SECONDS`` is timed once, or run once more first where
that run loaded or compiled a tezip kernel),
the maximum absolute error, the absolute bound it must stay within and whether it did
(lossless rows: whether the output is bit-exact), and for lossy rows the PSNR in dB with
the value range as peak.

Integer data: tezip gets the relative bound in mode ``rel`` (it uses the integer part of
the absolute bound); SZ3, ZFP and SPERR get that floored absolute bound. SZ3 takes
integers as int32/int64, zfpy's fixed-accuracy mode and SPERR only floats, so integer data
go to ZFP and SPERR as floats (SPERR's output is rounded back to integers; ZFP's error is
checked on the converted values; the rows' notes say so).

Every codec except tezip and zstd is optional: a missing package or program gives a row
whose note starts with ``skipped:``, never a crash; so does a codec that cannot take the
data (a float stack for the integer image codecs; lossless floats for tezip's ``learned``
predictor, which codes bounded and lossless integer data only). ``ffmpeg`` runs as a
child process per encode and per decode, so its timings include starting it.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import subprocess
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import tezip
from tezip.errors import OptionError, UnsupportedError
from tezip.quantize import relative_bound

DEFAULT_BOUNDS: tuple[float | None, ...] = (1e-2, 1e-3, 1e-4, None)
LOSSLESS = "lossless"
SZ3 = "SZ3 3-D"
ZFP = "ZFP 3-D"
SPERR = "SPERR 3-D"
ZSTD3 = "zstd-3"
ZSTD19 = "zstd-19"
BLOSC2_SHUFFLE = "blosc2-zstd5-shuffle"
BLOSC2_BITSHUFFLE = "blosc2-zstd5-bitshuffle"
JPEGXL = "JPEG-XL"
JPEGLS = "JPEG-LS"
FFV1 = "FFV1"
X265 = "x265"

#: codec families ``run(codecs=...)`` can choose from (tezip is always measured)
LOSSY_FAMILIES = ("sz3", "zfp", "sperr")
LOSSLESS_FAMILIES = ("zstd", "blosc2", "jpegxl", "jpegls", "ffv1", "x265")
FAMILIES = LOSSY_FAMILIES + LOSSLESS_FAMILIES

Row = dict[str, Any]
Progress = Callable[[str], None]


# ---------------------------------------------------------------------------------------
# measuring


def parse_bounds(text: str) -> list[float | None]:
    """'1e-2,1e-3,lossless' -> [0.01, 0.001, None]; a relative bound must be in (0, 1).
    Raises ValueError naming the bad item (argparse shows it as a usage error)."""
    out: list[float | None] = []
    for item in text.replace(" ", ",").split(","):
        if not item:
            continue
        if item.lower() in ("lossless", "none", "0"):
            out.append(None)
            continue
        value = float(item)
        if not 0 < value < 1:
            raise ValueError(f"a relative bound must be in (0, 1): {item}")
        out.append(value)
    if not out:
        raise ValueError("no bounds given")
    return out


#: a row whose first run (encoding and decoding) takes longer is not timed again: such a
#: run (``--adapt``'s fit of 30 s, zstd-19 on the larger stacks) is not one whose speed is
#: compared closely, and repeating it took most of a run's time
REPEAT_MAX_SECONDS = 10.0


_LOADS = [0]      # numba's compiler lock taken in this process (``_kernel_loads``)
_LISTENING: list[bool] = []


def _kernel_loads() -> int:
    """How many times numba has loaded or compiled a kernel in this process so far (its
    ``numba:compiler_lock`` events, counted from the first call on): a first run that
    did either is timed again (``_measure``)."""
    if not _LISTENING:
        from numba.core import event

        class _Count(event.Listener):
            def on_start(self, ev: Any) -> None:
                _LOADS[0] += 1

            def on_end(self, ev: Any) -> None:
                pass

        event.register("numba:compiler_lock", _Count())
        _LISTENING.append(True)
    return _LOADS[0]


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Run ``fn`` once: (wall time, its result)."""
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _mbs(nbytes: int, seconds: float) -> float:
    return nbytes / 1e6 / seconds if seconds > 0 else math.inf


def value_range(a: np.ndarray) -> tuple[float, float]:
    """(min, max) over the finite values; (0, 0) if there are none."""
    x = a[np.isfinite(a)] if a.dtype.kind == "f" else a
    if x.size == 0:
        return 0.0, 0.0
    return float(x.min()), float(x.max())


def max_abs_error(orig: np.ndarray, dec: np.ndarray) -> float:
    """max |orig - dec| over the finite values of ``orig``; inf if the shapes differ, a
    decoded value is not finite where the original is, or a NaN/Inf was not kept."""
    if orig.shape != dec.shape:
        return math.inf
    o = orig.astype(np.float64, copy=False)
    d = dec.astype(np.float64, copy=False)
    fin = np.isfinite(o)
    if not fin.all():
        o_bad, d_bad = o[~fin], d[~fin]
        same = (o_bad == d_bad) | (np.isnan(o_bad) & np.isnan(d_bad))
        if not same.all():
            return math.inf
        o, d = o[fin], d[fin]
    if o.size == 0:
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(o - d)
    if np.isnan(err).any():
        return math.inf
    return float(err.max())


def psnr(orig: np.ndarray, dec: np.ndarray, peak: float) -> float | None:
    """Peak signal-to-noise ratio in dB over the values finite in both arrays, with
    ``peak`` (the value range of the original) as the peak; inf for an exact copy, None if
    the shapes differ or there is no range."""
    if orig.shape != dec.shape:
        return None
    o = orig.astype(np.float64, copy=False)
    d = dec.astype(np.float64, copy=False)
    fin = np.isfinite(o) & np.isfinite(d)
    if not fin.all():
        o, d = o[fin], d[fin]
    if o.size == 0:
        return None
    diff = o - d
    mse = float(np.mean(diff * diff))
    if mse == 0:
        return math.inf
    if not peak > 0:
        return None
    return 20 * math.log10(peak) - 10 * math.log10(mse)


def bit_exact(orig: np.ndarray, dec: np.ndarray) -> bool:
    """Same shape, type and bytes of the values (so NaN payloads and -0.0 count), in
    either byte order (a big-endian stack comes back in the machine's order)."""
    native = orig.dtype.newbyteorder("=")
    if orig.shape != dec.shape or native != dec.dtype.newbyteorder("="):
        return False
    return bool(np.array_equal(np.ascontiguousarray(orig, native).view(np.uint8),
                               np.ascontiguousarray(dec, native).view(np.uint8)))


@dataclass
class _Case:
    """One data set at one bound: what every codec function gets."""

    name: str
    a: np.ndarray
    bound: float | None      # relative bound, None = lossless
    bound_abs: float         # what the output is checked against
    eb: float                # the absolute bound the lossy codecs are given
    note: str                # said on every lossy row of this case
    repeat: int
    vrange: tuple[float, float]
    # the rows measured once so far, to be timed again (``_repeat_rounds``)
    pending: list[_Timing] = field(default_factory=list)

    @property
    def peak(self) -> float:
        return self.vrange[1] - self.vrange[0]


@dataclass
class _Timing:
    """A row measured once, with what times it again: its best times so far."""

    row: Row
    encode: Callable[[], Any]
    decode: Callable[[Any], np.ndarray]
    blob: Any
    t_enc: float
    t_dec: float


def _row(case: _Case, codec: str, **kw: Any) -> Row:
    a = case.a
    row: Row = {
        "dataset": case.name, "bound": LOSSLESS if case.bound is None else case.bound,
        "codec": codec, "ratio": None, "enc_mbs": None, "dec_mbs": None,
        "max_abs_error": None, "bound_abs": case.bound_abs, "ok": None, "psnr": None,
        "note": "", "compressed_bytes": None, "raw_bytes": int(a.nbytes),
        "dtype": a.dtype.name, "shape": list(a.shape), "value_range": list(case.vrange),
    }
    row.update(kw)
    return row


def _skip(case: _Case, codec: str, why: str, note: str = "") -> Row:
    return _row(case, codec, note=_join(note, f"skipped: {why}"))


def _measure(row: Row, case: _Case, encode: Callable[[], Any],
             decode: Callable[[Any], np.ndarray], size: Callable[[Any], int],
             check: Callable[[np.ndarray], tuple[float, bool]],
             unsupported: tuple[type[Exception], ...] = ()) -> Row:
    """Fill ``row`` with ratio, speeds, PSNR (lossy rows) and the error check, from one
    run; with ``case.repeat`` > 1 the row is timed again in ``_repeat_rounds`` (the
    speeds are then the best of all runs). A failure is recorded in the row (``ok``
    False, the traceback in ``error``) rather than raised. ``unsupported``: exceptions
    by which ``encode`` refuses the data by design; the row is then skipped with the
    exception's message as the reason, not failed."""
    a = case.a
    try:
        loads = _kernel_loads()
        t_enc, blob = _timed(encode)
        t_dec, dec = _timed(lambda: decode(blob))
        if (case.repeat > 1 and t_enc + t_dec > REPEAT_MAX_SECONDS
                and _kernel_loads() != loads):
            # its first run compiled or loaded a kernel the warm-up's corner did not
            # need (a run-coded decoder: the corner is too small for runs): once more
            t_enc, blob = _timed(encode)
            t_dec, dec = _timed(lambda: decode(blob))
        n = int(size(blob))
        err, ok = check(dec)
        row.update(ratio=a.nbytes / n if n else math.inf, compressed_bytes=n,
                   enc_mbs=_mbs(a.nbytes, t_enc), dec_mbs=_mbs(a.nbytes, t_dec),
                   max_abs_error=err, ok=bool(ok))
        if row["bound"] != LOSSLESS:
            row["psnr"] = psnr(a, dec, case.peak)
        if not ok:
            what = "BOUND VIOLATED" if row["bound"] != LOSSLESS else "NOT BIT-EXACT"
            if err == math.inf:
                what += " (NaN/Inf not reproduced, or wrong shape)"
            row["note"] = _join(row["note"], what)
        elif case.repeat > 1 and t_enc + t_dec > REPEAT_MAX_SECONDS:
            row["note"] = _join(row["note"], f"timed once (a run takes {t_enc + t_dec:.0f} s)")
        elif case.repeat > 1:
            case.pending.append(_Timing(row, encode, decode, blob, t_enc, t_dec))
    except unsupported as exc:
        row.update(note=_join(row["note"], f"skipped: {exc}"))
    except Exception as exc:  # noqa: BLE001 - a benchmark reports failures, it does not stop
        row.update(ok=False, error=traceback.format_exc(),
                   note=_join(row["note"], f"FAILED: {type(exc).__name__}: {exc}"))
    return row


#: a row's fields that a measurement fills
_MEASURED = ("ratio", "compressed_bytes", "enc_mbs", "dec_mbs", "max_abs_error", "psnr")


def _repeat_rounds(case: _Case) -> list[Row]:
    """Time every row of ``case.pending`` ``case.repeat - 1`` more times, in rounds over
    all of them (each round starting one row further on), and keep each row's best
    times. Interleaved, so that the rows compared with each other share the machine's
    slow and quick spells (run back to back, a codec's repeats could all fall in one).
    A run that raises fails its row, as in ``_measure``; returns the rows that failed."""
    live = list(case.pending)
    case.pending.clear()
    failed: list[Row] = []
    for r in range(case.repeat - 1):
        if not live:
            break
        k = r % len(live)
        for m in live[k:] + live[:k]:
            try:
                t_enc, _ = _timed(m.encode)
                t_dec, _ = _timed(lambda m=m: m.decode(m.blob))
            except Exception as exc:  # noqa: BLE001 - reported in the row, as in _measure
                # the row then reads as one that failed on its first run: no ratio,
                # speed or error (its output was right; it is the run that failed)
                m.row.update({f: None for f in _MEASURED}, ok=False,
                             error=traceback.format_exc(),
                             note=_join(m.row["note"],
                                        f"FAILED on a repeat: {type(exc).__name__}: {exc}"))
                failed.append(m.row)
                live.remove(m)
                continue
            m.t_enc, m.t_dec = min(m.t_enc, t_enc), min(m.t_dec, t_dec)
    for m in live:
        m.row.update(enc_mbs=_mbs(case.a.nbytes, m.t_enc),
                     dec_mbs=_mbs(case.a.nbytes, m.t_dec))
    return failed


def failed_tezip_rows(rows: list[Row]) -> list[Row]:
    """tezip's rows that broke their bound, were not bit-exact or failed (another codec's
    failure is that codec's, reported in its row)."""
    return [r for r in rows if str(r["codec"]).startswith("tezip") and r.get("ok") is False]


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


# ---------------------------------------------------------------------------------------
# codecs


def _lossy_check(orig: np.ndarray, bound_abs: float) -> Callable[[np.ndarray], tuple[float,
                                                                                       bool]]:
    def check(dec: np.ndarray) -> tuple[float, bool]:
        err = max_abs_error(orig, dec)
        return err, err <= bound_abs
    return check


def _lossless_check(orig: np.ndarray) -> Callable[[np.ndarray], tuple[float, bool]]:
    def check(dec: np.ndarray) -> tuple[float, bool]:
        return max_abs_error(orig, dec), bit_exact(orig, dec)
    return check


#: seconds ``--adapt`` may spend fitting the forecaster (the ``adapt`` predictor spec)
ADAPT_SECONDS = 30.0


def tezip_spec(spec: str) -> tuple[str, dict, int]:
    """A tezip row's spec -> (predictor, extra options, threads): ``auto``, ``classical``,
    ``learned`` or a classical predictor's name; ``adapt`` is auto with ``--adapt``; a
    suffix ``@N`` runs N threads (default 1: one core per codec, like the others)."""
    name, _, th = spec.partition("@")
    threads = int(th) if th else 1
    if name == "adapt":
        return "auto", {"adapt": True, "adapt_seconds": ADAPT_SECONDS}, threads
    return name, {}, threads


def _tezip_rows(case: _Case, predictors: Sequence[str]) -> list[Row]:
    a, rows = case.a, []
    for spec in predictors:
        pred, extra, threads = tezip_spec(spec)
        codec = "tezip" if spec == "auto" else f"tezip-{spec}"
        row = _row(case, codec)
        if case.bound is None:
            def enc(pred: str = pred, extra: dict = extra, threads: int = threads) -> bytes:
                return tezip.compress(a, mode="lossless", bound=None, predictor=pred,
                                      threads=threads, **extra)
            check = _lossless_check(a)
        else:
            def enc(pred: str = pred, bound: float = case.bound, extra: dict = extra,
                    threads: int = threads) -> bytes:
                return tezip.compress(a, mode="rel", bound=bound, predictor=pred,
                                      threads=threads, **extra)
            check = _lossy_check(a, case.bound_abs)
            if case.bound_abs == 0:
                row["note"] = "bound floors to 0 for integers: tezip codes losslessly"
        if threads > 1:
            row["note"] = _join(row["note"], f"{threads} threads")

        def dec(blob: bytes, threads: int = threads) -> np.ndarray:
            return tezip.decompress(blob, threads=threads)

        # data refused by design before anything is encoded (UnsupportedError: a dtype
        # tezip does not code, a single frame; OptionError, the learned predictor: lossless
        # floats, no model installed; the wavelet: lossless data) skips the row, as for a
        # codec that cannot take the data: it is not failed
        unsupported = (UnsupportedError, OptionError) if pred in ("learned", "wavelet") \
            else (UnsupportedError,)
        rows.append(_measure(row, case, enc, dec, len, check, unsupported))
    return rows


def _sz3_rows(case: _Case) -> list[Row]:
    a, note = case.a, case.note
    try:
        import pysz
    except ImportError:
        return [_skip(case, SZ3, "pysz (SZ3) is not installed", note)]
    if a.dtype.kind == "f":
        work = np.dtype(a.dtype)
    elif a.dtype.kind in "iu" and a.dtype.itemsize <= 2:
        work = np.dtype(np.int32)
    elif a.dtype.kind in "iu":
        work = np.dtype(np.int64)
    else:
        return [_skip(case, SZ3, f"SZ3 does not take {a.dtype}", note)]
    row = _row(case, SZ3, note=note)
    if work != a.dtype:
        row["note"] = _join(row["note"], f"{a.dtype} given to SZ3 as {work.name} "
                            "(conversions timed)")
    shape, eb = a.shape, case.eb

    def enc() -> np.ndarray:
        cfg = pysz.szConfig(shape)
        cfg.errorBoundMode = pysz.szErrorBoundMode.ABS
        cfg.absErrorBound = float(eb)
        comp, _ = pysz.sz.compress(np.ascontiguousarray(a, dtype=work), cfg)
        return comp

    def dec(comp: np.ndarray) -> np.ndarray:
        out, _ = pysz.sz.decompress(comp, work, shape)
        if work != a.dtype:
            info = np.iinfo(a.dtype)
            out = np.clip(out, info.min, info.max).astype(a.dtype)
        return out

    return [_measure(row, case, enc, dec, lambda c: c.nbytes,
                     _lossy_check(a, case.bound_abs))]


def _zfp_rows(case: _Case) -> list[Row]:
    a, note, bound_abs = case.a, case.note, case.bound_abs
    try:
        import zfpy
    except ImportError:
        return [_skip(case, ZFP, "zfpy (ZFP) is not installed", note)]
    if a.dtype.kind == "f":
        work = np.dtype(a.dtype)
    elif a.dtype.kind in "iu" and a.dtype.itemsize <= 2:
        work = np.dtype(np.float32)  # exact for 8- and 16-bit integers
    elif a.dtype.kind in "iu":
        work = np.dtype(np.float64)  # exact up to 2**53
    else:
        return [_skip(case, ZFP, f"ZFP does not take {a.dtype}", note)]
    row = _row(case, ZFP, note=note)
    ref = a
    rounded = a.dtype.kind in "iu" and bound_abs == 0
    if work != a.dtype:
        ref = a.astype(work)
        row["note"] = _join(row["note"], f"{a.dtype} given to ZFP as {work.name} (conversion "
                            f"timed); error checked on the {work.name} values"
                            + (" rounded to integers" if rounded else ""))
    eb = case.eb

    def enc() -> bytes:
        return zfpy.compress_numpy(np.ascontiguousarray(a, dtype=work), tolerance=float(eb))

    def dec(blob: bytes) -> np.ndarray:
        out = zfpy.decompress_numpy(blob)
        return np.rint(out) if rounded else out

    return [_measure(row, case, enc, dec, len, _lossy_check(ref, bound_abs))]


def _sperr_rows(case: _Case) -> list[Row]:
    a, note = case.a, case.note
    try:
        import imagecodecs
    except ImportError:
        return [_skip(case, SPERR, "imagecodecs (for SPERR) is not installed", note)]
    if not getattr(getattr(imagecodecs, "SPERR", None), "available", False):
        return [_skip(case, SPERR, "this imagecodecs build has no SPERR", note)]
    if a.dtype.kind == "f" and a.dtype.itemsize in (4, 8):
        work = np.dtype(a.dtype)
    elif a.dtype.kind in "iu" and a.dtype.itemsize <= 2:
        work = np.dtype(np.float32)
    elif a.dtype.kind in "iu":
        work = np.dtype(np.float64)
    else:
        return [_skip(case, SPERR, f"SPERR does not take {a.dtype}", note)]
    if a.ndim != 3 or min(a.shape) < 2:
        return [_skip(case, SPERR, f"SPERR 3-D needs at least 2 values per axis, got shape "
                                   f"{a.shape}", note)]
    row = _row(case, SPERR, note=note)
    is_int = a.dtype.kind in "iu"
    # SPERR keeps its point-wise bound in double precision; rounding its output to the data
    # type can add up to half a unit in the last place, so it gets that much less
    big = max(abs(case.vrange[0]), abs(case.vrange[1])) + case.eb
    margin = float(np.spacing(np.asarray(big, dtype=work)))
    eb = case.eb - margin if case.eb > 2 * margin else case.eb / 2
    row["note"] = _join(row["note"], f"bound given to SPERR less one {work.name} ulp of "
                        "max|x| (SPERR rounds to the output type after its own check)")
    if is_int:
        row["note"] = _join(row["note"], f"{a.dtype} given to SPERR as {work.name} and its "
                            "output rounded back (conversions timed)")
    shape = a.shape

    def enc() -> bytes:
        return imagecodecs.sperr_encode(np.ascontiguousarray(a, dtype=work), float(eb),
                                        "pwe", numthreads=1)

    def dec(blob: bytes) -> np.ndarray:
        out = imagecodecs.sperr_decode(blob, numthreads=1).reshape(shape)
        if is_int:
            info = np.iinfo(a.dtype)
            out = np.clip(np.rint(out), info.min, info.max).astype(a.dtype)
        return out

    return [_measure(row, case, enc, dec, len, _lossy_check(a, case.bound_abs))]


def _zstd_rows(case: _Case) -> list[Row]:
    import zstandard

    raw = np.ascontiguousarray(case.a)
    rows = []
    for level in (3, 19):
        row = _row(case, f"zstd-{level}")

        def enc(level: int = level) -> bytes:
            return zstandard.ZstdCompressor(level=level).compress(raw.data)

        def dec(blob: bytes) -> np.ndarray:
            out = zstandard.ZstdDecompressor().decompress(blob, max_output_size=raw.nbytes)
            return np.frombuffer(out, dtype=raw.dtype).reshape(raw.shape)

        rows.append(_measure(row, case, enc, dec, len, _lossless_check(case.a)))
    return rows


def _blosc2_rows(case: _Case) -> list[Row]:
    names = (BLOSC2_SHUFFLE, BLOSC2_BITSHUFFLE)
    try:
        import blosc2
    except ImportError:
        return [_skip(case, n, "python-blosc2 is not installed") for n in names]
    if not hasattr(blosc2, "CParams"):
        return [_skip(case, n, f"python-blosc2 {blosc2.__version__} is older than 3.0")
                for n in names]
    raw = np.ascontiguousarray(case.a)
    if raw.nbytes >= 2**31 - 64:
        return [_skip(case, n, "over 2 GB: one blosc2 frame of the whole stack does not apply")
                for n in names]
    rows = []
    for name, filt in zip(names, (blosc2.Filter.SHUFFLE, blosc2.Filter.BITSHUFFLE),
                          strict=True):
        row = _row(case, name, note="one thread")
        cparams = blosc2.CParams(codec=blosc2.Codec.ZSTD, clevel=5, filters=[filt],
                                 typesize=raw.dtype.itemsize, nthreads=1)
        dparams = blosc2.DParams(nthreads=1)

        def enc(cparams: Any = cparams) -> bytes:
            return blosc2.compress2(raw.tobytes(), cparams=cparams)

        def dec(blob: bytes, dparams: Any = dparams) -> np.ndarray:
            out = blosc2.decompress2(blob, dparams=dparams)
            return np.frombuffer(out, dtype=raw.dtype).reshape(raw.shape)

        rows.append(_measure(row, case, enc, dec, len, _lossless_check(case.a)))
    return rows


def _image_dtype_problem(a: np.ndarray) -> str | None:
    """Why a 2-D integer image codec cannot take ``a`` losslessly, or None."""
    if a.dtype.kind != "u" or a.dtype.itemsize > 2:
        return (f"{a.dtype} data: this 2-D image codec takes unsigned 8/16-bit frames "
                "only")
    return None


def _frame_codec_rows(case: _Case, codec: str, available: Callable[[Any], bool],
                      encode: Callable[[Any, np.ndarray], bytes],
                      decode: Callable[[Any, bytes], np.ndarray]) -> list[Row]:
    try:
        import imagecodecs
    except ImportError:
        return [_skip(case, codec, "imagecodecs is not installed")]
    if not available(imagecodecs):
        return [_skip(case, codec, f"this imagecodecs build has no {codec}")]
    why = _image_dtype_problem(case.a)
    if why:
        return [_skip(case, codec, why)]
    a = case.a
    row = _row(case, codec, note="frame by frame, one thread")

    def enc() -> list[bytes]:
        return [encode(imagecodecs, np.ascontiguousarray(f)) for f in a]

    def dec(blobs: list[bytes]) -> np.ndarray:
        return np.stack([decode(imagecodecs, b) for b in blobs]).reshape(a.shape)

    return [_measure(row, case, enc, dec, lambda bl: sum(map(len, bl)), _lossless_check(a))]


def _jpegxl_rows(case: _Case) -> list[Row]:
    return _frame_codec_rows(
        case, JPEGXL, lambda ic: getattr(getattr(ic, "JPEGXL", None), "available", False),
        lambda ic, f: ic.jpegxl_encode(f, lossless=True, effort=7, numthreads=1),
        lambda ic, b: ic.jpegxl_decode(b, numthreads=1))


def _jpegls_rows(case: _Case) -> list[Row]:
    return _frame_codec_rows(
        case, JPEGLS, lambda ic: getattr(getattr(ic, "JPEGLS", None), "available", False),
        lambda ic, f: ic.jpegls_encode(f, level=0),
        lambda ic, b: ic.jpegls_decode(b))


def _ffmpeg() -> str | None:
    """The ffmpeg program on the PATH, or None (tests replace this)."""
    return shutil.which("ffmpeg")


@functools.lru_cache(maxsize=4)
def _ffmpeg_encoders(exe: str) -> str:
    try:
        out = subprocess.run([exe, "-hide_banner", "-encoders"], capture_output=True,
                             timeout=60, check=False)
        return out.stdout.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError):
        return ""


def ffmpeg_version() -> str | None:
    """First line of ``ffmpeg -version``, or None when ffmpeg is not on the PATH."""
    exe = _ffmpeg()
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "-version"], capture_output=True, timeout=60, check=False)
        return out.stdout.decode("utf-8", "replace").splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def _run_ffmpeg(exe: str, args: list[str], data: bytes) -> bytes:
    p = subprocess.run([exe, "-nostdin", "-hide_banner", "-loglevel", "error", *args],
                       input=data, capture_output=True, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"ffmpeg exited {p.returncode}: "
                           f"{p.stderr.decode('utf-8', 'replace').strip()[-500:]}")
    return p.stdout


def _ffmpeg_rows(case: _Case, codec: str, encoder: str, pix_fmt: str | None, why: str,
                 codec_args: list[str], fmt: str) -> list[Row]:
    exe = _ffmpeg()
    if not exe:
        return [_skip(case, codec, "ffmpeg is not on the PATH")]
    if f" {encoder} " not in _ffmpeg_encoders(exe):
        return [_skip(case, codec, f"this ffmpeg has no {encoder} encoder")]
    if pix_fmt is None:
        return [_skip(case, codec, why)]
    a = case.a
    t, h, w = a.shape
    raw = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()
    row = _row(case, codec, note=f"through ffmpeg as {pix_fmt} (process start timed), "
                                 "one thread")
    enc_args = ["-f", "rawvideo", "-pix_fmt", pix_fmt, "-s", f"{w}x{h}", "-framerate", "25",
                "-i", "pipe:0", *codec_args, "-pix_fmt", pix_fmt, "-f", fmt, "pipe:1"]
    dec_args = ["-f", fmt, "-i", "pipe:0", "-f", "rawvideo", "-pix_fmt", pix_fmt, "pipe:1"]

    def dec(blob: bytes) -> np.ndarray:
        out = np.frombuffer(_run_ffmpeg(exe, dec_args, blob), dtype=a.dtype.newbyteorder("<"))
        if out.size != a.size:
            raise RuntimeError(f"ffmpeg gave {out.size} values back, not {a.size}")
        return out.reshape(a.shape).astype(a.dtype)

    return [_measure(row, case, lambda: _run_ffmpeg(exe, enc_args, raw), dec, len,
                     _lossless_check(a))]


def _ffv1_rows(case: _Case) -> list[Row]:
    a = case.a
    why = _image_dtype_problem(a)
    pix = None if why else ("gray" if a.dtype.itemsize == 1 else "gray16le")
    return _ffmpeg_rows(case, FFV1, "ffv1", pix, why or "",
                        ["-c:v", "ffv1", "-level", "3", "-coder", "1", "-context", "1",
                         "-g", "1", "-threads", "1"], "nut")


def _x265_rows(case: _Case) -> list[Row]:
    a = case.a
    why = _image_dtype_problem(a)
    pix = None
    if not why:
        if a.dtype.itemsize == 1:
            pix = "gray"
        else:
            bits = max(1, int(case.vrange[1]).bit_length())
            if bits <= 10:
                pix = "gray10le"
            elif bits <= 12:
                pix = "gray12le"
            else:
                why = f"x265 codes at most 12 bits per value; the largest value needs {bits}"
    return _ffmpeg_rows(case, X265, "libx265", pix, why or "",
                        ["-c:v", "libx265", "-x265-params",
                         "lossless=1:log-level=error:pools=1:frame-threads=1"], "hevc")


_LOSSY: dict[str, Callable[[_Case], list[Row]]] = {
    "sz3": _sz3_rows, "zfp": _zfp_rows, "sperr": _sperr_rows}
_LOSSLESS: dict[str, Callable[[_Case], list[Row]]] = {
    "zstd": _zstd_rows, "blosc2": _blosc2_rows, "jpegxl": _jpegxl_rows,
    "jpegls": _jpegls_rows, "ffv1": _ffv1_rows, "x265": _x265_rows}


def _families(codecs: Sequence[str] | None) -> tuple[str, ...]:
    if codecs is None:
        return FAMILIES
    out = tuple(c.strip().lower() for c in codecs if c.strip())
    bad = [c for c in out if c not in FAMILIES]
    if bad:
        raise ValueError(f"unknown codec(s) {', '.join(bad)}; known: {', '.join(FAMILIES)}")
    return out


def bench_array(name: str, a: np.ndarray,
                bounds: Sequence[float | None] = DEFAULT_BOUNDS,
                predictors: Sequence[str] = ("auto",), repeat: int = 1,
                progress: Progress | None = None,
                codecs: Sequence[str] | None = None, warm_up: bool = True) -> list[Row]:
    """All rows for one in-memory (T, H, W) array; ``codecs`` picks among ``FAMILIES``
    besides tezip (default: all). ``warm_up``: first run every row on a corner of the
    array (unreported), so that one-time costs of a codec path (imports, first calls,
    tezip's kernels compiling) do not land in the first run, which may be the only
    timed one (``REPEAT_MAX_SECONDS``)."""
    if repeat < 1:
        raise OptionError(f"repeat must be at least 1 (best of that many timings), not "
                          f"{repeat}")
    fams = _families(codecs)
    if warm_up:
        bench_array(name, np.ascontiguousarray(a[:2, :16, :16]), bounds, predictors, 1,
                    codecs=fams, warm_up=False)
    rows: list[Row] = []
    vrange = value_range(a)
    is_int = a.dtype.kind in "iu"
    for bound in bounds:
        blabel = LOSSLESS if bound is None else f"{bound:g}"
        if bound is None:
            case = _Case(name, a, None, 0.0, 0.0, "", repeat, vrange)
            jobs: list[tuple[str, Callable[[], list[Row]]]] = [
                ("tezip", lambda case=case: _tezip_rows(case, predictors))]
            jobs += [(f, lambda f=f, case=case: _LOSSLESS[f](case))
                     for f in LOSSLESS_FAMILIES if f in fams]
        else:
            # the largest float within bound x (max - min), as tezip resolves it (the
            # product rounded to nearest may be one ulp above it)
            eb = relative_bound(float(bound), (float(vrange[0]), float(vrange[1])))
            note = ""
            if is_int:
                bound_abs = float(math.floor(eb))
                eb = bound_abs
                if bound_abs < 1:
                    bound_abs, eb = 0.0, 0.5
                    note = ("bound floors to 0 for integers; given 0.5 and checked after "
                            "rounding, so this codec may not apply")
            else:
                bound_abs = eb
            case = _Case(name, a, bound, bound_abs, eb, note, repeat, vrange)
            jobs = [("tezip", lambda case=case: _tezip_rows(case, predictors))]
            jobs += [(f, lambda f=f, case=case: _LOSSY[f](case))
                     for f in LOSSY_FAMILIES if f in fams]
        for fam, job in jobs:
            t0 = time.perf_counter()
            got = job()
            rows += got
            if progress:
                took = time.perf_counter() - t0
                for r in got:
                    progress(f"{name}: bound {blabel}: {r['codec']}: {_progress_text(r)} "
                             f"({took:.1f} s for {fam})")
        if case.pending:
            t0 = time.perf_counter()
            failed = _repeat_rounds(case)
            if progress:
                progress(f"{name}: bound {blabel}: {repeat - 1} more round(s) of timings "
                         f"over all codecs ({time.perf_counter() - t0:.1f} s)")
                for r in failed:
                    progress(f"{name}: bound {blabel}: {r['codec']}: {r['note']}")
    return rows


def _progress_text(r: Row) -> str:
    if r["ratio"] is None:
        return r["note"] or "no result"
    s = f"ratio {r['ratio']:.2f}"
    if r.get("psnr") is not None:
        s += f", PSNR {r['psnr']:.1f} dB"
    return s + ("" if r["ok"] else f" -- {r['note']}")


def run(paths: list[str], bounds: Sequence[float | None] = DEFAULT_BOUNDS,
        predictors: Sequence[str] = ("auto",), repeat: int = 1,
        progress: Progress | None = None, codecs: Sequence[str] | None = None) -> list[Row]:
    """Benchmark every ``.npy`` file in ``paths`` (shape (T, H, W), loaded whole) at every
    bound (a fraction of the value range, or ``None`` for lossless)."""
    fams = _families(codecs)
    rows: list[Row] = []
    for path in paths:
        name = os.path.splitext(os.path.basename(path))[0]
        a = np.load(path)
        if a.ndim != 3:
            raise ValueError(f"{path}: expected a (T, H, W) array, got shape {a.shape}")
        rows += bench_array(name, a, bounds, predictors, repeat, progress, fams)
    return rows


def codec_versions() -> dict[str, str]:
    """Versions of every codec package / program the benchmark can use ("missing" when it
    is not there)."""
    out: dict[str, str] = {"tezip": getattr(tezip, "__version__", "?"),
                           "numpy": np.__version__}
    for mod in ("pysz", "zfpy", "zstandard", "blosc2", "imagecodecs"):
        try:
            m = __import__(mod)
            out[mod] = str(getattr(m, "__version__", None) or _dist_version(mod))
        except ImportError:
            out[mod] = "missing"
    if out["imagecodecs"] != "missing":
        import imagecodecs
        for lib in ("sperr", "jpegxl", "jpegls"):
            try:
                out[f"imagecodecs {lib}"] = str(getattr(imagecodecs, f"{lib}_version")())
            except Exception:  # noqa: BLE001 - not built in
                out[f"imagecodecs {lib}"] = "missing"
    out["ffmpeg"] = ffmpeg_version() or "missing (not on the PATH)"
    return out


def _dist_version(mod: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(mod)
    except metadata.PackageNotFoundError:
        return "?"


# ---------------------------------------------------------------------------------------
# reports


def _fmt_ratio(r: Row | None, with_psnr: bool = False) -> str:
    if r is None:
        return "-"
    if r.get("ratio") is None:
        if r.get("ok") is False:
            return "failed"
        return "skipped" if "skipped" in r.get("note", "") else "n/a"
    s = f"{r['ratio']:.2f}"
    if with_psnr and r.get("psnr") is not None:
        s += " (exact)" if r["psnr"] == math.inf else f" ({r['psnr']:.1f})"
    return s if r["ok"] else f"**{s} (!)**"


def _fmt_speed(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}"


def _fmt_err(r: Row | None) -> str:
    if r is None or r.get("max_abs_error") is None:
        return "-"
    err, b = r["max_abs_error"], r["bound_abs"]
    if r["bound"] == LOSSLESS:
        return "exact" if r["ok"] else "**NOT EXACT**"
    s = f"{err / b:.3f}" if b else f"{err:.3g}"
    return s if r["ok"] else f"**{s} VIOLATION**"


def _fmt_psnr(r: Row) -> str:
    p = r.get("psnr")
    if p is None:
        return "-"
    return "inf" if p == math.inf else f"{p:.1f}"


def _bound_key(b: Any) -> tuple[int, float]:
    return (1, 0.0) if b == LOSSLESS else (0, -float(b))


def _wins_line(c: str, ref: Sequence[str], what: str, datasets: list[str],
               get: dict[tuple[str, str], Row]) -> str | None:
    wins = n = 0
    for d in datasets:
        r = get.get((d, c))
        best = [get[(d, o)]["ratio"] for o in ref
                if (d, o) in get and get[(d, o)]["ratio"] is not None and get[(d, o)]["ok"]]
        if r is None or r["ratio"] is None or not best:
            continue
        n += 1
        wins += r["ratio"] >= max(best)
    return f"{c} ratio >= {what} on {wins} of {n} data sets." if n else None


def to_markdown(rows: list[Row]) -> str:
    """Per bound: a table of ratios (PSNR in dB in brackets for lossy bounds; the best
    checked ratio per data set in bold), ratios flagged ``(!)`` where a codec broke its
    bound, counts of data sets where tezip >= SZ3 and >= every other codec (lossless: the
    better zstd, every other codec), and the notes (skipped codecs, conversions). Then one
    table of every row with speeds and error / bound."""
    out: list[str] = []
    for bound in sorted({r["bound"] for r in rows}, key=_bound_key):
        brows = [r for r in rows if r["bound"] == bound]
        datasets = list(dict.fromkeys(r["dataset"] for r in brows))
        codecs = list(dict.fromkeys(r["codec"] for r in brows))
        tz = [c for c in codecs if c.startswith("tezip")]
        others = [c for c in codecs if not c.startswith("tezip")]
        get = {(r["dataset"], r["codec"]): r for r in brows}
        lossless = bound == LOSSLESS
        title = ("Lossless (bit-exact): compression ratio" if lossless else
                 f"Bound {bound:g} x (max - min): compression ratio (PSNR dB)")
        out.append(f"### {title}\n")
        head = ["dataset", "abs bound"] + codecs
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "|".join("---" for _ in head) + "|")
        notes: dict[tuple[str, str], list[str]] = {}
        for d in datasets:
            babs = next(r["bound_abs"] for r in brows if r["dataset"] == d)
            line = [d, "0" if lossless else f"{babs:.4g}"]
            good = [get[(d, c)]["ratio"] for c in codecs
                    if (d, c) in get and get[(d, c)]["ratio"] is not None and get[(d, c)]["ok"]]
            best = max(good) if good else None
            for c in codecs:
                r = get.get((d, c))
                cell = _fmt_ratio(r, with_psnr=not lossless)
                if r and r["ok"] and best is not None and r["ratio"] == best:
                    cell = f"**{cell}**"
                line.append(cell)
                if r and r["note"]:
                    notes.setdefault((c, r["note"]), []).append(d)
            out.append("| " + " | ".join(line) + " |")
        out.append("")
        for c in tz:
            if lossless:
                lines = [_wins_line(c, [ZSTD3, ZSTD19], "the better zstd's", datasets, get),
                         _wins_line(c, others, "every other codec's", datasets, get)]
            else:
                lines = [_wins_line(c, [SZ3], "SZ3's", datasets, get),
                         _wins_line(c, others, "every other codec's", datasets, get)]
            out += [s for s in lines if s]
        for (c, note), ds in notes.items():
            failed = any(get[(d, c)]["ok"] is False for d in ds)
            txt = f"{c} ({', '.join(ds)}): {note}"
            out.append(f"- **{txt}**" if failed else f"- {txt}")
        out.append("")
    out.append("### Every row: speed (MB/s of raw data) and max error / bound\n")
    out.append("| dataset | bound | codec | ratio | PSNR dB | max err / bound | enc MB/s "
               "| dec MB/s |")
    out.append("|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["dataset"], _bound_key(r["bound"]))):
        if r["ratio"] is None and r["ok"] is None:
            continue  # skipped: said under its table
        b = LOSSLESS if r["bound"] == LOSSLESS else f"{r['bound']:g}"
        out.append(f"| {r['dataset']} | {b} | {r['codec']} | {_fmt_ratio(r)} | {_fmt_psnr(r)} "
                   f"| {_fmt_err(r)} | {_fmt_speed(r['enc_mbs'])} | {_fmt_speed(r['dec_mbs'])} |")
    return "\n".join(out).rstrip() + "\n"


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        return _jsonable(x.item())
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def to_json(rows: list[Row]) -> str:
    """The rows as a JSON array (infinities as the strings "inf"/"-inf")."""
    return json.dumps(_jsonable(rows), indent=1)
