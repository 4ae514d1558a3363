"""Classical value predictors, each a compiled predict-quantize-reconstruct kernel:

- ``interp``: multilevel interpolation over (t, y, x) with exact anchors and level-wise
  bounds (``kernels.interp``); its axis order, cubic or linear interpolation and the
  level-wise bounds are tuned per window.
- ``lorenzo``: 3-D Lorenzo (``kernels.lorenzo``); ``spatial``: 2-D Lorenzo per frame.
  Either may add a second stage fitted to the stack (on the first window's first frames,
  ``codec.tune``): its Lorenzo residuals predicted from those of the neighbours in the
  rows above and the previous frame, with weights in sixteenths found by least squares
  (``fit_second_stage``).

Channels (T, H, W, C) are coded one after another with the same configuration, into one
stream. Instances hold no per-call state: one instance serves every thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from ..errors import CorruptFileError, OptionError
from ..kernels import interp as KI
from ..kernels import lorenzo as KL
from ..kernels.consts import MODE_INT, MODE_LOG
from ..kernels.core import call
from ..quantize import Quantizer
from . import Coded, ValuePredictor

ORDERS = ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))
ALPHA_BETA = ((1.0, 1.0), (1.25, 2.0), (1.5, 2.5), (2.0, 3.0))
DEFAULT_ANCHOR = 32
NARROW_VIA_INT32 = 3 << 20     # see ``Interpolation._dec``
EDGE_TRIAL = 3      # the edge extrapolation interp's tuning tries (``interp_kind``; one
#                     trial: both axes; 0: none, as before format v5)
W_MAX = 64          # the second stage's weights (sixteenths) lie in [-W_MAX, W_MAX]
RUN_SHARE = 0.8     # a window is run-coded (``kernels.lorenzo.runs_apply``, format v6;
#                     ``kernels.interp.runs_apply``, v7) where that leaves at most this
#                     share of its codes to decode
RUN_MIN = 1 << 14   # ... and it has at least this many codes (the run contexts' tables
#                     cost 50-100 bytes: a test's 4,800-code uint16 window coded 1.11x
#                     as large)
RUN_GAIN = 16       # an interpolation window is run-coded (format v7) where, besides,
#                     its runs save the decoder at least this many symbols each: a run
#                     costs the decoding kernel about 25 ns (its branches), a symbol not
#                     decoded saves about 2 ns (fitted to speckle at 1e-2, 50 symbols a
#                     run, 1.42x as fast; at 1e-3, 6.5 a run, 0.86x; smoke at 1e-4, 14
#                     a run, 1.0x)
RUN_SAMPLE = 1 << 16  # a run-coded window on the integer grid whose run coding, on a
#                     sample of about this many of its codes (every k-th row of points: a
#                     row's runs depend on that row only), may code larger than its plain
#                     coding (``_runs_doubtful``) is coded both ways when written, the
#                     smaller kept (``Coded.recheck``): runs chosen for speed made detector
#                     dark frames (uint16, Poisson noise, abs 2) 1.18x as large
#                     (``benchmarks/run_sizes.py``). The sample only raises the doubt: on
#                     sparse events it favours the plain coding (each symbol present costs
#                     the coder's table a unit of 4096, and a sample holds fewer), runs
#                     0.47x as large read 0.90x on 64K codes, 0.99x on 32K (and
#                     ``estimate_bits``, which prices no table, 1.24x). Not on the float
#                     grid: no run-coded window on it was seen larger with its runs (the
#                     shared stacks at 1e-2..1e-4; dark frames in float32 were not
#                     run-coded on it, and are now on the integer grid), and the check
#                     cost smoke's encoding 12-15%. 0: no check
RUN_LOW_SHARE = 1 / 3  # ... or where raw low bits are this share of the sample's plain
#                        coding or more (they may compress in the file)


def channels(x: np.ndarray) -> list[np.ndarray]:
    """The (T, H, W) volumes of a window, C-contiguous."""
    if x.ndim == 3:
        return [np.ascontiguousarray(x)]
    return [np.ascontiguousarray(x[..., c]) for c in range(x.shape[3])]


def _buffers(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes, contexts, outlier positions (flat positions within a channel < 2^27)."""
    return np.empty(n, np.int32), np.empty(n, np.uint8), np.empty(n, np.int32)


