"""Benchmark tezip against the established compressors on (T, H, W) stacks.

For every data set (a ``.npy`` file, loaded whole) and every bound, measured in one
process in one run:

- lossy bounds (a fraction of the value range ``max - min`` over the finite values):
  tezip (one row per predictor), SZ3 3-D (``pysz``, absolute bound) and ZFP 3-D
  (``zfpy``, fixed-accuracy mode);
- ``None`` = lossless: tezip, zstd level 3 and level 19 on the raw bytes.

Each row holds the compression ratio (raw bytes / compressed bytes), encode and decode
speed in MB/s (1 MB = 1e6 bytes of raw input; wall time of the best of ``repeat`` runs),
the maximum absolute error, the absolute bound it must stay within and whether it did.

Integer data: tezip gets the relative bound in mode ``rel`` (it uses the integer part of
the absolute bound); SZ3 and ZFP get that floored absolute bound. SZ3 takes integers as
int32/int64, zfpy's fixed-accuracy mode only floats, so integer data go to ZFP as floats
and its error is checked on those converted values (the rows' notes say so).

``pysz`` and ``zfpy`` are optional: a missing one gives a row with a note, not a crash.
"""

from __future__ import annotations

import json
import math
import os
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import tezip

DEFAULT_BOUNDS: tuple[float | None, ...] = (1e-2, 1e-3, 1e-4, None)
LOSSLESS = "lossless"
SZ3 = "SZ3 3-D"
ZFP = "ZFP 3-D"
ZSTD3 = "zstd-3"
ZSTD19 = "zstd-19"

Row = dict[str, Any]
Progress = Callable[[str], None]


# ---------------------------------------------------------------------------------------
# measuring


