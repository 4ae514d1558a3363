"""The encoder and decoder: compose quantizer, predictor, entropy coder and container.

Per window (pure functions over numpy arrays): ``encode_window`` ranks the candidate
predictors and their configurations by estimated size on a sample of the window, codes
the window with the best one and packs the payload; ``decode_window`` reverses it.
``compress_stack`` and ``TezFile`` do the I/O at the edges, streaming windows so memory
stays bounded by a few windows; windows are coded and decoded in parallel threads (the
kernels release the GIL).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import numbers
import os
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from . import allocator, predictors
from .checksum import crc32
from .container import FORMAT_VERSION, ContainerReader, ContainerWriter, check_axes
from .errors import CorruptFileError, DecodeMismatchError, OptionError, UnsupportedError
from .kernels.consts import MODE_LOG, RUN_CHUNK
from .quantize import ErrorBound, Quantizer, QuantParams, check_dtype, quantizer, resolve
from .windows import (
    DEFAULT_WINDOW,
    MAX_WINDOW_VALUES,
    coded_windows,
    dynamic_windows,
    transform_window,
    window_length,
)

# the allocator keeps the windows' buffers between windows (``allocator``: in some
# processes, up to a quarter of the encoding time went to page faults)
allocator.configure()

__version__ = "0.8.2"
_SHA256 = re.compile("[0-9a-f]{64}")


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# the learned predictor codes a window only if its expected decoding speed (per core,
# ``learned_decode_mbps``) reaches this floor, unless the caller sets another
DEFAULT_MIN_DECODE_MBPS = 5.0
CLASSICAL_NS_PER_VALUE = 9.0      # decoding cost of the classical predictors per value,
#                                   one core: 7.8-12.6 ns in the README's bench run at
#                                   efef281 (the shared stacks at 1e-3 and 1e-4); it was
#                                   15, an estimate older than the compiled decoders
TRANSFORM_NS_PER_VALUE = 19.0     # ... of the wavelet (format v8): 15.6-16.8 ns on
#                                   Gray-Scott 128 x 128 and iris at 1e-2..1e-4, 20-22 on
#                                   ks_pypde's 256 x 256 and frames of 1024 x 1024 (two
#                                   passes of entropy decoding and the inverse transform;
#                                   0.8.1: 20-22 and 29-33)
NN_MACS_PER_S = 40e9              # float32 multiply-adds per second of one core: the
#                                   shipped model decoded at 31-46 ns a value (iris, ks_pypde,
#                                   Gray-Scott 128 x 128, 16 x 1024 x 1024; 87-129 MB/s
#                                   float32), estimated at 35-42 with this figure (12e9
#                                   before conv3x3 took four output channels at a time:
#                                   the estimate read 37 MB/s)
LEARNED_FRAME_S = 40e-6           # the learned decoder's cost per frame besides its values'
#                                   (the forecaster's steps are Python calls a frame: the
#                                   shipped model decoded 4 x 4 frames in 38 us each, 8 x 8 in
#                                   59, 32 x 32 in 113, 128 x 128 in 939; 0.7.6). Stacks of
#                                   tiny frames, whose windows (``windows.window_length``) now
#                                   hold 262,144 frames of 1 x 1, spent 15 s a window in the
#                                   learned trial of ``auto``, for a forecaster that decodes
#                                   at 0.1 MB/s


@dataclass(frozen=True)
class Options:
    """Codec options: the error bound; the predictor ('auto': the classical configuration that
    codes the first window smallest, and per window the learned one where a model is
    available, fast enough and codes that window smaller; 'classical': the classical ones;
    or one name); the window length in frames (SWP; None: automatic, ``windows.
    window_length``), or with ``threshold`` the maximum length of dynamic windows (DWP, see
    ``windows.dynamic_windows``); the learned model: a model file, or ``adapt`` to fit one
    to the data within ``adapt_seconds`` (stored in the file), else the shipped default;
    ``min_decode_mbps``: the decoding speed (MB/s per core) below which the learned
    predictor is not used; worker threads (None: one per CPU)."""

    bound: ErrorBound
    predictor: str = "auto"
    window: int | None = None
    model: str | None = None
    threshold: float | None = None
    threads: int | None = None
    adapt: bool = False
    adapt_seconds: float = 30.0
    min_decode_mbps: float | None = None
    embed_model: bool = True            # store a non-shipped ``model`` in each file
    transform_windows: bool = True      # automatic windows lengthened where the stack's
    #                                     tuning takes the transform (``windows.
    #                                     transform_window``); ``tezip prepare`` lays its
    #                                     shards' windows out by frame size (its pieces, the
    #                                     loader's order) and turns this off

    def __post_init__(self) -> None:
        if self.threshold is not None and not (self.threshold > 0 and
                                               math.isfinite(self.threshold)):
            raise OptionError(f"threshold must be a positive fraction of the value range, "
                              f"got {self.threshold}")
        allowed = ("auto", "classical", *predictors.CLASSICAL_CANDIDATES, TRANSFORM, "learned")
        if self.predictor not in allowed:
            raise OptionError(f"unknown predictor '{self.predictor}'; choose one of "
                              f"{', '.join(allowed)}")
        if self.window is not None:
            if (isinstance(self.window, bool) or not isinstance(self.window, numbers.Integral)
                    or self.window < 1):
                raise OptionError(f"window must be a positive whole number of frames, "
                                  f"got {self.window!r}")
            object.__setattr__(self, "window", int(self.window))     # (a numpy integer too)
        if self.threads is not None:
            if (isinstance(self.threads, bool) or not isinstance(self.threads, numbers.Integral)
                    or self.threads < 1):
                raise OptionError(f"threads must be a positive whole number, "
                                  f"got {self.threads!r}")
            object.__setattr__(self, "threads", int(self.threads))
        if self.adapt and self.predictor not in ("auto", "learned"):
            raise OptionError(f"--adapt fits a learned predictor; it does not go with "
                              f"--predictor {self.predictor}")
        if self.adapt and self.model is not None:
            raise OptionError("--adapt fits a new model; it does not go with --model")
        if not (self.adapt_seconds > 0 and math.isfinite(self.adapt_seconds)):
            raise OptionError(f"adapt seconds must be positive, got {self.adapt_seconds}")
        if self.min_decode_mbps is not None and not self.min_decode_mbps >= 0:
            raise OptionError(f"min decode MB/s must be >= 0, got {self.min_decode_mbps}")
        if self.predictor == TRANSFORM and self.bound.mode in ("pwrel", "lossless"):
            what = ("lossless data" if self.bound.mode == "lossless"
                    else "point-wise relative bounds (--mode pwrel)")
            raise OptionError(f"the wavelet codes absolute and relative bounds, not {what}; "
                              "use --predictor auto or classical")
        if self.predictor == "learned" and self.bound.mode == "pwrel":
            # known before reading any data (resolve_model would refuse it only then)
            raise OptionError("the learned predictor codes absolute and relative bounds and "
                              "lossless integers, not point-wise relative bounds (--mode "
                              "pwrel); use --predictor auto or classical, or --mode abs or "
                              "rel")

    def notes(self) -> list[str]:
        """What these options ask for that the codec will not do (it codes on without
        it), one line each, for the caller to tell the user before any work."""
        if self.adapt and self.bound.mode == "pwrel":
            return ["--adapt skipped: the learned predictor does not code point-wise "
                    "relative bounds (--mode pwrel); the classical predictors code the data"]
        return []

    def candidates(self, learned: bool = False) -> tuple[str, ...]:
        """The predictors to try (``learned``: a model is at hand)."""
        if self.predictor == "classical":
            return predictors.CLASSICAL_CANDIDATES
        if self.predictor == "auto":
            return (*predictors.CLASSICAL_CANDIDATES, TRANSFORM, *(("learned",) if learned
                                                                   else ()))
        return (self.predictor,)

    def n_threads(self) -> int:
        return self.threads or default_threads()

    def floor(self) -> float:
        return DEFAULT_MIN_DECODE_MBPS if self.min_decode_mbps is None else self.min_decode_mbps


def learned_decode_mbps(macs_per_pixel: float, channels: int, itemsize: int,
                        frame_values: int | None = None) -> float:
    """Expected decoding speed (MB/s, one core) of the learned predictor with a model of
    this cost: the network's multiply-adds plus the spatial stage, and for frames of
    ``frame_values`` values (channels included; None: large frames) the forecaster's
    fixed cost per frame (``LEARNED_FRAME_S``)."""
    seconds_per_value = macs_per_pixel / max(channels, 1) / NN_MACS_PER_S \
        + CLASSICAL_NS_PER_VALUE * 1e-9
    if frame_values is not None:
        seconds_per_value += LEARNED_FRAME_S / max(1, frame_values)
    return itemsize / seconds_per_value / 1e6


def classical_decode_mbps(itemsize: int, name: str | None = None) -> float:
    """Expected decoding speed (MB/s, one core) of a classical window (``name``: its
    predictor; the wavelet's is slower)."""
    ns = TRANSFORM_NS_PER_VALUE if name == predictors.TRANSFORM else CLASSICAL_NS_PER_VALUE
    return itemsize / (ns * 1e-9) / 1e6


# ---------------------------------------------------------------------------------------
# one window


def window_crc(values: np.ndarray) -> int:
    """CRC-32 of the values' little-endian bytes (read in place, no copy)."""
    a = np.ascontiguousarray(values)
    le = a.dtype.newbyteorder("<")
    if a.dtype != le:
        a = a.astype(le)
    return crc32(a.reshape(-1).view(np.uint8))


_TILE = 33                # sample tiles: _TILE x _TILE pixels over every frame of the window
_SAMPLE_VALUES = 1 << 14  # the tuning sample: at least this many values (or the window)
_SAMPLE_FRACTION = 0.03   # and about this fraction of a large window (6% chose the same
#                           predictors on speckle and ks at 1e-2..1e-4, 5-20% slower)


def sample_tiles(x: np.ndarray) -> np.ndarray:
    """Tiles of the window (every frame, ``_TILE`` pixels square) stacked as channels:
    (T, tile, tile, k * C), chosen where the window is most active (largest change in
    time and space, over a few frames): that is where the bits go, so that is where
    predictors must be compared. The whole window when it is small; where its frames
    are too small for two tiles, its frames from a multiple of ``_TILE - 1`` near its
    middle on, ``_TILE - 1`` k + 1 of them, as few as hold the sample's values (a
    window lengthened for small frames, ``windows.window_length``, sampled whole: KS
    16 x 16 at 1e-2 encoded at 144 MB/s in windows of 513 frames; with this run, at 297-349
    in windows of 1,025)."""
    tile = _TILE
    t, h, w = x.shape[:3]
    if x.size <= _SAMPLE_VALUES:
        return x
    if h < 2 * tile or w < 2 * tile:
        per = x.size // t
        want = max(_SAMPLE_VALUES, _SAMPLE_FRACTION * x.size) / per
        n = max(1, math.ceil((want - 1) / (tile - 1))) * (tile - 1) + 1
        if n >= t:
            return x
        t0 = min(t // 2, t - n) // (tile - 1) * (tile - 1)
        return x[t0:t0 + n]
    ny, nx = h // tile, w // tile
    per = t * tile * tile * (x.shape[3] if x.ndim == 4 else 1)
    k = min(ny * nx, max(1, math.ceil(max(_SAMPLE_VALUES, _SAMPLE_FRACTION * x.size) / per)))
    from .kernels.sample import tile_activity

    x4 = x if x.ndim == 4 else x[..., None]
    per_block = tile_activity(x4, max(1, t // 4), tile, ny, nx)
    picks = np.argsort(-per_block, kind="stable")[:k]
    tiles = [x[:, (b // nx) * tile:(b // nx + 1) * tile, (b % nx) * tile:(b % nx + 1) * tile]
             for b in sorted(picks.tolist())]
    if x.ndim == 3:
        return np.ascontiguousarray(np.stack(tiles, axis=-1))
    return np.ascontiguousarray(np.concatenate(tiles, axis=-1))


def sign_map(x: np.ndarray, quant: Quantizer) -> np.ndarray:
    """Point-wise relative mode: +-1 by sign, +-2 for exact zeros (skipped by the
    kernels); other modes: a dummy."""
    if quant.mode != MODE_LOG:
        return np.zeros(1, np.int8)
    neg = np.signbit(x)
    s = np.where(neg, np.int8(-1), np.int8(1))
    return np.where(x == 0, s * 2, s).astype(np.int8)


def _masks_bytes(x: np.ndarray) -> bytes:
    return np.packbits(np.signbit(x).ravel()).tobytes() + np.packbits((x == 0).ravel()).tobytes()


def _sgn_from_masks(raw: bytes, shape: tuple[int, ...]) -> np.ndarray:
    n = math.prod(shape)
    plen = (n + 7) // 8
    if len(raw) != 2 * plen:
        raise CorruptFileError("bad mask section")
    b = np.frombuffer(raw, np.uint8)
    neg = np.unpackbits(b[:plen], count=n).astype(bool)
    zero = np.unpackbits(b[plen:], count=n).astype(bool)
    s = np.where(neg, np.int8(-1), np.int8(1))
    return np.where(zero, s * 2, s).astype(np.int8).reshape(shape)


def _estimate(coded: predictors.Coded, itemsize: int) -> float:
    from . import entropy

    # (the codes themselves, not a run coding: ranked with their run codings, `spatial`
    # took `interp`'s place on sparse speckles, files 1.39-1.64x as large: the estimate
    # overcounts the low bits of large codes among zeros, less so where the zeros are
    # runs)
    codes, ctx, n_ctx, groups, _ = coded.entropy_input()
    return entropy.estimate_bits(codes, ctx, n_ctx, groups, 8.0 * itemsize,
                                 coded.has_outliers)


RUN_CHECK_BYTES = 1 << 14  # a run-coded window (``Coded.recode``) that codes smaller than
#                           this is coded without its runs too, the smaller kept: the run
#                           contexts' tables (hundreds of bytes) and the runs' raw low bits
#                           made tiny files up to 1.19x as large (a break-test: 47 of 115
#                           run-coded files over 1% larger, all of them of 1.5-3.4 KB);
#                           coding every window twice would cost a large one up to 1.5x
#                           its encoding time (speckle at 1e-2, windows of 35 KB)
N_FINALISTS = 3
DRIFT = 4.0               # a later window that takes this many times the bits per value
#                           the tuning estimated for the stack's choice is tuned on its own
#                           (``_drifted``): dark or still first frames (up to 3.0x the ratio
#                           there, benchmarks/results/drift.md); the shared stacks' windows
#                           take 0.56-3.36x (smoke's plume grows), where a tuning of their
#                           own gained 0-0.4% and would cost 30-60% of encoding time
DRIFT_GAIN = 0.95         # ... and then ranked in full only where the best trial on its
#                           sample is estimated this much smaller than the stack's choice
#                           there (speckle after dark frames at 1e-3: the same file, 0.81x
#                           the speed instead of 0.64x; smoke after a still start: 0.90
#                           kept its stack's choice, 0.7x the speed, where 0.95 took files
#                           1.7-3.8% smaller at 0.42-0.48x)
DRIFT_MIN_BYTES = 1 << 12  # ... and at least this many bytes (a window of near-zero codes:
#                            its fixed costs, the tables and the record, are most of it)
_FULL_MARGIN = 1.02       # a finalist is ranked on the window itself only if its sample
#                           estimate is this close to the best one's (the sample can
#                           misrank by a few %)
HEAD_FRAMES = 8           # ... on the window's first frames, coded in full, when the
#                           window is longer: they rank the finalists as the whole
#                           window does (tiles do not: their borders favour one family)
HEAD_VALUES = 1 << 18     # ... fewer frames where frames are large: as many as hold this
HEAD_MIN_FRAMES = 4       # many values, but at least this many (speckle's 256 x 256: 4
#                           frames, encoding 1.13-1.15x in speed_ab.md; the same files on the
#                           shared stacks at 1e-2..1e-4 even with 2 frames; on 36 synthetic
#                           192 x 224 cells, 2 files 0.03% and 0.17% larger than with 8;
#                           a break-test's 240 large-frame cells: 0.9998x in all, within
#                           +0.3% but where the window was 6-8 frames, now ranked whole)
_FIT_MARGIN = 1.15        # a configuration is fitted to a finalist's coding of the head
#                           (``ValuePredictor.fitted``) only if it is this close to the best


TRANSFORM = predictors.TRANSFORM  # the transform coder, tried beside the classical
#                                  predictors where the options name it
TRANSFORM_GAIN = 0.9      # ... and taken where its estimate on the first window is
#                           under this times the classical choice's (its decoding is the
#                           slower)
TRANSFORM_CROP = 64       # ... after a screen on the window's central 64 x 64 pixels: its
TRANSFORM_SCREEN = 0.85   # coefficients alone under this times the classical choice's codes
#                           there (the corrections add 1-5% to a transform coding at its
#                           first step, so 0.9 x 0.95); its verdict was the whole window's
#                           in 21 of 21 cells (the shared stacks and edges.py's smooth
#                           fields at 1e-2..1e-4), and a full trial that failed after it
#                           cost `auto` half its speed (ks_pypde and speckle at 1e-2)
TRANSFORM_LONG_SCREEN = 0.9  # ... where the transform would code longer windows (``windows.
#                           transform_window``), the screen on the longer first window; if
#                           the window's own would fail, it must read under this times that
#                           (frames coherent in time: drifting blobs at 1e-3, 1.031 -> 0.828;
#                           speckle at 1e-2, 0.861 -> 0.848, is not, and its full trial on
#                           65 frames of 256 x 256 cost `auto` two thirds of its speed)
TRANSFORM_MIN_FRAMES = 9  # ... in windows of at least this many frames (fewer take no
#                           level along time)


def head_frames(shape: tuple[int, ...]) -> int:
    """How many of the first frames of a window of ``shape`` rank the finalists: all of a
    window of up to HEAD_FRAMES frames (its codings are then kept), else as many as hold
    HEAD_VALUES values, from HEAD_MIN_FRAMES to HEAD_FRAMES."""
    if shape[0] <= HEAD_FRAMES:
        return shape[0]
    per = max(1, math.prod(shape[1:]))
    return max(HEAD_MIN_FRAMES, min(HEAD_FRAMES, HEAD_VALUES // per))


@dataclass(frozen=True)
class Tuning:
    """The classical configurations ranked on the stack's first window, best first (None:
    no tuning, as for bit-exact floats); every window codes with the first; ``head``: that
    best one's full coding of that window, by ``config_key``, when the ranking coded all of
    it, so that coding it next costs nothing, or of its first frames where the window's
    coding begins with theirs (``ValuePredictor.extends``: then only the frames after
    them are coded next); else None (not compared)."""

    finalists: list[tuple[str, dict]] | None
    head: dict[str, predictors.Coded] | None = field(default=None, compare=False, repr=False)
    bits: float | None = None   # the first's estimated bits per value there (on the head,
    #                             else on the sample; None: nothing was ranked): the
    #                             windows' drift check (``_drifted``)
    hopeless: float | None = None  # where the learned predictor's trial on the head
    #                             found it hopeless (``_learned_trial``), the classical
    #                             choice's bits per value on that trial's crop: later windows
    #                             like it there skip their trials (``encode_window_
    #                             alternatives``)
    trial: Any = field(default=None, compare=False, repr=False)  # ... that ``Trial``, for
    #                             the window that is the head


def config_key(name: str, cfg: dict) -> str:
    return name + json.dumps(cfg, sort_keys=True)


def tune(x: np.ndarray, quant: Quantizer, candidates: tuple[str, ...],
         threads: int = 1, against: tuple[str, dict] | None = None,
         longer: np.ndarray | None = None) -> Tuning:
    """``_tune_classical`` among the candidates other than the transform (TRANSFORM),
    then, where it is one of them, the transform against their best (``_or_transform``);
    the transform alone where it is the only one (``_transform_only``). A drift check's
    tuning (``against``) ranks the classical predictors only. ``longer``: the stack's
    first window as the transform would code it (``windows.transform_window``; None: as
    ``x``), on which it is tried."""
    rest = tuple(c for c in candidates if c != TRANSFORM)
    if not rest:
        if against is None:
            return _transform_only(x, quant, threads, longer)
        rest = predictors.CLASSICAL_CANDIDATES
    tuned = _tune_classical(x, quant, rest, threads, against)
    if TRANSFORM in candidates and against is None:
        return _or_transform(x, quant, tuned, longer)
    return tuned


def _transform_coded(x: np.ndarray, quant: Quantizer, cfg: dict
                     ) -> tuple[float, dict, predictors.Coded]:
    """(estimated bits, ``cfg``, coding) of window ``x`` by the transform."""
    coded = predictors.get(TRANSFORM).encode(x, quant, cfg, sign_map(x, quant))
    return _estimate(coded, x.itemsize), cfg, coded


def _best_transform(x: np.ndarray, quant: Quantizer) -> tuple[float, dict, predictors.Coded]:
    """``_transform_coded`` of window ``x`` with the transform's best step on its
    ``_transform_crop`` (transformed once): the first choice, then each neighbouring
    step while it codes the crop smaller, downwards, else upwards. (On the
    whole window, each step a full coding: 9 of them on a 33 x 1024 x 1024 window that
    went up to the largest step, which encoded at 8 MB/s; helper-47. The crop's choice
    cost the window up to 0.9% on the first windows where the transform is taken on
    edges.py's fields and iris; Gray-Scott's file at 1e-3 is 2.5% larger, 23.17 ->
    22.60.)"""
    pred = predictors.get(TRANSFORM)
    cfgs = pred.configs(x, quant)
    order = sorted(c["d"] for c in cfgs)
    crop = _transform_crop(x)
    fwd = pred.forward(crop)
    sgn = sign_map(crop, quant)

    def bits(d: int) -> float:
        return _estimate(pred.encode(crop, quant, {"d": d}, sgn, sample=True, forward=fwd),
                         x.itemsize)

    i = order.index(cfgs[0]["d"])
    best = (bits(order[i]), i)
    for di in (-1, 1):
        j = i + di
        while 0 <= j < len(order):
            alt = (bits(order[j]), j)
            if not alt[0] < best[0]:
                break
            best = alt
            j += di
        if best[1] != i:
            break
    return _transform_coded(x, quant, {"d": order[best[1]]})


def _transform_tuning(best: tuple[float, dict, predictors.Coded],
                      classical: Tuning | None = None,
                      coded: predictors.Coded | None = None) -> Tuning:
    """The transform's tuning: its configuration and its coding of the first window;
    where ``auto`` chose it over the classical choice (``classical``, whose coding of
    the first window is ``coded``), that choice after it, every window's alternative
    (``_settled``), with its coding of the first window and its bits per value there
    (the drift check of the windows it codes smaller)."""
    cfg = best[1]
    if classical is None or not classical.finalists or coded is None:
        return Tuning([(TRANSFORM, cfg)], {config_key(TRANSFORM, cfg): best[2]})
    alt = classical.finalists[0]
    return Tuning([(TRANSFORM, cfg), alt], {config_key(TRANSFORM, cfg): best[2],
                                             config_key(*alt): coded}, classical.bits)


def _transform_only(x: np.ndarray, quant: Quantizer, threads: int = 1,
                    longer: np.ndarray | None = None) -> Tuning:
    """The transform as the only candidate (``--predictor wavelet``), tuned on ``longer``
    where given (see ``tune``); the classical predictors where the bound leaves nothing
    to transform (integers under a bound below 1, which is lossless; ``Options`` refuses
    the modes it does not code)."""
    if not predictors.get(TRANSFORM).configs(x, quant):
        return _tune_classical(x, quant, predictors.CLASSICAL_CANDIDATES, threads)
    return _transform_tuning(_best_transform(x if longer is None else longer, quant))


def _transform_crop(x: np.ndarray) -> np.ndarray:
    """The transform's screen (``_or_transform``): every frame of the window, its central
    TRANSFORM_CROP x TRANSFORM_CROP pixels (all of a smaller frame)."""
    h, w = x.shape[1:3]
    y0, x0 = max(0, (h - TRANSFORM_CROP) // 2), max(0, (w - TRANSFORM_CROP) // 2)
    return np.ascontiguousarray(x[:, y0:y0 + TRANSFORM_CROP, x0:x0 + TRANSFORM_CROP])


def _or_transform(x: np.ndarray, quant: Quantizer, tuned: Tuning,
                  longer: np.ndarray | None = None) -> Tuning:
    """``tuned``, or the transform in its place where its coding of the window ``x`` (or
    of ``longer``, the first window the transform would code: see ``tune``) is estimated
    under TRANSFORM_GAIN times the size of the classical choice's coding of ``x``, per
    value (then every window takes it, without a drift check). First a screen on
    ``_transform_crop``: the transform's coefficients alone (80-97% of its coding)
    against the classical choice's codes there; where they are under TRANSFORM_SCREEN
    times, both code the whole window (the classical coding is the window's own: kept
    in the tuning's ``head``). Where the screen fails, ``tuned`` itself: the file is the
    classical path's, byte for byte."""
    from . import entropy

    pred = predictors.get(TRANSFORM)
    cfgs = pred.configs(x, quant)
    if not cfgs or not tuned.finalists or x.shape[0] < TRANSFORM_MIN_FRAMES:
        return tuned
    y = x if longer is None else longer
    name, cfg = tuned.finalists[0]
    crop = _transform_crop(x)
    on_crop = _estimate(predictors.get(name).encode(crop, quant, cfg, sign_map(crop, quant),
                                                    sample=True), x.itemsize) / crop.size

    def coefficients(c: np.ndarray) -> float:
        codes, ctx = pred.coefficients(c, quant, cfgs[0])
        return entropy.estimate_bits(codes, ctx, pred.n_ctx, pred.groups, 8.0 * x.itemsize,
                                     False) / c.size

    screen = coefficients(crop if y is x else _transform_crop(y))
    if not screen < TRANSFORM_SCREEN * on_crop:
        return tuned
    if y is not x:
        short = coefficients(crop)
        if not (short < TRANSFORM_SCREEN * on_crop or screen <= TRANSFORM_LONG_SCREEN * short):
            return tuned
    coded = _code_with(x, quant, name, cfg, tuned.head)
    best = _best_transform(y, quant)

    def rate(bits: float, c: predictors.Coded, n: int) -> float:
        # bits per value stored on the grid: the values stored exactly (non-finite ones)
        # cost either coding the same, and the longer window may hold more of them (a
        # frame of NaNs after the first 33 made the wavelet's 10x the classical's)
        k = c.outliers.size
        return (bits - 8.0 * x.itemsize * k) / max(1, n - k)

    if not (rate(best[0], best[2], y.size)
            < TRANSFORM_GAIN * rate(_estimate(coded, x.itemsize), coded, x.size)):
        return Tuning(tuned.finalists, {config_key(name, cfg): coded}, tuned.bits)
    return _transform_tuning(best, tuned, coded)


def _tune_classical(x: np.ndarray, quant: Quantizer, candidates: tuple[str, ...],
                    threads: int = 1, against: tuple[str, dict] | None = None) -> Tuning:
    """Every candidate predictor tuned on a sample of ``x`` (the stack's first window);
    the ``N_FINALISTS`` best whose estimate is within ``_FULL_MARGIN`` of the best (and
    that differ in more than a predictor's ``sample_ranked`` settings) are then ordered
    by their estimated size on the first ``head_frames`` frames of ``x``, coded in full
    (on all of ``x`` when it is that short; its codings are then kept).
    Deterministic: the same whatever the thread count; independent trials and the
    finalists run in up to ``threads`` threads. ``against``: a configuration already
    chosen (``_drifted``): kept, as the only finalist, unless the sample's best trial is
    estimated at under DRIFT_GAIN times its size on the sample (the rest is not run)."""
    trials: list[tuple[float, int, str, dict]] = []
    sample = sample_tiles(x)
    sgn = sign_map(sample, quant)
    parallel = threads > 1 and not getattr(_IN_POOL, "worker", False)

    def pmap(fn: Callable[[Any], Any], items: list) -> list:
        return list(_ordered_map(fn, iter(items), min(threads, len(items))))

    if len(candidates) == 1:
        pred = predictors.get(candidates[0])
        cfgs = pred.configs(x, quant)
        if len(cfgs) == 1 and not pred.fits:
            return Tuning([(candidates[0], cfgs[0])])

    def tried(name: str, pm: Callable[[Callable, list], Iterable] = pmap
              ) -> list[tuple[float, dict]]:
        return predictors.get(name).tune(sample, quant, sgn,
                                         lambda c: _estimate(c, sample.itemsize), pm)

    # the first candidate (interpolation) tries its axis orders side by side, then its
    # other settings one after another: the other candidates' trials run in the pool from
    # the end of its first batch of parallel trials, beside that greedy chain (at 2
    # threads on smoke, the chain held one core idle for 0.4 ms; the same trials and the
    # same order of results whatever the thread count)
    later: list[cf.Future] = []

    def start_later() -> None:
        if parallel and not later and len(candidates) > 1:
            pool = _pool(threads)
            later.extend(pool.submit(tried, n, map) for n in candidates[1:])

    def pmap_first(fn: Callable[[Any], Any], items: list) -> list:
        out = pmap(fn, items)
        start_later()
        return out

    try:
        results = [tried(candidates[0], pmap_first)]
        start_later()
        results += ([f.result() for f in later] if later
                    else [tried(n) for n in candidates[1:]])
    finally:
        cf.wait(later)
    for name, res in zip(candidates, results, strict=True):
        for bits, cfg in res:
            trials.append((bits, len(trials), name, cfg))
    trials.sort(key=lambda t: t[:2])
    if against is not None:
        mine = _estimate(predictors.get(against[0]).encode(sample, quant, against[1], sgn,
                                                           sample=True), sample.itemsize)
        if not trials[0][0] < DRIFT_GAIN * mine:
            return Tuning([against])
    finalists: list[tuple[str, dict]] = []
    variants: set[str] = set()
    for bits, _, name, cfg in trials:
        if bits > _FULL_MARGIN * trials[0][0]:
            break
        # a configuration that differs from a better one only in settings the sample
        # ranks reliably (``sample_ranked``) is no finalist: coding the window's first
        # frames with both (and, then, checking both in every later window) took 12% of
        # the time of encoding iris at 1e-3, and ranked them as the sample did
        v = config_key(name, predictors.get(name).variant(cfg))
        if v not in variants:
            variants.add(v)
            finalists.append((name, cfg))
        if len(finalists) == N_FINALISTS:
            break
    if len(finalists) == 1 and not predictors.get(finalists[0][0]).fits:
        return Tuning(finalists, bits=trials[0][0] / sample.size)
    nh = head_frames(x.shape)
    whole = nh == x.shape[0]
    head = x if whole else np.ascontiguousarray(x[:nh])
    sgn = sign_map(head, quant)

    def kept(name: str) -> bool:
        """Whether a finalist's coding of the head serves the window's coding."""
        return whole or predictors.get(name).extends(x.shape)

    def on_head(nc: tuple[str, dict]) -> tuple[predictors.Coded, float]:
        """A configuration's coding of the head and its estimated size."""
        c = predictors.get(nc[0]).encode(head, quant, nc[1], sgn, sample=not kept(nc[0]))
        return c, _estimate(c, x.itemsize)

    def full(nc: tuple[str, dict]) -> tuple[predictors.Coded, float, list]:
        """``on_head`` of a finalist and (with threads, ahead of need: it runs beside the
        other finalists) its fitted configuration, in a list."""
        c, bits = on_head(nc)
        pred = predictors.get(nc[0])
        return c, bits, [pred.fitted(nc[1], c, head.shape)] if parallel and pred.fits else []

    done = pmap(full, finalists)
    coded = {config_key(*nc): d[0] for nc, d in zip(finalists, done, strict=True)}
    sizes = [(d[1], i) for i, d in enumerate(done)]
    # configurations fitted to a finalist's coding of the head (``ValuePredictor.
    # fitted``: the Lorenzo second stage), ranked beside them; fitted only for a finalist
    # within _FIT_MARGIN of the best, as a fit farther behind cannot close the gap (a
    # second stage saved at most 18% on the shared stacks; speckle's Lorenzo, 1.22x
    # interp's size on the head, is not fitted: 0.1-0.2 ms saved)
    top = min(sizes)[0]
    fitted: list[tuple[str, dict]] = []
    for i, (name, cfg) in enumerate(finalists):
        pred = predictors.get(name)
        if not pred.fits or sizes[i][0] > _FIT_MARGIN * top:
            continue
        fit = done[i][2] or [pred.fitted(cfg, coded[config_key(name, cfg)], head.shape)]
        if fit[0] is not None:
            fitted.append((name, fit[0]))

    for (name, fcfg), (c, bits) in zip(fitted, pmap(on_head, fitted), strict=True):
        coded[config_key(name, fcfg)] = c
        sizes.append((bits, len(finalists)))
        finalists.append((name, fcfg))
    bits = min(sizes)[0] / head.size
    if len(finalists) == 1:
        return Tuning(finalists, bits=bits)
    ranked = [finalists[i] for _, i in sorted(sizes)]
    best = config_key(*ranked[0])
    return Tuning(ranked, {best: coded[best]} if kept(ranked[0][0]) else None, bits)


def _fp_quiet(fn: Callable) -> Callable:
    """Run ``fn`` without numpy floating-point warnings (near the float limits values
    overflow by design; the exact checks store those values exactly)."""
    def quiet(*args: Any, **kwargs: Any) -> Any:
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)
    quiet.__doc__ = fn.__doc__
    quiet.__name__ = fn.__name__
    return quiet


_CROP = 64                  # the learned predictor's trial: a central crop of the window
_TRIAL_FRAMES = 2 * DEFAULT_WINDOW - 1  # ... of its first frames, at most this many (a
#                             window lengthened for small frames, 4,097 frames of 8 x 8: the
#                             network ran over every one, a step a frame, and ``auto``
#                             encoded 200,000 of them in 10.6 s where ``classical`` took
#                             0.1 s, for the same file)
_TRIAL_MARGIN = 0.97        # ... where it must code at most this fraction of the classical
_HOPELESS = 1.10            # a first configuration this much above the classical: no other
_TRIAL_PREFIX = 9           # ... and after this many frames of the crop, the trial ends
_PREFIX_HOPELESS = 1.5      # where they code to this much above the classical coding of
#                             them (the forecaster warms up over its first frames: where it
#                             won, ks_pypde at 1e-3, 0.93-0.94 of the classical on the crop,
#                             it read 1.12-1.14 at 9 frames; smoke's windows read 1.53-2.15,
#                             1.26-2.39 on the whole crop)
_LATER_HOPELESS = 1.08      # a stack (of 3 windows or more) whose first and last windows'
#                             trials code this much above the classical (or stop early):
#                             the windows between skip theirs (``_head_trial``,
#                             ``encode_window_alternatives``) unless the classical choice
#                             codes their crop in _LATER_RETRY times the first's bits per
#                             value, or fewer by as much. On the shared stacks (1e-2..1e-4)
#                             the second window's trial read 0.00-0.05 below the first's
#                             (iris 1.140 -> 1.087, speckle 1.251 -> 1.218, ks_pypde 1.097
#                             -> 1.089; smoke 2.1-2.4 -> 1.2-1.4): to be taken it must read
#                             0.97
_LATER_RETRY = 1.25


@dataclass(frozen=True)
class Trial:
    """What the learned predictor's trial on a window's crop found (``_learned_trial``):
    its best configuration there, whether it codes the crop smaller than the classical
    choice, whether it is hopeless there, and the classical choice's bits per value on
    the crop (None: no classical alternative)."""

    cfg: dict
    worth: bool
    hopeless: bool = False
    classical: float | None = None


def _trial_crop(x: np.ndarray) -> np.ndarray:
    """The learned trial's crop of window ``x``: its central _CROP x _CROP pixels over its
    first ``_TRIAL_FRAMES`` frames."""
    h, w = x.shape[1:3]
    y0, x0 = max(0, (h - _CROP) // 2), max(0, (w - _CROP) // 2)
    return np.ascontiguousarray(x[:_TRIAL_FRAMES, y0:y0 + _CROP, x0:x0 + _CROP])


def _classical_bits(c: np.ndarray, quant: Quantizer, name: str, cfg: dict) -> float:
    """The estimated bits of ``c`` coded with (``name``, ``cfg``)."""
    pred = predictors.get(name)
    return _estimate(pred.encode(c, quant, cfg, sign_map(c, quant), sample=True), c.itemsize)


def _learned_trial(x: np.ndarray, quant: Quantizer, learned: Any, name: str | None,
                   cfg: dict | None, thorough: bool = False,
                   classical_bits: float | None = None) -> Trial:
    """On a central crop of the window (of its first ``_TRIAL_FRAMES`` frames): the
    learned configuration that codes it smallest, whether it codes it smaller than
    the classical choice (``name``, ``cfg``; None: no classical alternative), and whether
    the forecaster is hopeless there (``_LATER_HOPELESS``: the trial stopped early, or its
    best coding reads that much above the classical; never where ``thorough``). The
    configurations differ only in the spatial stage (a few %) and are estimated from one
    run of the network over the crop (``Learned.trial``: the network is the trial's
    whole cost). Unless ``thorough``, the trial ends early where the forecaster is
    hopeless: at ``_TRIAL_PREFIX`` frames, if the first configuration codes them
    ``_PREFIX_HOPELESS`` times the classical choice's coding of them; after the first
    configuration, if it codes the crop ``_HOPELESS`` times the classical size.
    ``classical_bits``: the classical choice's estimate on the crop, made already."""
    crop = _trial_crop(x)
    configs = learned.configs(crop, quant)
    classical = None
    stop = None
    if name is not None:
        assert cfg is not None
        classical = (_classical_bits(crop, quant, name, cfg) if classical_bits is None
                     else classical_bits)
        if not thorough and crop.shape[0] >= 2 * _TRIAL_PREFIX:
            limit = _PREFIX_HOPELESS * _classical_bits(
                np.ascontiguousarray(crop[:_TRIAL_PREFIX]), quant, name, cfg)

            def stop(c: predictors.Coded) -> bool:
                return _estimate(c, x.itemsize) > limit

    costs: list[float] = []
    for coded in learned.trial(crop, quant, configs, stop, _TRIAL_PREFIX):
        costs.append(_estimate(coded, x.itemsize))
        if not thorough and classical is not None and costs[0] > _HOPELESS * classical:
            break
    per_value = None if classical is None else classical / crop.size
    if not costs:       # (stopped early)
        return Trial(configs[0], False, stop is not None, per_value)
    best = int(np.argmin(costs))
    if classical is None:
        return Trial(configs[best], True)
    return Trial(configs[best], costs[best] < _TRIAL_MARGIN * classical,
                 not thorough and costs[best] > _LATER_HOPELESS * classical, per_value)


@dataclass
class Encoded:
    """A coded window: its payload and predictor, and when the learned predictor won,
    the classical alternative (the writer may prefer it while the model has not paid
    for its own bytes). ``parts``: where set, the window is written as these
    consecutive windows instead, (frames, payload, predictor) each (a window lengthened
    for the transform that the classical choice codes smaller in windows of the
    stack's own length: ``_settled``); ``alternative`` may be such parts too."""

    payload: bytes
    predictor: str
    alternative: list[Part] | None = None
    parts: list[Part] | None = None


Part = tuple[int, bytes, str]   # (frames, payload, predictor) of one window written


def _encoded(parts: list[Part], alternative: list[Part] | None = None) -> Encoded:
    """The ``Encoded`` of a window written as ``parts``."""
    if len(parts) == 1:
        return Encoded(parts[0][1], parts[0][2], alternative)
    return Encoded(parts[0][1], parts[0][2], alternative, parts)


def _size(parts: list[Part]) -> int:
    return sum(len(p[1]) for p in parts)


def encode_window(x: np.ndarray, qp: QuantParams,
                  candidates: tuple[str, ...] = predictors.CLASSICAL_CANDIDATES,
                  learned: Any = None, thorough: bool = False,
                  finalists: list[tuple[str, dict]] | None = None) -> tuple[bytes, str]:
    """Frames ``x`` (native dtype) -> (window payload, predictor used). ``learned``: the
    learned predictor (``predictors.learned.for_model``) when "learned" is a candidate;
    ``thorough``: code the window with it in full whenever it can run (else only where a
    trial on a crop says it pays); ``finalists``: the classical configurations the
    stack's tuning kept (``tune``; None: tune on this window)."""
    e = encode_window_alternatives(x, qp, candidates, learned, thorough, finalists)
    return e.payload, e.predictor


@_fp_quiet
def encode_window_alternatives(x: np.ndarray, qp: QuantParams,
                               candidates: tuple[str, ...] = predictors.CLASSICAL_CANDIDATES,
                               learned: Any = None, thorough: bool = False,
                               finalists: list[tuple[str, dict]] | None = None,
                               coded_cache: dict[str, predictors.Coded] | None = None,
                               drift_ref: float | None = None,
                               sub: int | None = None, hopeless: float | None = None,
                               trial: Trial | None = None) -> Encoded:
    """``encode_window``, keeping the classical alternative of a learned window.
    ``coded_cache``: full codings of this very window, or of its first frames, by
    configuration (``Tuning.head``), used instead of coding them again; ``drift_ref``:
    the stack's ``Tuning.bits`` (``_drifted``; None: no check); ``sub``: the stack's own
    window length where its windows were lengthened for the transform (``_settled``);
    ``hopeless``: the stack's ``Tuning.hopeless``: the learned trial is skipped where the
    classical choice codes its crop in within ``_LATER_RETRY`` times those bits per value
    either way; ``trial``: this window's trial, made already."""
    from .predictors.lossless import ordered

    x = np.ascontiguousarray(x)
    quant = quantizer(qp)
    use_learned = ("learned" in candidates and learned is not None
                   and learned.supports(x.shape, quant))
    if "learned" in candidates and not use_learned and len(candidates) == 1:
        if (learned is not None and x.shape[0] < 2
                and learned.supports((2, *x.shape[1:]), quant)):
            # a window of one frame has no past to forecast it from: a stack whose
            # length leaves one frame over (or a dynamic window of one) codes it classically
            candidates = predictors.CLASSICAL_CANDIDATES
        else:
            raise OptionError(_learned_refusal(x, quant, learned))
    if qp.kind == "bits":
        pred = predictors.get("bits")
        q = ordered(x)
        sample = sample_tiles(q)
        cfg = min(pred.configs(q), key=lambda c: _estimate(pred.encode(sample, c), 8))
        data = _pack(x, quant, pred.encode(q, cfg), "bits", x)
        del q, sample                       # the byte-plane coding needs its own memory
        alt = _pack_shuffle(x, data)
        if len(alt) < len(data):
            return Encoded(alt, "shuffle")
        return Encoded(data, "bits")
    classical = tuple(c for c in candidates if c != "learned")
    coded = None
    if classical:
        if finalists is None:
            tuned = tune(x, quant, classical)
            finalists, coded_cache = tuned.finalists, tuned.head
        # every window takes the stack's best: a check of each later window among the
        # finalists, on a sample of its tiles, switched 2 windows in 62 on the shared data
        # sets (at 1e-2..1e-4, windows of 8 and 32) and made that file 0.6% larger (tiles
        # misrank by up to 10%), for 4-25% of the encoding time; but a window that takes
        # far more bits than the tuning said is checked (``_drifted``)
        name, cfg = finalists[0]
        coded = _code_with(x, quant, name, cfg, coded_cache)
    worth = False
    if use_learned and not thorough and trial is None and hopeless is not None and classical:
        # a stack whose first window the forecaster cannot serve: this window too, if
        # the classical choice codes its crop about as it coded the first's
        crop = _trial_crop(x)
        cbits = _classical_bits(crop, quant, name, cfg)
        if 1.0 / _LATER_RETRY <= cbits / crop.size / hopeless <= _LATER_RETRY:
            use_learned = False
        else:
            trial = _learned_trial(x, quant, learned, name, cfg, classical_bits=cbits)
    if use_learned:
        if trial is None or thorough:
            trial = _learned_trial(x, quant, learned, name if classical else None,
                                   cfg if classical else None, thorough)
        lcfg, worth = trial.cfg, trial.worth
    if use_learned and (worth or thorough):
        lcoded = learned.encode(x, quant, lcfg, sign_map(x, quant))
        ldata = _pack(x, quant, lcoded, "learned", lcoded.out)
        if coded is None:
            return Encoded(ldata, "learned")
        cparts = _settled(x, quant, classical, finalists, coded, drift_ref, coded_cache, sub)
        if len(ldata) < _size(cparts):
            return Encoded(ldata, "learned", cparts)
        return _encoded(cparts)
    assert coded is not None
    return _encoded(_settled(x, quant, classical, finalists, coded, drift_ref, coded_cache,
                             sub))


def _settled(x: np.ndarray, quant: Quantizer, classical: tuple[str, ...],
             finalists: list[tuple[str, dict]], coded: predictors.Coded,
             ref: float | None, cache: dict[str, predictors.Coded] | None = None,
             sub: int | None = None) -> list[Part]:
    """The windows to write for window ``x``, ``coded`` with the stack's choice
    (``finalists[0]``), checked for drift (``_drifted``; ``ref``: the classical choice's
    bits per value on the first window). Where ``auto`` chose the transform, every window
    is coded with the classical choice after it too (``cache``: the first window's
    codings, from the tuning), and that coding, checked for drift, is kept where smaller:
    the transform was chosen on the first window, and a later one unlike it was coded up
    to 1.14x (a smooth field, then smoke; a short last window: helper-47) and 1.67x
    (flat regions with sharp edges, where the transform's cost per value stayed as it was
    on the first: helper-48) the size the classical choice gives. Where the stack's
    windows were lengthened for the transform (``sub``: the length they had), the
    classical choice codes ``x`` in windows of that length (``windows.coded_windows``),
    as it would have without the transform: windows of 65-129 frames coded with it were
    up to 1.02x its size in windows of 33 (a diffusing field, helper-49). Depends on the
    window and the stack's tuning only."""
    name, cfg = finalists[0]
    data = _pack(x, quant, coded, name, coded.out)
    n = x.shape[0]
    if name != TRANSFORM:
        return [(n, *_drifted(x, quant, classical, name, cfg, data, ref))]
    if len(finalists) < 2:
        return [(n, data, name)]
    aname, acfg = finalists[1]
    cuts = ([(0, n)] if sub is None or n <= sub
            else coded_windows(n, sub, math.prod(x.shape[1:])))
    pieces = []
    for a, b in cuts:
        xs = x if (a, b) == (0, n) else np.ascontiguousarray(x[a:b])
        alt = _code_with(xs, quant, aname, acfg, cache if a == 0 else None)
        pieces.append((xs, _pack(xs, quant, alt, aname, alt.out)))
    if not sum(len(d) for _, d in pieces) < len(data):
        return [(n, data, name)]
    return [(xs.shape[0], *_drifted(xs, quant, classical, aname, acfg, d, ref))
            for xs, d in pieces]


def _code_with(x: np.ndarray, quant: Quantizer, name: str, cfg: dict,
               cache: dict[str, predictors.Coded] | None) -> predictors.Coded:
    """The coding of window ``x`` with configuration (``name``, ``cfg``): from ``cache``
    (``Tuning.head``) where it holds it, or the frames after its first ones there."""
    pred = predictors.get(name)
    coded = (cache or {}).get(config_key(name, cfg))
    if coded is not None and (coded.out is None or coded.out.shape[1:] != x.shape[1:]
                              or coded.out.shape[0] > x.shape[0]):
        coded = None            # (not a coding of this window: of a shorter one, say)
    if coded is not None and coded.out is not None and coded.out.shape[0] < x.shape[0]:
        # the tuning coded the window's first frames only: the frames after them
        nh = coded.out.shape[0]
        coded = (pred.extend(coded, x, quant, cfg, sign_map(x[nh:], quant))
                 if pred.extends(x.shape) else None)
    if coded is None:
        coded = pred.encode(x, quant, cfg, sign_map(x, quant))
    return coded


def _drifted(x: np.ndarray, quant: Quantizer, classical: tuple[str, ...], name: str,
             cfg: dict, data: bytes, ref: float | None) -> tuple[bytes, str]:
    """(payload, predictor) of window ``x``, coded as ``data`` with the stack's choice
    (``name``, ``cfg``): where that takes more than DRIFT times the bits per value the
    tuning estimated for it (``ref``, ``Tuning.bits``), the window is tuned on its own,
    and coded with its own choice where that differs, the smaller payload kept (not a
    window of under DRIFT_MIN_BYTES bytes, nor of under HEAD_FRAMES frames: a tuning's
    trials and finalists cost several codings of such a window, and windows of one frame,
    dynamic ones after a still start or ``window=1``, encoded 3.3-7.5x slower for 0-4%,
    helper-46). A stack whose first window is not like the rest (dark frames, a still
    start, a pattern that forms later) was coded with a choice made for that window.
    Each window's check and choice depend on the window and the stack's tuning only: the
    same bytes whatever the thread count, and for a part of a stack coded with the
    whole's tuning."""
    if (ref is None or len(data) < DRIFT_MIN_BYTES or x.shape[0] < HEAD_FRAMES
            or not 8.0 * len(data) > DRIFT * ref * x.size):
        return data, name
    tuned = tune(x, quant, classical, against=(name, cfg))
    nname, ncfg = tuned.finalists[0]
    if (nname, ncfg) == (name, cfg):
        return data, name
    coded = _code_with(x, quant, nname, ncfg, tuned.head)
    alt = _pack(x, quant, coded, nname, coded.out)
    return (alt, nname) if len(alt) < len(data) else (data, name)


def _pack(x: np.ndarray, quant: Quantizer, coded: predictors.Coded, name: str,
          out: np.ndarray) -> bytes:
    """Entropy-code a coded window and pack its payload."""
    from . import entropy, payload

    sections: dict[str, bytes] = {}
    if coded.outliers.size:
        sections["outliers"] = x.reshape(-1)[coded.outliers].astype(
            x.dtype.newbyteorder("<")).tobytes()
    if quant.mode == MODE_LOG:
        sections["masks"] = _masks_bytes(x)
    crc = window_crc(out)

    def packed(symbols: predictors.Symbols) -> bytes:
        codes, ctx, n_ctx, groups, keys = symbols
        streams = entropy.encode(codes, ctx, n_ctx, groups, coded.has_outliers,
                                 lambda low: payload.store("low", low))
        meta = {"p": name, "cfg": {**coded.config, **keys}, "n": int(x.shape[0]),
                "o": int(coded.outliers.size), "c": crc, **coded.extra}
        return payload.pack(meta,
                            {**sections, "model": streams.model, "words": streams.words,
                             "low": streams.low},
                            {"low": streams.low_stored} if streams.low_stored else None)

    symbols = coded.entropy_input(write=True)
    data = packed(symbols)
    if symbols[4] and (len(data) < RUN_CHECK_BYTES or coded.recheck[0]):
        # a small run-coded window, or one whose runs may code it larger (its sample's
        # verdict, ``Coded.recheck``), is coded without its runs too, the smaller kept
        data = min(data, packed(coded.entropy_input()), key=len)
    return data


def _pack_shuffle(x: np.ndarray, other: bytes | None = None) -> bytes:
    """Code a bit-exact float window as byte planes + zstd (``predictors.shuffle``);
    ``other``: another payload of ``x``, whose CRC of the (same, exact) reconstruction
    is reused."""
    from . import payload

    cfg, sections = predictors.get("shuffle").encode(x)
    crc = window_crc(x) if other is None else payload.peek_meta(other)["c"]
    meta = {"p": "shuffle", "cfg": cfg, "n": int(x.shape[0]), "o": 0, "c": crc}
    return payload.pack(meta, sections)


def _learned_refusal(x: np.ndarray, quant: Quantizer, learned: Any) -> str:
    if learned is None:
        return ("--predictor learned needs a model: --adapt (fit one to the data), --model "
                "FILE, or the shipped default (not found in this installation)")
    if quant.mode not in (0, 1):
        return ("the learned predictor codes absolute and relative bounds and lossless "
                "integers, not this mode; use --predictor auto or classical")
    channels = x.shape[3] if x.ndim == 4 else 1
    return (f"the model forecasts {learned.model.channels}-channel frames but the data have "
            f"{channels}; fit one with --adapt or 'tezip train', or use --predictor classical")


@_fp_quiet
def decode_window(data: bytes, qp: QuantParams, frame_shape: tuple[int, ...],
                  frames: int, learned: Any = None, out: np.ndarray | None = None
                  ) -> np.ndarray:
    """Inverse of ``encode_window`` (``learned``: the predictor of the file's model, if
    it has one); any inconsistency -> CorruptFileError, a result that differs from the
    encoder's -> DecodeMismatchError. ``out``: where to put the window (C-contiguous, of
    its shape and dtype; returned), decoded in place where the predictor can; after an
    error its contents are undefined."""
    if out is not None and (out.shape != (frames, *frame_shape)
                            or out.dtype != np.dtype(qp.dtype)
                            or not (out.flags.c_contiguous and out.flags.writeable)):
        raise ValueError(f"out must be a writeable C-contiguous {np.dtype(qp.dtype)} array "
                         f"of shape {(frames, *frame_shape)}")
    res = _decode_window(data, qp, frame_shape, frames, learned, out)
    if out is None or res is out:
        return res
    out[...] = res
    return out


def _decode_window(data: bytes, qp: QuantParams, frame_shape: tuple[int, ...],
                   frames: int, learned: Any, dest: np.ndarray | None) -> np.ndarray:
    from . import entropy, payload
    from .predictors.lossless import from_ordered

    shape = (frames, *frame_shape)
    n = math.prod(shape)
    dtype = np.dtype(qp.dtype)
    limits = {"low": 17 * n + 8, "outliers": n * dtype.itemsize,
              "masks": 2 * ((n + 7) // 8), "planes": 2 * n * dtype.itemsize + 1024}
    p = payload.unpack(data, limits)
    meta = p.meta
    try:
        name, cfg = str(meta["p"]), meta["cfg"]
        n_frames, n_out, crc = int(meta["n"]), int(meta["o"]), int(meta["c"])
    except (KeyError, TypeError, ValueError, OverflowError):
        raise CorruptFileError("bad window metadata") from None
    if n_frames != frames or not 0 <= n_out <= n or not isinstance(cfg, dict):
        raise CorruptFileError("window metadata does not match the index")
    if name == "learned":
        if learned is None:
            raise CorruptFileError("window uses a learned predictor but the file names no "
                                   "model")
        pred = learned
    elif (name not in predictors.names()
          or (name in predictors.LOSSLESS) != (qp.kind == "bits")):
        raise CorruptFileError(f"window uses unknown predictor '{name}' (damaged, or written "
                               f"by a tezip newer than {__version__})")
    else:
        pred = predictors.get(name)
    cfg = pred.validate(cfg, shape)
    if name == "shuffle":
        if n_out or any(p.sections[s] for s in ("model", "words", "low", "outliers")):
            raise CorruptFileError("unexpected sections in a byte-plane window")
        out = pred.decode(shape, dtype, cfg, p.sections["masks"], p.sections["planes"])
        return _checked(out, crc, name)
    if p.sections["planes"]:
        raise CorruptFileError("unexpected planes section")
    quant = quantizer(qp)
    # the bit-exact decoders bound every read: their streams need no padding
    run_pad = 0 if qp.kind == "bits" else min(shape[2], RUN_CHUNK) * pred.reads(cfg)
    tables = entropy.tables(entropy.Streams(p.sections["model"], p.sections["words"],
                                            p.sections["low"]), pred.contexts(cfg), run_pad)
    if qp.kind == "bits":
        if n_out or p.sections["outliers"] or p.sections["masks"]:
            raise CorruptFileError("unexpected sections in a bit-exact window")
        q = pred.decode(shape, cfg, tables)
        tables.check_end()
        out = from_ordered(q, dtype)
    else:
        raw = p.sections["outliers"]
        if len(raw) != n_out * dtype.itemsize:
            raise CorruptFileError("bad outlier section")
        vals = np.frombuffer(raw, dtype.newbyteorder("<")).astype(dtype)
        if quant.mode == MODE_LOG:
            sgn = _sgn_from_masks(p.sections["masks"], shape)
        elif p.sections["masks"]:
            raise CorruptFileError("unexpected mask section")
        else:
            sgn = np.zeros(1, np.int8)
        out, pos = pred.decode(shape, quant, cfg, tables, vals, sgn, meta, dest)
        tables.check_end()
        if pos.size != n_out:
            raise CorruptFileError("outlier count does not match the stream")
        out.reshape(-1)[pos] = vals
    return _checked(out, crc, name)


def _checked(out: np.ndarray, crc: int, name: str) -> np.ndarray:
    """``out`` if its CRC is the encoder's, else the error that says why not."""
    if window_crc(out) != crc:
        if name == "learned":
            raise DecodeMismatchError(
                "decoded window differs from what the encoder produced (checksum of the "
                "reconstruction); this machine's arithmetic does not reproduce the "
                "encoder's forecast, or the file is damaged")
        # the classical and bit-exact paths use only exactly reproducible arithmetic
        raise CorruptFileError("decoded window does not match its checksum")
    return out


# ---------------------------------------------------------------------------------------
# whole stacks


class ArrayStack:
    """Adapts an in-memory array to the reader interface (shape, dtype, read)."""

    def __init__(self, array: np.ndarray, metadata: dict | None = None) -> None:
        self.array = np.asarray(array)
        self.shape = tuple(self.array.shape)
        self.dtype = self.array.dtype.newbyteorder("=")
        self.metadata = metadata or {}

    def read(self, t0: int, t1: int) -> np.ndarray:
        return np.ascontiguousarray(self.array[t0:t1], dtype=self.dtype)


def check_stack(shape: tuple[int, ...], dtype: np.dtype) -> str:
    name = check_dtype(dtype)
    if len(shape) not in (3, 4):
        raise UnsupportedError(f"expected a stack of frames (T, H, W) or (T, H, W, C), got "
                               f"shape {tuple(shape)}")
    if min(shape) < 0:
        raise UnsupportedError(f"a negative extent in the stack's shape {tuple(shape)}")
    if min(shape) == 0:
        raise UnsupportedError(f"empty stack (shape {tuple(shape)})")
    if shape[0] == 1:
        raise UnsupportedError("the stack has a single frame; tezip compresses stacks of "
                               "frames in time (T >= 2)")
    if math.prod(shape[1:]) > MAX_WINDOW_VALUES:
        raise UnsupportedError(f"frames of shape {tuple(shape[1:])} are too large "
                               f"(at most {MAX_WINDOW_VALUES} values per frame)")
    return name


def value_range(stack: Any, chunk: int = 64,
                progress: Callable[[int], None] | None = None) -> tuple[float, float]:
    """(min, max) over the finite values, streaming; (0, 0) if there are none. Reads at
    most ``chunk`` frames and at most about 4M values at a time."""
    return scan(stack, chunk, progress, integers=False)[:2]


_INTEGRAL_BLOCK = 1 << 16


def _extent(x: np.ndarray) -> tuple[float, float, bool]:
    """(min, max) of the finite values of ``x`` ((inf, -inf) if none), and whether every
    value is finite."""
    if not x.size:
        return math.inf, -math.inf, True
    a, b = float(x.min()), float(x.max())
    if x.dtype.kind == "f" and not (math.isfinite(a) and math.isfinite(b)):
        # a NaN makes both NaN and an infinity shows as one: only then, a pass to drop
        # the values that are not finite (two passes instead of four)
        f = x[np.isfinite(x)]
        return (float(f.min()), float(f.max()), False) if f.size else \
            (math.inf, -math.inf, False)
    return a, b, True


def scan(stack: Any, chunk: int = 64, progress: Callable[[int], None] | None = None,
         integers: bool = True, threads: int = 1) -> tuple[float, float, bool]:
    """``value_range``, and whether every value is finite and an integer (floats: in
    blocks of 4K values growing to 64K, none after the first that holds another value:
    a float stack pays for a few thousand; integer types: True). Reads at most ``chunk``
    frames and about 4M values at a time; ``threads``: the chunks' extents computed in
    up to that many threads (read on this one: h5py's readers are not safe from
    threads), each chunk then holding a share of the 4M (on smoke lengthened to 256
    frames, 16.8 MB out of cache: 0.82 ms on one thread, 0.59 on two)."""
    lo, hi = math.inf, -math.inf
    integral = integers
    per = max(1, math.prod(stack.shape[1:]))
    chunk = max(1, min(chunk, (1 << 22) // (per * max(1, threads))))
    reads = (stack.read(t0, min(stack.shape[0], t0 + chunk))
             for t0 in range(0, stack.shape[0], chunk))
    for x, (a, b, finite) in _ordered_map(lambda x: (x, _extent(x)), reads, threads):
        integral = integral and finite
        lo, hi = min(lo, a), max(hi, b)
        if integral and x.dtype.kind == "f":
            flat = x.reshape(-1)
            i, size = 0, _INTEGRAL_BLOCK >> 4
            while integral and i < flat.size:
                block = flat[i:i + size]
                integral = bool(np.array_equal(block, np.rint(block)))
                i, size = i + size, min(2 * size, _INTEGRAL_BLOCK)
        if progress:
            progress(0)
    return ((lo, hi) if lo <= hi else (0.0, 0.0)) + (integral,)


@dataclass
class Stats:
    raw_bytes: int = 0
    compressed_bytes: int = 0
    windows: int = 0
    predictors: dict[str, int] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.raw_bytes / self.compressed_bytes if self.compressed_bytes else math.inf


def model_record(model: Any) -> dict:
    """The header's record of the learned model: content hash and cost (whether the file
    stores it, after its windows, only the footer says: the writer decides at the end)."""
    cfg = model.config
    return {"hash": model.hash, "params": cfg.n_params(),
            "macs_per_pixel": cfg.macs_per_pixel(), "channels": cfg.channels}


ADAPT_MAX_VALUES = 1 << 25        # --adapt trains on at most this many values of the stack


def resolve_model(stack: Any, options: Options, qp: QuantParams,
                  progress: Callable[[str], None] | None = None) -> tuple[Any, bool]:
    """(model or None, embed it?) for ``options``: fitted to ``stack`` (``adapt``), read
    from ``options.model``, or the shipped default; None when only classical predictors
    run."""
    from .learned import registry

    if options.predictor not in ("auto", "learned") or qp.kind in ("bits", "log"):
        if options.predictor == "learned":
            raise OptionError("the learned predictor codes absolute and relative bounds and "
                              "lossless integers, not this mode")
        return None, False
    if options.adapt:
        return adapt_model(stack, qp, options.adapt_seconds, progress), True
    if options.model is not None:
        m = registry.from_file(options.model)
        return m, options.embed_model and not registry.is_shipped(m.hash)
    return registry.default(), False


def adapt_model(stack: Any, qp: QuantParams, seconds: float,
                progress: Callable[[str], None] | None = None) -> Any:
    """Fit a forecaster to ``stack`` (torch; the shipped model as the starting point when
    it has the same shape, else from scratch)."""
    try:
        from .learned import adapt
    except ImportError as exc:
        raise OptionError(f"--adapt trains a model and needs PyTorch ({exc.name} is not "
                          "installed): pip install torch") from None
    from .learned import registry
    from .learned.model import ModelConfig

    shape = tuple(int(s) for s in stack.shape)
    channels = shape[3] if len(shape) == 4 else 1
    t = max(2, min(shape[0], ADAPT_MAX_VALUES // max(1, math.prod(shape[1:]))))
    data = stack.read(0, t)
    init = registry.default()
    cfg = init.config if init is not None and init.config.channels == channels else \
        ModelConfig(channels=channels)
    if init is not None and init.config != cfg:
        init = None
    eb = qp.eb if qp.kind in ("float", "int") else 0.5
    if progress:
        progress(f"fitting the forecaster to the data ({seconds:.0f} s)")
    return registry.remember(adapt.fit([data], [eb], cfg, adapt.AdaptConfig(seconds=seconds),
                                       init=init))


def build_header(stack: Any, options: Options, qp: QuantParams, vrange: tuple[float, float],
                 window: int, model: dict | None = None) -> dict:
    b = options.bound
    return {
        "format": "tez", "format_version": FORMAT_VERSION, "tezip": __version__,
        "dtype": qp.dtype, "shape": [int(s) for s in stack.shape],
        "bound": {"mode": b.mode, "abs": b.abs, "rel": b.rel, "pw": b.pw},
        "quant": qp.to_dict(), "predictor": options.predictor, "window": window,
        "windows": ("dynamic" if options.threshold else "fixed"),
        "threshold": options.threshold, "model": model,
        "value_range": list(vrange), "metadata": getattr(stack, "metadata", {}) or {},
    }


# Worker threads, kept for the life of the process, one pool per thread count: a pool made
# and joined for every call cost 0.3 ms, as much as the tuning's six sample trials it ran
_POOLS: dict[int, cf.ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()
_IN_POOL = threading.local()


def _mark_worker() -> None:
    _IN_POOL.worker = True


def _pool(threads: int) -> cf.ThreadPoolExecutor:
    with _POOLS_LOCK:
        pool = _POOLS.get(threads)
        if pool is None:
            pool = _POOLS[threads] = cf.ThreadPoolExecutor(
                threads, thread_name_prefix="tezip", initializer=_mark_worker)
        return pool


def _forget_pools() -> None:
    """In a forked child: the parent's worker threads do not exist there."""
    global _POOLS_LOCK
    _POOLS_LOCK = threading.Lock()
    _POOLS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


def _ordered_map(fn: Callable[[Any], Any], items: Iterator[Any], threads: int) -> Iterator[Any]:
    """``map(fn, items)`` in order, with up to ``threads`` calls under way (and at most
    2 x threads items read ahead, so memory stays bounded). In a worker thread of these
    pools, one call after another (a task that waited on tasks of its own pool could wait
    forever). When it ends, early or not, no call of its is still running."""
    if threads <= 1 or getattr(_IN_POOL, "worker", False):
        for item in items:
            yield fn(item)
        return
    pool = _pool(threads)
    pending: deque[cf.Future] = deque()
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            while len(pending) >= 2 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()
        cf.wait(pending)


def _classical(options: Options) -> tuple[str, ...]:
    """The classical predictors ``options`` may tune among."""
    return tuple(c for c in options.candidates(False) if c != "learned")


def _tunes(qp: QuantParams, classical: tuple[str, ...]) -> bool:
    """Whether a stack is tuned (not for bit-exact floats, nor without classical
    predictors)."""
    return bool(classical) and qp.kind != "bits"


def _tune_on(head: np.ndarray, qp: QuantParams, classical: tuple[str, ...],
             threads: int = 1, longer: np.ndarray | None = None) -> Tuning:
    if not _tunes(qp, classical):
        return Tuning(None)
    return tune(np.ascontiguousarray(head), quantizer(qp), classical, threads,
                longer=None if longer is None else np.ascontiguousarray(longer))


def tune_stack(stack: Any, options: Options,
               vrange: tuple[float, float] | None = None, integral: bool = False) -> Tuning:
    """What ``compress_stack(stack, ..., vrange=vrange, integral=integral)`` tunes on its
    first window: pass it to the compression of later frames of the same stack to code
    them the same way."""
    shape = tuple(int(s) for s in stack.shape)
    dtype = np.dtype(stack.dtype)
    check_stack(shape, dtype)
    qp, vrange = _resolve_stack(stack, options, dtype, vrange, integral)
    wlen = window_length(options.window, math.prod(shape[1:]))
    classical = _classical(options)
    head = stack.read(*_head(shape, wlen))
    t = _tune_on(head, qp, classical)
    if options.adapt:       # (the model is fitted to the stack: every window tries it)
        return Tuning(t.finalists, bits=t.bits)
    learned = _learned_for(options, resolve_model(stack, options, qp)[0], shape, dtype)
    plan = coded_windows(shape[0], wlen, math.prod(shape[1:]))
    t = _head_trial(t, head, qp, options, learned,
                    (lambda: stack.read(*plan[-1])) if len(plan) >= 3 else None)
    return Tuning(t.finalists, bits=t.bits, hopeless=t.hopeless)


def _learned_for(options: Options, model: Any, shape: tuple[int, ...],
                 dtype: np.dtype) -> Any:
    """The learned predictor of ``model`` for a stack of ``shape`` and ``dtype``, where
    its expected decoding speed reaches the floor (or the options ask for it); else
    None."""
    if model is None:
        return None
    from .predictors.learned import for_model

    channels = shape[3] if len(shape) == 4 else 1
    fast = learned_decode_mbps(model.config.macs_per_pixel(), channels,
                               dtype.itemsize, math.prod(shape[1:])) >= options.floor()
    return for_model(model) if fast or options.predictor == "learned" else None


def _head_trial(tuning: Tuning, head: np.ndarray, qp: QuantParams, options: Options,
                learned: Any, last: Callable[[], np.ndarray] | None = None) -> Tuning:
    """``tuning`` with the learned predictor's trial on ``head`` (the stack's first
    window, on which it was tuned, or that window lengthened for the transform) against
    its first choice, where ``auto`` tries the learned predictor in each window: whether
    it is hopeless there and on the stack's last window too (``last``: it reads that
    window; None: the stack has fewer than 3 windows, and none is skipped), in which case
    the windows like the first skip their trials (``encode_window_alternatives``); and
    the trial itself, which the first window takes where it is ``head`` instead of running
    it again. (With the first window alone, a stack whose first window was another regime
    than the rest, ks_pypde's first frames reversed in time or shuffled, lost the learned
    predictor in every later window: files 6-13% larger; helper-50.)"""
    quant = quantizer(qp)
    if (learned is None or not tuning.finalists or options.adapt
            or options.predictor == "learned" or "learned" not in options.candidates(True)
            or not learned.supports(head.shape, quant)):
        return tuning
    name, cfg = tuning.finalists[0]
    t = _learned_trial(np.ascontiguousarray(head), quant, learned, name, cfg)
    hopeless = t.classical if t.hopeless and t.classical and last is not None else None
    if hopeless is not None:
        x = np.ascontiguousarray(last())
        if not (learned.supports(x.shape, quant)
                and _learned_trial(x, quant, learned, name, cfg).hopeless):
            hopeless = None
    return replace(tuning, hopeless=hopeless, trial=t)


def _resolve_stack(stack: Any, options: Options, dtype: np.dtype,
                   vrange: tuple[float, float] | None, integral: bool = False
                   ) -> tuple[QuantParams, tuple[float, float]]:
    """The stack's grid and value range (``vrange``, where given: then its values are
    not read, and ``integral`` says whether they are all finite integers, as ``scan``
    finds, over the whole of which the stack is a part: the shards of ``tezip prepare``
    and the pieces of a shard must agree on their grid)."""
    if not isinstance(integral, (bool, np.bool_)):
        raise OptionError(f"integral must be True or False, not {integral!r}")
    integral = bool(integral)
    if vrange is None:
        vrange = (0.0, 0.0)
        if options.bound.mode in ("rel", "absrel") or dtype.kind == "f":
            lo, hi, integral = scan(stack, integers=dtype.kind == "f",
                                    threads=options.n_threads())
            vrange = (lo, hi)
    vr = (float(vrange[0]), float(vrange[1]))
    return resolve(options.bound, dtype, vr, integral=integral), vr


def _transform_window(options: Options, qp: QuantParams, shape: tuple[int, ...],
                      wlen: int) -> int:
    """The windows' length should the stack's tuning take the transform (``windows.
    transform_window``), where it is a candidate that codes this bound, the windows are
    automatic (no ``window``, no ``threshold``, ``transform_windows``) and the stack is
    longer than one; else ``wlen``."""
    if (options.window is not None or options.threshold or not options.transform_windows
            or TRANSFORM not in options.candidates() or shape[0] <= wlen
            or not predictors.get(TRANSFORM).configs(np.zeros((1, 1, 1)), quantizer(qp))):
        return wlen
    return transform_window(wlen, math.prod(shape[1:]))


def _head(shape: tuple[int, ...], wlen: int) -> tuple[int, int]:
    """The frames the tuning runs on: the first ``wlen``, also where the first window is
    longer (a joined tail, ``windows.coded_windows``). Its sample then has no frames past
    the anchor grid in time, as in every other window's tuning: tuned on all 39 frames of
    iris, the sample ranked an axis order first that codes the window 15% larger."""
    return 0, min(wlen, shape[0])


def compress_stack(stack: Any, out: str | os.PathLike | None, options: Options, *,
                   force: bool = False, fileobj: Any = None,
                   progress: Callable[[int], None] | None = None,
                   vrange: tuple[float, float] | None = None,
                   integral: bool = False,
                   tuning: Tuning | None = None, lean: bool = False) -> Stats:
    """Compress a reader (``shape``, ``dtype``, ``read(t0, t1)``, ``metadata``) into a .tez
    file at ``out`` (atomically) or into ``fileobj``. ``vrange`` (min, max of the finite
    values) overrides the stack's own, e.g. so that every shard of a larger stack resolves a
    relative bound against the whole stack's range; ``integral`` goes with it: whether
    every value of that larger stack is a finite integer (``scan``), so that a float stack
    of integers is coded on the integer grid in every part. ``tuning`` (from ``tune_stack``)
    overrides the tuning on this stack's first window, e.g. so that the pieces of one
    shard, encoded apart, write the same bytes as the whole shard. ``lean``: a file
    whose windows turn out not to use the learned model does not name it in its header
    (where the file is small: ``container.LEAN_MAX``; it saves the model's record, 118
    bytes, 4.8% of a 2.5 KB file); not for pieces that ``dataset.shards.assemble``
    joins, which take the first piece's header."""
    shape = tuple(int(s) for s in stack.shape)
    dtype = np.dtype(stack.dtype)
    check_stack(shape, dtype)
    check_axes(shape)       # (before the windows' plan, a list as long as the stack)
    vrange_given = vrange is not None
    qp, vrange = _resolve_stack(stack, options, dtype, vrange, integral)
    classical = _classical(options)
    if tuning is not None and (
            (tuning.finalists is None and _tunes(qp, classical))
            or (tuning.finalists is not None
                and (not tuning.finalists or tuning.finalists[0][0] not in classical))):
        raise OptionError("the tuning passed does not fit these options: it must come "
                          "from tune_stack with the same predictor option")
    wlen = window_length(options.window, math.prod(shape[1:]))
    model, embed = resolve_model(stack, options, qp)
    learned = _learned_for(options, model, shape, dtype)
    if options.predictor == "learned" and model is None:
        raise OptionError(_learned_refusal(np.zeros((2, 1, 1), dtype), quantizer(qp), None))
    if options.threshold:
        scale = vrange[1] - vrange[0]
        if scale <= 0:
            lo, hi = value_range(stack)
            scale = hi - lo
        plan = dynamic_windows(stack, wlen, options.threshold, scale)
    else:
        plan = coded_windows(shape[0], wlen, math.prod(shape[1:]))
    # a float stack on the integer grid because the caller said it is all integers
    # (``integral`` with ``vrange``): each window is checked, as the grid would break the
    # bound on any other value (the stack's own scan checked it otherwise)
    trusted = integral and vrange_given and dtype.kind == "f" and qp.kind == "int"

    def read(t0: int, t1: int) -> np.ndarray:
        x = stack.read(t0, t1)
        if trusted and not (np.isfinite(x).all() and np.array_equal(x, np.rint(x))):
            raise OptionError(f"integral=True, but frames {t0}-{t1 - 1} hold a value "
                              "that is not a finite integer: pass the integral flag "
                              "that codec.scan finds over the whole stack")
        return x

    # the tuning, on the first window (before the header: it may lengthen the windows),
    # and the first window the transform would code, its windows lengthened (read once)
    long_len = wlen if tuning is not None else _transform_window(options, qp, shape, wlen)
    long_plan = coded_windows(shape[0], long_len, math.prod(shape[1:]))
    longer = (read(*long_plan[0]) if long_len > wlen and long_plan[0] != plan[0]
              else None)
    first = read(*plan[0]) if longer is None else longer[:plan[0][1] - plan[0][0]]
    # the first window's codings from the tuning, when it was tuned on that window
    cache: dict[int, dict[str, predictors.Coded] | None] = {}
    own = plan[0] == _head(shape, wlen)
    sub = None          # the windows' own length where they are lengthened
    if tuning is None:
        head = first if own else stack.read(*_head(shape, wlen))
        tuning = _tune_on(head, qp, classical, options.n_threads(), longer)
        if own:
            cache[0] = tuning.head
        if longer is not None and tuning.finalists and tuning.finalists[0][0] == TRANSFORM:
            # (the tuning's codings: the transform's of this longer window, the classical
            # choice's of the window's own first frames, its first part: ``_settled``)
            sub, wlen, plan, first = wlen, long_len, long_plan, longer
            cache[0] = tuning.head
        # the learned trial on the first window: the head, as ``tune_stack`` makes it, or
        # the lengthened window (whose later windows are as long)
        tuning = _head_trial(tuning, head if sub is None else first, qp, options, learned,
                             (lambda: read(*plan[-1])) if len(plan) >= 3 else None)
    finalists = tuning.finalists
    frames = ((t0, t1, first if i == 0 else read(t0, t1))
              for i, (t0, t1) in enumerate(plan))
    # the header's window: the longest a window may be (a joined last one is longer)
    header = build_header(stack, options, qp, vrange, max([wlen] + [b - a for a, b in plan]),
                          model_record(model) if learned is not None else None)
    candidates = options.candidates(learned is not None)
    thorough = options.adapt or options.predictor == "learned"
    stats = Stats(raw_bytes=math.prod(shape) * dtype.itemsize)
    model_paid = learned is None or not embed      # a stored model must pay for itself
    lean_header = (build_header(stack, options, qp, vrange, header["window"], None)
                   if lean and learned is not None else None)
    with ContainerWriter(out, header, force=force, fileobj=fileobj,
                         lean_header=lean_header) as w:
        def work(item: tuple[int, int, np.ndarray]) -> tuple[int, int, Encoded]:
            t0, t1, x = item
            return t0, t1, encode_window_alternatives(
                x, qp, candidates, learned, thorough, finalists, cache.pop(t0, None),
                tuning.bits, sub, tuning.hopeless,
                tuning.trial if t0 == 0 and (own or sub is not None) else None)

        for t0, t1, enc in _ordered_map(work, frames, options.n_threads()):
            parts = enc.parts or [(t1 - t0, enc.payload, enc.predictor)]
            if enc.alternative is not None and not model_paid:
                # the first learned window must save at least the model's bytes
                if _size(enc.alternative) - _size(parts) >= len(model.data):
                    model_paid = True
                else:
                    parts = enc.alternative
            t = t0
            for n, data, used in parts:
                w.add_window(t, n, data)
                t += n
                stats.predictors[used] = stats.predictors.get(used, 0) + 1
                stats.windows += 1
                if progress:
                    progress(n)
        w.close(model.data if embed and "learned" in stats.predictors else None,
                lean="learned" not in stats.predictors)
    stats.compressed_bytes = w.bytes_written
    return stats


class TezFile:
    """Random access to a .tez file: ``f[10:20]`` decodes only the windows holding frames
    10-19. Also an iterator over decoded windows for streaming decompression. Windows are
    decoded in up to ``threads`` threads (None: one per CPU); one TezFile may be used from
    many threads at once."""

    def __init__(self, source: str | os.PathLike | bytes, model: str | None = None,
                 threads: int | None = None) -> None:
        self.model = model
        self.threads = threads or default_threads()
        self._lock = threading.Lock()
        if isinstance(source, (str, os.PathLike)):
            from .io import hdf5_tree, sniff_format  # a .tez stream inside an HDF5 file

            if sniff_format(source) == "hdf5":
                source = hdf5_tree.open_embedded(os.fspath(source))  # type: ignore[assignment]
        self._c = ContainerReader(source)
        try:
            self._validate()
        except BaseException:
            self._c.close()
            raise

    def _validate(self) -> None:
        h = self._c.header
        bad = CorruptFileError(f"{self._c.name}: header fields are invalid; the file is damaged")
        try:
            shape = tuple(int(s) for s in h["shape"])
            dtype = np.dtype(h["dtype"])
            self.quant = QuantParams.from_dict(h["quant"])
            window = int(h["window"])
        except (KeyError, TypeError, ValueError, OverflowError):
            raise bad from None
        if (len(shape) not in (3, 4) or min(shape) < 1 or max(shape) > 2**31
                or self.quant.dtype != dtype.name or window < 1
                or math.prod(shape[1:]) * window > MAX_WINDOW_VALUES):
            raise bad
        entries = self._c.entries
        if sum(e.frames for e in entries) != shape[0] or any(e.frames > window for e in entries):
            raise bad
        self.header = h
        self.version = self._c.version
        self.shape = shape
        self.dtype = dtype
        self.window = window
        self.metadata = h.get("metadata") or {}
        rec = h.get("model")
        self.model_hash = rec.get("hash") if isinstance(rec, dict) else None
        if rec is not None and not (isinstance(self.model_hash, str)
                                    and _SHA256.fullmatch(self.model_hash)):
            raise bad      # a learned window would name this hash in its messages
        self._starts = np.array([e.t0 for e in entries], np.int64)
        self._learned_model: Any = None
        self._learned_error: Exception | None = None
        if self.version >= 2 and self.model_hash is not None:
            self._resolve_learned()

    def _resolve_learned(self) -> None:
        """The file's model: embedded, shipped (by hash), or the one given as ``model``."""
        from .learned import registry

        h = self.model_hash
        if self._c.model_bytes is not None:
            m = registry.from_embedded(self._c.model_bytes, f"{self._c.name}: embedded model")
            if m.hash != h:
                raise CorruptFileError(f"{self._c.name}: the embedded model is not the one the "
                                       "header names; the file is damaged")
        else:
            m = registry.by_hash(h)
            if m is None and self.model is not None:
                m = registry.from_file(self.model)
                if m.hash != h:
                    raise DecodeMismatchError(
                        f"{self._c.name} was coded with model {h[:16]}, but {self.model} is "
                        f"{m.hash[:16]}; pass the encoder's model with --model")
            if m is None:
                # only learned windows need it: report when one is decoded
                self._learned_error = OptionError(
                    f"{self._c.name} was coded with a learned model ({h[:16]}) that is "
                    "neither in the file nor shipped with this tezip; pass it with --model")
                return
        self._learned_model = m

    @property
    def _learned(self) -> Any:
        """The predictor of the file's model (None without one), made when a window is
        decoded: opening a file (``tezip info``) does not load the compiled kernels."""
        if self._learned_model is None:
            return None
        from .predictors.learned import for_model

        return for_model(self._learned_model)

    @property
    def n_windows(self) -> int:
        return len(self._c.entries)

    @property
    def model_stored(self) -> bool:
        """Whether the file stores the learned model its windows use."""
        return self._c.model_bytes is not None

    @property
    def compressed_bytes(self) -> int:
        return self._c.size

    def __len__(self) -> int:
        return self.shape[0]

    def window_frames(self) -> list[tuple[int, int]]:
        return [(e.t0, e.t0 + e.frames) for e in self._c.entries]

    def _payload(self, i: int) -> bytes:
        with self._lock:                       # one file handle, shared
            return self._c.payload(i)

    def decode_window(self, i: int) -> np.ndarray:
        return self._decode(i, self._payload(i))

    def _decode(self, i: int, data: bytes, out: np.ndarray | None = None) -> np.ndarray:
        """Window ``i`` from its payload (into ``out``, see ``decode_window``)."""
        e = self._c.entries[i]
        try:
            if self.version == 1:
                from .legacy import v1

                w = v1.decode_window(data, self.quant, self.shape[1:], e.frames,
                                     self.model, self.model_hash)
                if out is not None:
                    out[...] = w
                return w
            if self._learned is None and self._learned_error is not None \
                    and b'"p":"learned"' in data[:4096]:
                raise self._learned_error
            return decode_window(data, self.quant, self.shape[1:], e.frames, self._learned,
                                 out)
        except CorruptFileError as exc:
            if str(exc).startswith(self._c.name):
                raise
            raise CorruptFileError(f"{self._c.name}: window {i}: {exc}") from None

    def window_meta(self, i: int) -> dict:
        """The small JSON record at the start of window ``i`` (predictor used, sizes)."""
        from .payload import peek_meta

        try:
            meta = peek_meta(self._payload(i))
        except CorruptFileError:
            meta = None
        if not isinstance(meta, dict) or "p" not in meta:
            raise CorruptFileError(f"{self._c.name}: window {i}: bad window metadata")
        return meta

    def _windows(self, indices: list[int], dests: dict[int, np.ndarray] | None = None
                 ) -> Iterator[tuple[int, np.ndarray]]:
        """(index, decoded window) in order, decoded in parallel threads (``dests``: where
        to decode some of them, by index)."""
        dests = dests or {}
        items = ((i, self._payload(i)) for i in indices)
        yield from _ordered_map(lambda it: (it[0], self._decode(*it, dests.get(it[0]))),
                                items, min(self.threads, max(1, len(indices))))

    def iter_windows(self) -> Iterator[tuple[int, np.ndarray]]:
        for i, w in self._windows(list(range(self.n_windows))):
            yield self._c.entries[i].t0, w

    def read(self, t0: int, t1: int) -> np.ndarray:
        t0, t1 = max(0, t0), min(self.shape[0], t1)
        out = np.empty((max(0, t1 - t0), *self.shape[1:]), self.dtype)
        if t1 <= t0:
            return out
        first = int(np.searchsorted(self._starts, t0, side="right") - 1)
        last = int(np.searchsorted(self._starts, t1 - 1, side="right") - 1)
        entries = self._c.entries
        # windows wholly inside the range decode straight into it (no copy)
        dests = {i: out[entries[i].t0 - t0:entries[i].t0 + entries[i].frames - t0]
                 for i in range(first, last + 1)
                 if entries[i].t0 >= t0 and entries[i].t0 + entries[i].frames <= t1}
        for i, w in self._windows(list(range(first, last + 1)), dests):
            if i in dests:
                continue
            e = entries[i]
            a, b = max(t0, e.t0), min(t1, e.t0 + e.frames)
            out[a - t0:b - t0] = w[a - e.t0:b - e.t0]
        return out

    def __getitem__(self, key: Any) -> np.ndarray:
        if isinstance(key, tuple):
            first, rest = (key[0], key[1:]) if key else (slice(None), ())
            return self[first][(slice(None), *rest)] if not isinstance(first, (int, np.integer)) \
                else self[first][rest]
        if isinstance(key, (int, np.integer)):
            k = int(key) + (self.shape[0] if key < 0 else 0)
            if not 0 <= k < self.shape[0]:
                raise IndexError(f"frame {key} out of range for {self.shape[0]} frames")
            return self.read(k, k + 1)[0]
        if isinstance(key, slice):
            start, stop, step = key.indices(self.shape[0])
            if step == 1:
                return self.read(start, stop)
            idx = range(start, stop, step)
            if not idx:
                return self.read(0, 0)
            block = self.read(min(idx), max(idx) + 1)
            return block[np.array(idx) - min(idx)]
        raise TypeError(f"index with an int or a slice, not {type(key).__name__}")

    def read_all(self) -> np.ndarray:
        return self.read(0, self.shape[0])

    def close(self) -> None:
        self._c.close()

    def __enter__(self) -> TezFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