def _rec(out: np.ndarray, quant: Quantizer) -> np.ndarray:
    """The prediction domain: the output itself, or float64 log-domain values."""
    return np.empty(out.shape, np.float64) if quant.mode == MODE_LOG else out


def _sign_of(sgn: np.ndarray, c: int, nch: int) -> np.ndarray:
    if sgn.ndim == 4:
        return np.ascontiguousarray(sgn[..., c])
    return sgn


def _assemble(outs: list[np.ndarray], shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if len(shape) == 3:
        return outs[0]
    out = np.empty(shape, dtype)
    for c, o in enumerate(outs):
        out[..., c] = o
    return out


def _flat_positions(pos: list[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    """Per-channel flat positions -> flat positions in the (T, H, W[, C]) array."""
    if len(shape) == 3:
        return pos[0]
    nch = shape[3]
    return np.concatenate([p * nch + c for c, p in enumerate(pos)]) if pos else np.zeros(0,
                                                                                          np.int64)


class _Kernel(ValuePredictor):
    """Shared driver: run the kernel per channel, collect codes and outliers."""

    kernel: ClassVar[Any]

    def _enc(self, xc: np.ndarray, out: np.ndarray, rec: np.ndarray, sg: np.ndarray,
             quant: Quantizer, config: dict, codes: np.ndarray, ctx: np.ndarray,
             outp: np.ndarray, n0: int, no0: int,
             segs: list[Any] | None = None) -> tuple[int, int]:
        """Code one channel from code n0 and outlier no0; returns (codes, outliers) after
        it. ``segs`` (where given and the kernel has a run coding): gets what ``_runs``
        needs of the channel's coding."""
        raise NotImplementedError

    def _runs(self, coded: Coded, segs: list[Any], shape: tuple[int, ...],
              quant: Quantizer) -> Coded:
        """``coded`` with its run coding (``Coded.recode``) where the kernel has one."""
        return coded

    def _dec(self, out: np.ndarray, rec: np.ndarray, sg: np.ndarray, quant: Quantizer,
             config: dict, t: Any, outv: np.ndarray, outp: np.ndarray,
             st: np.ndarray) -> None:
        raise NotImplementedError

    def encode(self, x: np.ndarray, quant: Quantizer, config: dict, sgn: np.ndarray,
               sample: bool = False) -> Coded:
        vols = channels(x)
        n = x.size
        codes, ctx, outp = _buffers(n)
        outs, pos = [], []
        nn = no = 0
        segs: list[Any] | None = None if sample else []
        for c, xc in enumerate(vols):
            out = np.empty_like(xc)
            no_before = no
            nn, no = self._enc(xc, out, _rec(out, quant), _sign_of(sgn, c, len(vols)), quant,
                               config, codes, ctx, outp, nn, no, segs)
            if not sample:
                p = outp[no_before:no]
                out.reshape(-1)[p] = xc.reshape(-1)[p]      # exact, bit for bit
                outs.append(out)
                pos.append(p.copy())
        rec = None if sample else _assemble(outs, x.shape, x.dtype)
        flat = np.zeros(0, np.int64) if sample else _flat_positions(pos, x.shape)
        coded = Coded(config, codes[:nn], ctx[:nn], flat, rec, self.n_ctx, self.groups)
        return coded if segs is None else self._runs(coded, segs, x.shape, quant)

    def decode(self, shape: tuple[int, ...], quant: Quantizer, config: dict, tables: Any,
               outlier_values: np.ndarray, sgn: np.ndarray, meta: dict | None = None,
               out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        vol = shape[:3]
        into = out if len(shape) == 3 else None
        nch = shape[3] if len(shape) == 4 else 1
        st = tables.st
        outv = outlier_values.astype(np.float64)
        outp = np.zeros(max(1, outv.size), np.int32)
        outs, pos = [], []
        for c in range(nch):
            out = into if into is not None else np.empty(vol, quant.dtype)
            op0 = int(st[7])
            self._dec(out, _rec(out, quant), _sign_of(sgn, c, nch), quant, config, tables,
                      outv, outp, st)
            op1 = min(int(st[7]), outv.size)
            outs.append(out)
            pos.append(outp[op0:op1].copy() if op1 > op0 else np.zeros(0, np.int64))
        return _assemble(outs, shape, quant.dtype), _flat_positions(pos, shape)


def interp_kind(config: dict) -> int:
    """The interpolation kernels' ``kind`` flags of a configuration: cubic, and linear
    extrapolation at the edges (``edge``, format v5, absent before: 1 along time, 2
    along the frame's axes, 3 both; the tuning tries 3)."""
    return (KI.CUBIC if config["cubic"] else 0) | (config.get("edge", 0) * KI.EDGE_T)


def has_edges(shape: tuple[int, ...], anchor: int = DEFAULT_ANCHOR) -> bool:
    """Whether interpolating a volume of ``shape`` (T, H, W[, C]) meets a point that the
    edges' linear extrapolation predicts: an axis of at least 4 points whose last one is
    off the anchor grid. The tuning's sample of a large frame is tiles of 33 x 33 (on
    the grid) over a window of 33 frames (on it too): none, so no edge trial is made
    there; the window's own spatial edges (a frame side not 1 more than a multiple of
    32) are then left to the left neighbour (on a smooth 33 x 70 x 75 field that left 2.8%
    on the table)."""
    return any(n >= 4 and (n - 1) % anchor for n in shape[:3])


class Interpolation(_Kernel):
    name = "interp"
    n_ctx = KI.N_CTX
    groups = KI.GROUPS
    # the level-wise bounds: their sample ranking was the whole window's in every
    # finalist pair of the shared data sets' lossy cells; the axis order and cubic
    # against linear are ranked on the window (tiles' borders misrank cubic on speckle).
    # The edges' extrapolation too is the sample's choice: as finalists of their own its
    # variants, within a fraction of a percent of each other on the sample, took the
    # places of better settings (speckle at 1e-3 lost 8%: cubic ranked on the window
    # against its edge variants only, where linear interpolation codes it 9% smaller)
    sample_ranked = ("ab", "edge")

    def configs(self, x: np.ndarray, quant: Quantizer) -> list[dict]:
        return [{"order": list(o), "cubic": cub, "ab": list(ab), "anchor": DEFAULT_ANCHOR,
                 **({"edge": 3} if edge else {})}
                for o in ORDERS for cub in (False, True) for edge in (False, True)
                for ab in ALPHA_BETA]

    def tune(self, sample, quant, sgn, cost, pmap=map):
        """Greedy: the axis order with linear interpolation (the orders tried side by
        side with ``pmap``), then cubic, then linear extrapolation at the edges (time
        and space at once), then the level-wise bounds from the mildest on, while each
        improves (every one of the 96 combinations would cost 10x more for a
        few tenths of a percent on the shared data sets; every level-wise bound after
        one that did not improve, a fifth more for the same choices in their lossy
        cells; and where the bounds code alike, as in lossless integer coding, those
        ties crowded the other settings out of the finalists)."""
        def trial(cfg: dict) -> float:
            return cost(self.encode(sample, quant, cfg, sgn, sample=True))

        cfg = {"order": list(ORDERS[0]), "cubic": False, "ab": [1.0, 1.0],
               "anchor": DEFAULT_ANCHOR}
        first = [{**cfg, "order": list(o)} for o in ORDERS]
        tried = [(b, i, c) for i, (b, c) in enumerate(zip(pmap(trial, first), first,
                                                            strict=True))]
        best = min(tried, key=lambda t: t[:2])
        edge = [("edge", EDGE_TRIAL)] if EDGE_TRIAL and has_edges(sample.shape) else []
        for key, value in ([("cubic", True)] + edge
                           + [("ab", list(ab)) for ab in ALPHA_BETA[1:]]):
            c = {**best[2], key: value}
            tried.append((trial(c), len(tried), c))
            if tried[-1][:2] < best[:2]:
                best = tried[-1]
            elif key == "ab":
                break           # past one that lost, none won on the shared data sets
        return [(bits, c) for bits, _, c in sorted(tried, key=lambda t: t[:2])]

    def validate(self, config, shape):
        try:
            order = [int(v) for v in config["order"]]
            ab = [float(v) for v in config["ab"]]
            cfg = {"order": order, "cubic": bool(config["cubic"]), "ab": ab,
                   "anchor": int(config["anchor"])}
            edge = config.get("edge", 0)
        except (KeyError, TypeError, ValueError, OverflowError):
            raise CorruptFileError("bad predictor configuration") from None
        a = cfg["anchor"]
        if (sorted(order) != [0, 1, 2] or len(ab) != 2 or not all(1.0 <= v <= 64.0 for v in ab)
                or a < 0 or a > 1 << 20 or (a & (a - 1))
                or type(edge) is not int or edge not in (0, 1, 2, 3)):
            raise CorruptFileError("bad predictor configuration")
        if edge:
            cfg["edge"] = edge
        if "r" in config:       # run coding (format v7)
            if not (config["r"] == 1 and type(config["r"]) is int):
                raise CorruptFileError("bad predictor configuration")
            cfg["r"] = 1
        extra = set(config) - {"order", "cubic", "ab", "anchor", "edge", "r"}
        if extra:
            raise CorruptFileError("bad predictor configuration")
        return cfg

    def contexts(self, config: dict) -> int:
        return KI.N_CTX_RUNS if config.get("r") else KI.N_CTX

    def reads(self, config: dict) -> int:
        return 2 if config.get("r") else 1     # a run's symbol and the code that ends it

    def _runs(self, coded, segs, shape, quant):
        # (the closure holds the arrays, not ``coded``, which will hold it: a reference
        # cycle kept each window's arrays until the cyclic collector ran, and encoding
        # took fresh pages, speckle 1.15x slower)
        c_codes, c_ctx = coded.codes, coded.ctx
        n = c_codes.size

        def apply(limit: int) -> tuple[np.ndarray, np.ndarray, int]:
            # where the runs leave at most ``limit`` symbols (they save the decoder the
            # quiet zeros less the runs: first on a sample of the codes, with a margin)
            # and each saves it at least RUN_GAIN symbols (first on the bound of
            # ``quiet_stats``), each step only if the one before holds
            if KI.quiet_zeros(c_codes, c_ctx, 16, 1024) * n < 0.75 * (n - limit):
                return c_codes, c_ctx, -1
            starts = []
            for vol, order, kind, anchor, n0, n1 in segs:
                s, end = KI.segments(*vol, order, kind, anchor, n0)
                if end != n1:       # (every point has a code: not the log domain)
                    raise AssertionError("interp.segments: not the encoder's walk")
                starts.append(s)
            at = np.concatenate(starts) if starts else np.zeros(0, np.int64)
            zeros, stretches = KI.quiet_stats(c_codes, c_ctx, at)
            if zeros < (RUN_GAIN + 1) * stretches or zeros - stretches < n - limit:
                return c_codes, c_ctx, -1
            codes, ctx, m, runs = KI.runs_apply(c_codes, c_ctx, at, limit)
            if m < 0 or n - m < RUN_GAIN * runs:
                return codes, ctx, -1
            sizes.judge(lambda: _interp_sample(c_codes, c_ctx, at))
            return codes, ctx, m

        sizes = _Sizes(coded, quant, KI.N_CTX_RUNS, KI.GROUPS_RUNS)
        return _with_runs(coded, quant, apply, sizes)

    def _enc(self, xc, out, rec, sg, quant, config, codes, ctx, outp, n0, no0, segs=None):
        steps, eints = quant.levels(*config["ab"])
        lo, hi = quant.range
        order = np.asarray(config["order"], np.int64)
        n, no = call(KI.encode, (8, 9), xc, None, out, rec, sg, steps, eints, quant.eb,
                     quant.mode, quant.otype, lo, hi, order, interp_kind(config),
                     int(config["anchor"]), codes, ctx, outp, n0, no0)
        if segs is not None:    # (what ``_runs`` needs to find them, if it needs them)
            segs.append((xc.shape, order, interp_kind(config), int(config["anchor"]), n0, n))
        return n, no

    def _dec(self, out, rec, sg, quant, config, t, outv, outp, st):
        steps, _ = quant.levels(*config["ab"])
        lo, hi = quant.range
        # 8- and 16-bit integers of a window of up to NARROW_VIA_INT32 values decode
        # into an int32 copy, then are narrowed (exactly: every value is clamped to the
        # output type's range): the same predictions, bit for bit, from the same
        # integers, and speckle's uint16 (2.2M values a window) decodes 1.02-1.03x as
        # fast (in the kernel, a narrow load is a load and a conversion, a 32-bit one is
        # folded into the conversion). Larger windows lose more to the copy's memory
        # traffic than that gains (4.3M values: 0.90-0.98x; 16.8M: 0.88-0.95x), and it
        # costs 4 bytes a value. Not for encoding (the input's copy costs more: 0.96x),
        # nor for the Lorenzo kernels, which predict from a ring of their own (0.93-0.97x)
        work = out
        if (rec is out and out.dtype.kind in "iu" and out.dtype.itemsize < 4
                and out.size <= NARROW_VIA_INT32):
            work = rec = np.empty(out.shape, np.int32)
        runs = 1 if config.get("r") else 0
        if runs and quant.mode == MODE_LOG:
            raise CorruptFileError("run coding in the log domain (no coder writes it)")
        call(KI.decode, (5, 6, 21), work, rec, None, sg, steps, quant.mode, quant.otype, lo,
             hi, np.asarray(config["order"], np.int64), interp_kind(config),
             int(config["anchor"]), t.cmap, t.kbs, t.lut, t.fc, t.words, t.low, outv,
             outp, st, runs)
        if work is not out:
            np.copyto(out, work, casting="unsafe")


class Lorenzo3D(_Kernel):
    name = "lorenzo"
    n_ctx = KL.N_CTX
    groups = KL.GROUPS
    three = True
    # {"pq": 1}: prequantized (format v3; see ``kernels.lorenzo``); {"pq": 1, "w": [7
    # ints]}: with a second stage (format v4); {}: predicted from reconstructed values
    # (format v2 files: decoded, no longer coded)
    PQ: ClassVar[dict] = {"pq": 1}
    fits = True

    def configs(self, x: np.ndarray, quant: Quantizer) -> list[dict]:
        return [dict(self.PQ)]

    def _runs(self, coded, segs, shape, quant):
        return _lorenzo_runs(coded, shape[2], quant)

    def contexts(self, config: dict) -> int:
        return KL.N_CTX_RUNS if config.get("r") else KL.N_CTX

    def reads(self, config: dict) -> int:
        return 2 if config.get("r") else 1     # a run's symbol and the code that ends it

    def fitted(self, config: dict, coded: Coded, shape: tuple[int, ...]) -> dict | None:
        """The plain form ``config`` with a second stage fitted to its coding ``coded`` of
        a window of ``shape`` (None: no fit)."""
        if config != self.PQ:
            return None
        w = fit_second_stage(coded.codes, shape)
        return None if w is None else {**self.PQ, "w": w}

    def validate(self, config, shape):
        # exactly {}, {"pq": 1} or {"pq": 1, "w": [7 ints, not all 0]}, either of the
        # last two with "r": 1 (run coding, format v6) (ints: not true or 1.0, which
        # Python finds equal to 1)
        if config == {}:
            return {}
        if not isinstance(config, dict):
            raise CorruptFileError("bad predictor configuration")
        runs = {"r": 1} if "r" in config else {}
        if runs and not (config["r"] == 1 and type(config["r"]) is int):
            raise CorruptFileError("bad predictor configuration")
        rest = {k: v for k, v in config.items() if k != "r"}
        if rest == self.PQ and type(rest["pq"]) is int:
            return {**rest, **runs}
        w = rest.get("w")
        if (isinstance(w, list) and len(w) == KL.N_W and set(rest) == {"pq", "w"}
                and rest["pq"] == 1 and type(rest["pq"]) is int
                and all(type(v) is int and -W_MAX <= v <= W_MAX for v in w) and any(w)):
            return {"pq": 1, "w": list(w), **runs}
        raise CorruptFileError("bad predictor configuration")

    def _enc(self, xc, out, rec, sg, quant, config, codes, ctx, outp, n0, no0, segs=None):
        steps, eints = quant.levels()
        lo, hi = quant.range
        if not config.get("pq"):
            raise OptionError(f"'{self.name}' codes only its format-v3 form {self.PQ} "
                              "(the v2 form is decoded, no longer coded)")
        return call(KL.encode_pq, (6, 7), xc, out, sg, float(steps[1]), float(eints[1]),
                    quant.eb, quant.mode, quant.otype, lo, hi, self.three, codes, ctx, outp,
                    n0, no0, _weights(config))

    def _dec(self, out, rec, sg, quant, config, t, outv, outp, st):
        steps, eints = quant.levels()
        lo, hi = quant.range
        if config.get("r") and quant.mode == MODE_LOG:
            raise CorruptFileError("run coding in the log domain (no coder writes it)")
        if config.get("pq"):
            kernel = KL.decode_pq_runs if config.get("r") else KL.decode_pq
            call(kernel, (4, 5), out, sg, float(steps[1]), float(eints[1]), quant.mode,
                 quant.otype, lo, hi, self.three, t.cmap, t.kbs, t.lut, t.fc, t.words, t.low,
                 outv, outp, st, _weights(config))
            return
        act = np.zeros(out.shape, np.uint8)
        call(KL.decode, (6, 7), out, rec, None, sg, act, float(steps[1]), quant.mode,
             quant.otype, lo, hi, self.three, t.cmap, t.kbs, t.lut, t.fc, t.words, t.low,
             outv, outp, st)


def _with_runs(coded: Coded, quant: Quantizer,
               apply: Callable[[int], tuple[np.ndarray, np.ndarray, int]],
               sizes: _Sizes) -> Coded:
    """``coded`` with its run coding (``kernels.lorenzo.runs_apply``, ``kernels.interp.
    runs_apply``; ``apply(limit)``: its codes, contexts and their number, or -1 past
    ``limit`` or where it does not pay; then the contexts of ``sizes.runs``, whose
    ``doubt`` it sets: ``Coded.recheck``) as the coding to write it with
    (``Coded.recode``), where that leaves at most ``RUN_SHARE`` of the codes to decode.
    Not in the log domain: its zeros have no code, so the segments are not whole."""
    n = coded.codes.size
    if quant.mode == MODE_LOG or n < RUN_MIN:
        return coded
    n_ctx, groups = sizes.runs

    def runs() -> tuple | None:
        sizes.doubt[0] = False
        codes, ctx, m = apply(int(RUN_SHARE * n))
        if m < 0:
            return None
        return codes[:m], ctx[:m], n_ctx, groups, {"r": 1}

    coded.recode = runs
    coded.recheck = sizes.doubt
    return coded


def _lorenzo_runs(coded: Coded, width: int, quant: Quantizer) -> Coded:
    """``_with_runs`` of a prequantized Lorenzo coding of frames ``width`` wide."""
    if not coded.config.get("pq"):
        return coded
    codes, ctx = coded.codes, coded.ctx     # (not ``coded``: see ``Interpolation._runs``)
    sizes = _Sizes(coded, quant, KL.N_CTX_RUNS, KL.GROUPS_RUNS)

    def apply(limit: int) -> tuple[np.ndarray, np.ndarray, int]:
        rc, rx, m = KL.runs_apply(codes, ctx, width, limit)
        if m >= 0:
            sizes.judge(lambda: _lorenzo_sample(codes, ctx, width))
        return rc, rx, m

    return _with_runs(coded, quant, apply, sizes)


class _Sizes:
    """What ``_runs_doubtful`` codes a window's sample with: its plain coding's contexts
    and groups, its run coding's, whether its codes mark outliers; whether to (integer
    data: ``RUN_SAMPLE``); and its verdict (``Coded.recheck``). Not the window's
    ``Coded``, which holds the closure that holds this."""

    def __init__(self, coded: Coded, quant: Quantizer, n_ctx_runs: int,
                 groups_runs: np.ndarray) -> None:
        self.plain = (coded.n_ctx, coded.groups)
        self.runs = (n_ctx_runs, groups_runs)
        self.outliers = coded.has_outliers
        self.check = quant.mode == MODE_INT
        self.doubt = [False]

    def judge(self, sample: Callable[[], tuple[np.ndarray, ...]]) -> None:
        """Sets the verdict on a run-coded window from ``sample()``: (its sample's
        codes, contexts, their run coding's codes, contexts)."""
        if self.check and RUN_SAMPLE:
            self.doubt[0] = _runs_doubtful(*sample(), self)


def _runs_doubtful(pc: np.ndarray, px: np.ndarray, rc: np.ndarray, rx: np.ndarray,
                   sizes: _Sizes) -> bool:
    """Whether the run coding (rc, rx) of a sample of a window's codes (pc, px) may code
    the window larger than its plain coding: it codes the sample larger (both coded by
    the entropy coder, their streams), or the plain coding's raw low bits are
    RUN_LOW_SHARE of it or more. The file stores a bit stream compressed where it
    compresses (``payload.store``), which a sample's stream, a few hundred bytes from
    rows far apart, does not show: the low bits of hot pixels, the same in every frame,
    compressed to a third in the plain coding and to 0.6x with runs, and dark frames
    with 1% of them hot coded 1.23x as large with runs (a break-test), while their
    sample's run coding read 0.93x; their plain coding's low bits were 0.48-0.51 of its
    sample, where the run-coded windows that are smaller with runs read 0-0.29."""
    from .. import entropy

    def size(codes: np.ndarray, ctx: np.ndarray, n_ctx: int,
             groups: np.ndarray) -> tuple[int, int]:
        s = entropy.encode(codes, ctx, n_ctx, groups, sizes.outliers)
        return len(s.words), len(s.low)

    words, low = size(pc, px, *sizes.plain)
    return (sum(size(rc, rx, *sizes.runs)) > words + low
            or low >= RUN_LOW_SHARE * (words + low))


def _lorenzo_sample(codes: np.ndarray, ctx: np.ndarray,
                    width: int) -> tuple[np.ndarray, ...]:
    """Every k-th row (``width`` codes) of a Lorenzo coding, about RUN_SAMPLE codes, and
    their run coding."""
    k = max(1, codes.size // width // max(1, RUN_SAMPLE // width))
    pc = codes.reshape(-1, width)[::k].reshape(-1)
    px = ctx.reshape(-1, width)[::k].reshape(-1)
    sc, sx, sm = KL.runs_apply(pc, px, width, 2 * pc.size)
    return pc, px, sc[:sm], sx[:sm]


def _interp_sample(codes: np.ndarray, ctx: np.ndarray,
                   at: np.ndarray) -> tuple[np.ndarray, ...]:
    """Every k-th row of points (from ``segments``: starting at ``at``, not empty: a
    window is run-coded only past its head) of an interpolation coding, about
    RUN_SAMPLE codes, and their run coding."""
    n = codes.size
    ends = np.append(at[1:], n)
    k = max(1, int(n - at[0]) // RUN_SAMPLE)
    if k == 1:
        pc, px, starts = codes[at[0]:], ctx[at[0]:], at - at[0]
    else:
        pick = np.arange(0, at.size, k)
        pc = np.concatenate([codes[at[i]:ends[i]] for i in pick])
        px = np.concatenate([ctx[at[i]:ends[i]] for i in pick])
        starts = np.concatenate(([0], np.cumsum(ends[pick] - at[pick])[:-1]))
    sc, sx, sm, _ = KI.runs_apply(pc, px, starts.astype(np.int64), 2 * pc.size + 2)
    return pc, px, sc[:sm], sx[:sm]


def _weights(config: dict) -> np.ndarray:
    w = config.get("w")
    return np.zeros(KL.N_W, np.int64) if w is None else np.asarray(w, np.int64)


FIT_POINTS = 1 << 12     # the second stage is fitted on about this many points (2^14: the
#                          same weights within 1-2 sixteenths on ks_pypde, 0.34-0.51 ms a
#                          fit instead of 0.09-0.18, 2% of encoding iris or smoke)
FIT_GAIN = 0.5           # ... and kept only if it leaves less than this share of the
#                          squared residuals (on the heads of the shared stacks: ks_pypde
#                          0.17-0.27, 18-15% fewer bits; smoke 0.73-0.75, -1.4% to +0.4%,
#                          not worth coding the head once more)


def fit_second_stage(codes: np.ndarray, shape: tuple[int, ...]) -> list[int] | None:
    """Second-stage weights (sixteenths, in [-W_MAX, W_MAX]; ``kernels.lorenzo.
    _pq_corr_row``) for a window of ``shape`` whose plain prequantized Lorenzo codes are
    ``codes`` (its residuals, FLAG for outliers; one per value, channels one after
    another): the least-squares prediction of each residual from those of its neighbours
    up, up-left, up-right, up-up, in the previous frame, its left and its up
    (``kernels.lorenzo.stage_moments``). None where there is no fit: too few points, a
    value without a code (the log domain's zeros), or weights that all round to 0."""
    t, h, w = shape[:3]
    nch = shape[3] if len(shape) == 4 else 1
    if codes.size != t * h * w * nch or t < 2 or h < 3 or w < 3:
        return None
    ata, atb, btb, n = KL.stage_moments(codes, nch, t, h, w, FIT_POINTS)
    if n < 64 or btb <= 0.0:
        return None
    # a ridge of 1e-9 of the mean square: residuals that are all 0 in a direction (a
    # constant region) leave the system singular
    ridge = 1e-9 * max(float(np.trace(ata)) / KL.N_W, 1.0)
    try:
        sol = np.linalg.solve(ata + ridge * np.eye(KL.N_W), atb)
    except np.linalg.LinAlgError:
        return None
    if not np.isfinite(sol).all():
        return None
    wts = [int(v) for v in np.clip(np.round(16.0 * sol), -W_MAX, W_MAX)]
    if not any(wts):
        return None
    # the squared residuals the rounded weights leave, against those of no second stage
    wv = np.asarray(wts, np.float64) / 16.0
    rss = btb - 2.0 * float(wv @ atb) + float(wv @ ata @ wv)
    return wts if rss < FIT_GAIN * btb else None


class Lorenzo2D(Lorenzo3D):
    name = "spatial"
    three = False

    def extends(self, shape: tuple[int, ...]) -> bool:
        # every frame is coded on its own (``kernels.lorenzo._ring``: no previous frame),
        # its codes after those of the frames before; channels one after another, so
        # only a one-channel window's coding begins with its first frames'
        return len(shape) == 3

    def extend(self, head: Coded, x: np.ndarray, quant: Quantizer, config: dict,
               sgn: np.ndarray) -> Coded:
        nh = 0 if head.out is None else head.out.shape[0]
        if (not self.extends(x.shape) or head.out is None or not 0 < nh < x.shape[0]
                or head.out.shape[1:] != x.shape[1:] or head.out.dtype != x.dtype
                or head.config != config):
            raise ValueError("extend: head is not the full coding of x's first frames")
        if quant.mode == MODE_LOG and sgn.shape != (x.shape[0] - nh, *x.shape[1:]):
            raise ValueError("extend: sgn is not the sign map of the frames after the head")
        if "w" in config:
            # the second stage reads the previous frame's residuals, which the head's
            # coding does not keep: the window is coded whole
            from ..codec import sign_map

            return self.encode(x, quant, config, sign_map(x, quant))
        codes, ctx, outp = _buffers(x.size)
        nn, no = head.codes.size, head.outliers.size
        codes[:nn] = head.codes
        ctx[:nn] = head.ctx
        outp[:no] = head.outliers
        out = np.empty_like(x)
        out[:nh] = head.out
        rest, orest = x[nh:], out[nh:]
        nn, no2 = self._enc(rest, orest, _rec(orest, quant), sgn, quant, config, codes, ctx,
                            outp, nn, no)
        p = outp[no:no2]
        orest.reshape(-1)[p] = rest.reshape(-1)[p]      # exact, bit for bit
        p += nh * (x.size // x.shape[0])                # flat positions in the window
        return _lorenzo_runs(Coded(config, codes[:nn], ctx[:nn], outp[:no2].copy(), out,
                                   self.n_ctx, self.groups), x.shape[2], quant)