def _best_time(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Run ``fn`` ``repeat`` times; return the shortest wall time and the last result."""
    best, out = math.inf, None
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


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


def bit_exact(orig: np.ndarray, dec: np.ndarray) -> bool:
    """Same shape, dtype and bytes (so NaN payloads and -0.0 count)."""
    if orig.shape != dec.shape or orig.dtype != dec.dtype:
        return False
    return bool(np.array_equal(np.ascontiguousarray(orig).view(np.uint8),
                               np.ascontiguousarray(dec).view(np.uint8)))


def _row(dataset: str, bound: float | None, codec: str, a: np.ndarray, **kw: Any) -> Row:
    row: Row = {
        "dataset": dataset, "bound": LOSSLESS if bound is None else bound, "codec": codec,
        "ratio": None, "enc_mbs": None, "dec_mbs": None, "max_abs_error": None,
        "bound_abs": None, "ok": None, "note": "", "compressed_bytes": None,
        "raw_bytes": int(a.nbytes), "dtype": a.dtype.name, "shape": list(a.shape),
    }
    row.update(kw)
    return row


def _measure(row: Row, a: np.ndarray, encode: Callable[[], Any],
             decode: Callable[[Any], np.ndarray], size: Callable[[Any], int], repeat: int,
             check: Callable[[np.ndarray], tuple[float, bool]]) -> Row:
    """Fill ``row`` with ratio, speeds and the error check; a failure is recorded in the
    row (``ok`` False, the traceback in ``error``) rather than raised."""
    try:
        t_enc, blob = _best_time(encode, repeat)
        t_dec, dec = _best_time(lambda: decode(blob), repeat)
        n = int(size(blob))
        err, ok = check(dec)
        row.update(ratio=a.nbytes / n if n else math.inf, compressed_bytes=n,
                   enc_mbs=_mbs(a.nbytes, t_enc), dec_mbs=_mbs(a.nbytes, t_dec),
                   max_abs_error=err, ok=ok)
        if not ok:
            what = "BOUND VIOLATED" if row["bound"] != LOSSLESS else "NOT BIT-EXACT"
            if err == math.inf:
                what += " (NaN/Inf not reproduced, or wrong shape)"
            row["note"] = _join(row["note"], what)
    except Exception as exc:  # noqa: BLE001 - a benchmark reports failures, it does not stop
        row.update(ok=False, error=traceback.format_exc(),
                   note=_join(row["note"], f"FAILED: {type(exc).__name__}: {exc}"))
    return row


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


def _tezip_rows(name: str, a: np.ndarray, bound: float | None, bound_abs: float,
                predictors: Sequence[str], repeat: int) -> list[Row]:
    rows = []
    for pred in predictors:
        codec = "tezip" if pred == "auto" else f"tezip-{pred}"
        row = _row(name, bound, codec, a, bound_abs=bound_abs)
        if bound is None:
            def enc(pred: str = pred) -> bytes:
                return tezip.compress(a, mode="lossless", bound=None, predictor=pred)
            check = _lossless_check(a)
        else:
            def enc(pred: str = pred) -> bytes:
                return tezip.compress(a, mode="rel", bound=bound, predictor=pred)
            check = _lossy_check(a, bound_abs)
            if bound_abs == 0:
                row["note"] = "bound floors to 0 for integers: tezip codes losslessly"
        rows.append(_measure(row, a, enc, tezip.decompress, len, repeat, check))
    return rows


def _sz3_row(name: str, a: np.ndarray, bound: float, bound_abs: float, eb: float,
             repeat: int, note: str) -> Row:
    row = _row(name, bound, SZ3, a, bound_abs=bound_abs, note=note)
    try:
        import pysz
    except ImportError:
        row["note"] = _join(note, "skipped: pysz (SZ3) is not installed")
        return row
    if a.dtype.kind == "f":
        work = np.dtype(a.dtype)
    elif a.dtype.kind in "iu" and a.dtype.itemsize <= 2:
        work = np.dtype(np.int32)
    elif a.dtype.kind in "iu":
        work = np.dtype(np.int64)
    else:
        row["note"] = _join(note, f"skipped: SZ3 does not take {a.dtype}")
        return row
    if work != a.dtype:
        row["note"] = _join(row["note"], f"{a.dtype} given to SZ3 as {work.name} "
                            "(conversions timed)")
    shape = a.shape

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

    return _measure(row, a, enc, dec, lambda c: c.nbytes, repeat, _lossy_check(a, bound_abs))


def _zfp_row(name: str, a: np.ndarray, bound: float, bound_abs: float, eb: float,
             repeat: int, note: str) -> Row:
    row = _row(name, bound, ZFP, a, bound_abs=bound_abs, note=note)
    try:
        import zfpy
    except ImportError:
        row["note"] = _join(note, "skipped: zfpy (ZFP) is not installed")
        return row
    if a.dtype.kind == "f":
        work = np.dtype(a.dtype)
    elif a.dtype.kind in "iu" and a.dtype.itemsize <= 2:
        work = np.dtype(np.float32)  # exact for 8- and 16-bit integers
    elif a.dtype.kind in "iu":
        work = np.dtype(np.float64)  # exact up to 2**53
    else:
        row["note"] = _join(note, f"skipped: ZFP does not take {a.dtype}")
        return row
    ref = a
    rounded = a.dtype.kind in "iu" and bound_abs == 0
    if work != a.dtype:
        ref = a.astype(work)
        row["note"] = _join(row["note"], f"{a.dtype} given to ZFP as {work.name} (conversion "
                            f"timed); error checked on the {work.name} values"
                            + (" rounded to integers" if rounded else ""))

    def enc() -> bytes:
        return zfpy.compress_numpy(np.ascontiguousarray(a, dtype=work), tolerance=float(eb))

    def dec(blob: bytes) -> np.ndarray:
        out = zfpy.decompress_numpy(blob)
        return np.rint(out) if rounded else out

    return _measure(row, a, enc, dec, len, repeat, _lossy_check(ref, bound_abs))


def _zstd_row(name: str, a: np.ndarray, level: int, repeat: int) -> Row:
    import zstandard

    row = _row(name, None, f"zstd-{level}", a, bound_abs=0.0)
    raw = np.ascontiguousarray(a)

    def enc() -> bytes:
        return zstandard.ZstdCompressor(level=level).compress(raw.data)

    def dec(blob: bytes) -> np.ndarray:
        out = zstandard.ZstdDecompressor().decompress(blob, max_output_size=raw.nbytes)
        return np.frombuffer(out, dtype=raw.dtype).reshape(raw.shape)

    return _measure(row, a, enc, dec, len, repeat, _lossless_check(a))


def bench_array(name: str, a: np.ndarray,
                bounds: Sequence[float | None] = DEFAULT_BOUNDS,
                predictors: Sequence[str] = ("auto",), repeat: int = 1,
                progress: Progress | None = None) -> list[Row]:
    """All rows for one in-memory (T, H, W) array."""
    rows: list[Row] = []
    lo, hi = value_range(a)
    vrange = hi - lo
    is_int = a.dtype.kind in "iu"
    for bound in bounds:
        if progress:
            progress(f"{name}: bound {LOSSLESS if bound is None else f'{bound:g}'}")
        if bound is None:
            rows += _tezip_rows(name, a, None, 0.0, predictors, repeat)
            rows.append(_zstd_row(name, a, 3, repeat))
            rows.append(_zstd_row(name, a, 19, repeat))
            continue
        eb = float(bound) * float(vrange)
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
        rows += _tezip_rows(name, a, bound, bound_abs, predictors, repeat)
        rows.append(_sz3_row(name, a, bound, bound_abs, eb, repeat, note))
        rows.append(_zfp_row(name, a, bound, bound_abs, eb, repeat, note))
    return rows


def run(paths: list[str], bounds: Sequence[float | None] = DEFAULT_BOUNDS,
        predictors: Sequence[str] = ("auto",), repeat: int = 1,
        progress: Progress | None = None) -> list[Row]:
    """Benchmark every ``.npy`` file in ``paths`` (shape (T, H, W), loaded whole) at every
    bound (a fraction of the value range, or ``None`` for lossless)."""
    rows: list[Row] = []
    for path in paths:
        name = os.path.splitext(os.path.basename(path))[0]
        a = np.load(path)
        if a.ndim != 3:
            raise ValueError(f"{path}: expected a (T, H, W) array, got shape {a.shape}")
        # warm-up on a corner of the stack so one-time set-up costs of any codec path
        # (imports, first calls) do not land in the first measurement
        bench_array(name, np.ascontiguousarray(a[:2, :16, :16]), bounds, predictors, 1)
        rows += bench_array(name, a, bounds, predictors, repeat, progress)
    return rows


# ---------------------------------------------------------------------------------------
# reports


def _fmt_ratio(r: Row | None) -> str:
    if r is None:
        return "-"
    if r.get("ratio") is None:
        return "failed" if r.get("ok") is False else "n/a"
    s = f"{r['ratio']:.2f}"
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


def _bound_key(b: Any) -> tuple[int, float]:
    return (1, 0.0) if b == LOSSLESS else (0, -float(b))


def to_markdown(rows: list[Row]) -> str:
    """One table per bound; ratios flagged ``(!)`` and errors marked VIOLATION where a codec
    broke its bound; notes and a count of data sets where tezip >= SZ3 (lossless: >= the
    better zstd) under each table."""
    out: list[str] = []
    for bound in sorted({r["bound"] for r in rows}, key=_bound_key):
        brows = [r for r in rows if r["bound"] == bound]
        datasets = list(dict.fromkeys(r["dataset"] for r in brows))
        codecs = list(dict.fromkeys(r["codec"] for r in brows))
        tz = [c for c in codecs if c.startswith("tezip")]
        others = [c for c in codecs if not c.startswith("tezip")]
        get = {(r["dataset"], r["codec"]): r for r in brows}
        lossless = bound == LOSSLESS
        title = ("Lossless (bit-exact)" if lossless else
                 f"Bound {bound:g} x (max - min)")
        out.append(f"### {title}\n")
        head = ["dataset", "abs bound"] + [f"{c} ratio" for c in codecs]
        for c in tz:
            head += [f"{c} enc MB/s", f"{c} dec MB/s"]
        head += [f"{c} enc/dec MB/s" for c in others]
        head.append(("exact? (" if lossless else "max err / bound (") + ", ".join(codecs) + ")")
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "|".join("---" for _ in head) + "|")
        notes: list[str] = []
        for d in datasets:
            babs = next(r["bound_abs"] for r in brows if r["dataset"] == d)
            line = [d, "0" if lossless else f"{babs:.4g}"]
            line += [_fmt_ratio(get.get((d, c))) for c in codecs]
            for c in tz:
                r = get.get((d, c))
                line += [_fmt_speed(r and r["enc_mbs"]), _fmt_speed(r and r["dec_mbs"])]
            for c in others:
                r = get.get((d, c))
                line.append(f"{_fmt_speed(r and r['enc_mbs'])} / {_fmt_speed(r and r['dec_mbs'])}")
            line.append(", ".join(_fmt_err(get.get((d, c))) for c in codecs))
            out.append("| " + " | ".join(line) + " |")
            for c in codecs:
                r = get.get((d, c))
                if r and r["note"]:
                    txt = f"{d}, {c}: {r['note']}"
                    notes.append(f"**{txt}**" if r["ok"] is False else txt)
        out.append("")
        for c in tz:
            ref = [SZ3] if not lossless else [ZSTD3, ZSTD19]
            wins = n = 0
            for d in datasets:
                r = get.get((d, c))
                best = [get[(d, o)]["ratio"] for o in ref
                        if (d, o) in get and get[(d, o)]["ratio"] is not None]
                if r is None or r["ratio"] is None or not best:
                    continue
                n += 1
                wins += r["ratio"] >= max(best)
            what = "SZ3's" if not lossless else "the better zstd's"
            out.append(f"{c} ratio >= {what} on {wins} of {n} data sets.")
        out += [f"- {note}" for note in notes]
        out.append("")
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
