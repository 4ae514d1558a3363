"""Multilevel interpolation over a 3-D volume (T, H, W), predict-quantize-reconstruct in
one pass (the family SZ3 uses, with the anchor grid and level-wise bounds of QoZ).

Anchors, points at multiples of ``anchor`` on every axis, are stored exactly. Then, from
stride ``anchor/2`` down to 1, each level visits the axes in ``order``: along axis d at
stride s it predicts the points at odd multiples of s along d (multiples of s on the
axes visited before d, of 2s on those after) from reconstructed neighbours at -3s, -s,
+s, +3s: cubic, quadratic near the ends, linear, or where there is no right neighbour
(an edge) the left one, or (``EDGE_T``, ``EDGE_S``) the line through the left neighbours
at -s and -3s, where both exist. Level l (stride 2^(l-1)) quantizes with its own step
(``steps[l]``): coarse levels may use a tighter bound, so that the many points of the
fine levels are predicted from more accurate neighbours. Every reconstruction is checked
against the user's bound (``eb``).

Contexts: group (level 1, level 2, coarser, edge, anchor) x bucket of the local variation
(|left - right|, or |left - left3| at an edge) over the step.

``base`` (optional): a forecast of every value; the interpolation then runs on x - base
(the forecast error) and reconstructions are base + interpolated error. ``rec`` is the
prediction domain: ``out`` itself for plain float/integer coding, a float64 array for the
log domain (MODE_LOG) or the forecast error.

Run coding (``runs_apply``, ``decode``'s ``runs``, format v7): a stretch of points in
bucket 0 is coded as runs, each the number of codes of 0 before the next code that is not
0, and the decoder writes those without entropy decoding (a window's writer chooses it
where each run saves the decoder enough symbols; the tuning ranks the plain codings).

Positions are visited row by row with the fastest axis innermost; along a row the
interpolation kind is fixed (axes 0, 1) or changes only at the ends (axis 2), so each
run of points is a tight loop with fixed tap offsets and weights.
"""

from __future__ import annotations

import numpy as np
from numba import literally

from .core import (
    ALPHABET,
    ESC,
    FLAG,
    MODE_LOG,
    NB,
    OUT,
    OUT_F64,
    PREC,
    RUN_CHUNK,
    M,
    bits_at,
    bits_f64,
    bucket16,
    ctx_entries,
    dense_low,
    escape_high,
    exact_value,
    f64_bits,
    finite,
    inline,
    jit,
    log_of_exact,
    padded,
    quantize,
    rans_next,
    reconstruct,
    run_start,
    scalar,
    to_out,
    unzigzag,
)

G_L1, G_L2, G_COARSE, G_EDGE, G_ANCHOR = 0, 1, 2, 3, 4
N_CTX = 5 * NB
GROUPS = np.array([NB, 2 * NB, 3 * NB, 4 * NB], np.int64)
# run coding (format v7, ``runs_apply``): its segments are the rows of points of a
# pass (``segments``), cut into the decoder's chunks of RUN_CHUNK; its quiet
# points those in bucket 0 (the variation of their neighbours under a sixteenth of the
# step), but the anchors; three contexts after those, each a group of its own: a run
# that starts inside a chunk, one that starts a chunk, the point that ends a run
RUN_MID, RUN_ROW, RUN_END = N_CTX, N_CTX + 1, N_CTX + 2
N_CTX_RUNS = N_CTX + 3
GROUPS_RUNS = np.array([NB, 2 * NB, 3 * NB, 4 * NB, RUN_MID, RUN_ROW, RUN_END], np.int64)
QUIET = np.zeros(256, np.uint8)
QUIET[[G_L1 * NB, G_L2 * NB, G_COARSE * NB, G_EDGE * NB]] = 1


@scalar
def _levels(T, H, W, anchor):
    top = 1
    while top < max(T, H, W):
        top *= 2
    a = anchor if anchor > 0 else 2 * top
    s = min(a, top) // 2
    lvl = 1
    while (1 << lvl) <= s:
        lvl += 1
    return a, s, lvl


@scalar
def _plan(o0, o1, o2, oi, s):
    """Starts and steps of the loops over axes 0, 1, 2 for the pass along axis o[oi]."""
    st0 = st1 = st2 = 0
    sp0 = sp1 = sp2 = 0
    for oj in range(3):
        ax = o0 if oj == 0 else (o1 if oj == 1 else o2)
        if oj < oi:
            st, sp = 0, s
        elif oj == oi:
            st, sp = s, 2 * s
        else:
            st, sp = 0, 2 * s
        if ax == 0:
            st0, sp0 = st, sp
        elif ax == 1:
            st1, sp1 = st, sp
        else:
            st2, sp2 = st, sp
    return st0, sp0, st1, sp1, st2, sp2


CUBIC = 1           # ``kind`` flags of the kernels: cubic interpolation; linear
EDGE_T = 2          # extrapolation at the edges of axis 0 (time), of axes 1 and 2
EDGE_S = 4          # (space; both format v5)


@scalar
def _kind(c, n, s, sd, cubic, ledge):
    """Taps (offsets o0..o3, weights w0..w3), variation tap ov, edge flag and linear
    flag for a point at coordinate c along an axis of size n, stride s (flat stride sd);
    ``ledge``: linear extrapolation at an edge of this axis.
    Linear: the taps are -sd, +sd, +sd, +sd and the weights 0, 1/2, 1/2, 0 (the runs
    decode and encode through a loop of their own that reads the two neighbours once)."""
    if c + s < n:
        l3 = c >= 3 * s
        r3 = c + 3 * s < n
        if cubic and l3 and r3:
            return -3 * sd, sd, 3 * sd, sd, -0.0625, 0.5625, 0.5625, -0.0625, False, False
        if cubic and r3:
            return -sd, sd, 3 * sd, sd, 0.0, 0.375, 0.75, -0.125, False, False
        if cubic and l3:
            return -3 * sd, sd, sd, sd, -0.125, 0.75, 0.375, 0.0, False, False
        return -sd, sd, sd, sd, 0.0, 0.5, 0.5, 0.0, False, True
    if c >= 3 * s:
        if ledge:       # 1.5 left - 0.5 left3: the line through them
            return -3 * sd, -sd, -sd, -3 * sd, -0.5, 1.5, 0.0, 0.0, True, False
        return -sd, -sd, -sd, -3 * sd, 0.0, 1.0, 0.0, 0.0, True, False
    return -sd, -sd, -sd, -sd, 0.0, 1.0, 0.0, 0.0, True, False


@scalar
def _run(c, d, row, W, nd, s, sd, st2, sp2, cnt_x, kind, grp):
    """The run of points that starts at coordinate c (along axis d, row ``row``) of a
    pass: (start, count, flat step, taps, variation tap, stride, context group base),
    weights, and whether it is linear (see ``_kind``)."""
    cubic = (kind & CUBIC) != 0
    ledge = (kind & (EDGE_T if d == 0 else EDGE_S)) != 0
    q0, q2, q3, qv, w0, w1, w2, w3, edge, lin = _kind(c, W if d == 2 else nd, s, sd, cubic,
                                                      ledge)
    cnt = _run_length(c, W, s, cubic) if d == 2 else cnt_x
    geo = ((row + c, cnt, 2 * s) if d == 2 else (row + st2, cnt, sp2)) + (
        q0, q2, q3, qv, sd, (G_EDGE if edge else grp) * NB)
    return geo, (w0, w1, w2, w3), lin


@inline
def _predict(rf, i, o0, o2, o3, ov, sd, w0, w1, w2, w3, lin, finite_rf, narrow):
    """Prediction and local variation of point i. ``lin`` (a constant at each call site,
    so that each loop compiles with one branch only): the linear taps, whose weighted
    sum is the general one term for term (the 0-weighted taps read the same two values),
    so the same float operations in the same order: the same prediction, bit for bit,
    from two loads instead of five. ``finite_rf`` (a constant: no forecast base): every
    value in ``rf`` is finite, and then the sum is 0.5 a + 0.5 r, bit for bit: 0 a and
    0 r are zeros of the signs of a and r, and adding them changes neither a non-zero
    sum nor the sign of a zero one (-0 only when a, r <= 0, and then 0 r = -0). Finite:
    a reconstruction passed the bound check, an outlier is stored as its exact finite
    value or a finite placeholder (a float32 placeholder may round to infinity: that
    and a NaN prediction give the same outlier codes and values, as the prediction of
    a point next to it is then no bound's match either way), log-domain values are
    logarithms; with a base, rf holds x - base and may not be finite. ``narrow`` (a
    constant): rf's values are those of a float32 or an integer, or logarithms, and then
    that sum is (a + r) x 0.5, bit for bit, one multiplication fewer: a + r cannot
    overflow nor 0.5 a and 0.5 r lose a bit (only float64 values come near either), so
    both are the exact half of a + r rounded once."""
    a = np.float64(rf[np.uint64(i - sd)])
    if lin:
        r = np.float64(rf[np.uint64(i + sd)])
        if finite_rf and narrow:
            return (a + r) * 0.5, abs(a - r)
        if finite_rf:
            return 0.5 * a + 0.5 * r, abs(a - r)
        return ((0.0 * a + 0.5 * a) + 0.5 * r) + 0.0 * r, abs(a - r)
    p = (w0 * np.float64(rf[np.uint64(i + o0)]) + w1 * a
         + w2 * np.float64(rf[np.uint64(i + o2)]) + w3 * np.float64(rf[np.uint64(i + o3)]))
    return p, abs(a - np.float64(rf[np.uint64(i + ov)]))


# ``_inv16``: the buckets of var / step are ``bucket16`` of var x (16 x inv), which is
# 16 x (var x inv) bit for bit (a power of two times the one rounding, one multiplication
# fewer): 16 inv stays finite (steps are at least 2^-1006, ``quantize._MIN_FLOAT_EB``
# and the level factors), and past the float range or below the normal one both give the
# same bucket (the top one, or 0).


@scalar
def _run_length(c, n, s, cubic):
    """Points from c on (step 2s) that share c's kind: the cubic interior is one run, and
    so is the linear one (every point with a right neighbour; it was a run of one point
    each, its kind worked out again for every point)."""
    if cubic:
        if c >= 3 * s and c + 3 * s < n:
            return (n - 3 * s - 1 - c) // (2 * s) + 1
        return 1
    if c + s < n:
        return (n - s - 1 - c) // (2 * s) + 1
    return 1


@jit
def encode(x, base, out, rec, sgn, steps, eints, eb, mode, otype, lo, hi, order, kind,
           anchor, codes, ctx, outp, n0, no0):
    """Code the volume ``x``: codes (FLAG for outliers) and contexts from position n0,
    outlier positions (flat indices into x, in coding order) from no0. Returns (n, no).
    Non-finite outliers leave a finite placeholder in ``out``: the caller puts the exact
    values in afterwards."""
    mode = literally(mode)
    otype = literally(otype)
    T, H, W = x.shape
    xf = x.ravel()
    of = out.ravel()
    rf = rec.ravel()
    sf = sgn.ravel()
    has_base = base is not None
    bf = base.ravel() if base is not None else rf
    if mode != MODE_LOG and base is None and rf.ctypes.data != of.ctypes.data:
        raise ValueError("interp.encode: rec must be out itself here")  # (its runs)
    n = n0
    no = no0
    HW = H * W
    a, s, lvl = _levels(T, H, W, anchor)
    for t in range(0, T, a):
        for y in range(0, H, a):
            for xx in range(0, W, a):
                i = t * HW + y * W + xx
                ui = np.uint64(i)
                if mode == MODE_LOG and (sf[ui] == 2 or sf[ui] == -2):
                    of[ui] = 0.0 if sf[ui] > 0 else -0.0
                    rf[ui] = 0.0
                    continue
                xo = np.float64(xf[ui])
                codes[np.uint64(n)] = FLAG
                ctx[np.uint64(n)] = G_ANCHOR * NB
                n += 1
                outp[np.uint64(no)] = i
                no += 1
                b = bf[ui] if has_base else 0.0
                if abs(xo) < np.inf:
                    of[ui] = xo
                    rf[ui] = log_of_exact(xo, 0.0) if mode == MODE_LOG else xo - b
                elif mode == MODE_LOG:
                    of[ui] = 0.0
                    rf[ui] = 0.0
                else:
                    of[ui] = to_out(finite(b), otype, lo, hi)
                    rf[ui] = of[ui] - b
    # a run's predictions and contexts (a run lies along a row: at most W points)
    pb = np.empty(W, np.float64)
    cb = np.empty(W, np.uint8)
    narrow = mode == MODE_LOG or otype != OUT_F64
    o0, o1, o2 = order[0], order[1], order[2]
    while s >= 1:
        step = steps[lvl]
        inv = 1.0 / step
        e_int = eints[lvl]
        inv16 = inv * 16.0      # see ``_inv16``
        grp = G_L1 if lvl == 1 else (G_L2 if lvl == 2 else G_COARSE)
        for oi in range(3):
            d = o0 if oi == 0 else (o1 if oi == 1 else o2)
            nd = T if d == 0 else (H if d == 1 else W)
            if nd <= s:
                continue
            st0, sp0, st1, sp1, st2, sp2 = _plan(o0, o1, o2, oi, s)
            sd = (HW if d == 0 else (W if d == 1 else 1)) * s
            cnt_x = (W - st2 + sp2 - 1) // sp2
            for t in range(st0, T, sp0):
                for y in range(st1, H, sp1):
                    row = t * HW + y * W
                    c = s if d == 2 else (t if d == 0 else y)
                    while True:
                        # a run: its points' predictions and contexts first (as ``decode``),
                        # then their codes. The runs are code of this loop, not calls of
                        # an inlined helper: each array a helper unpacks costs two atomic
                        # reference-count updates per call, 20 per run when they were
                        # (``kernel_ab.py``: the tuning's 33 x 33 tiles 1.02-1.06x, whole
                        # windows 0.99-1.03x; the same change to ``decode``, 0.98-0.99x
                        # on iris and smoke, was left out)
                        geo, wts, lin = _run(c, d, row, W, nd, s, sd, st2, sp2, cnt_x,
                                             kind, grp)
                        i0, cnt, istep, o0_, o2_, o3_, ov, sdr, gb = geo
                        w0, w1, w2, w3 = wts
                        if lin:         # (``_predict``: one loop for each way)
                            for j in range(cnt):
                                p, var = _predict(rf, i0 + j * istep, o0_, o2_, o3_, ov, sdr,
                                                  w0, w1, w2, w3, True, not has_base, narrow)
                                pb[j] = p
                                cb[j] = gb + bucket16(var * inv16)
                        else:
                            for j in range(cnt):
                                p, var = _predict(rf, i0 + j * istep, o0_, o2_, o3_, ov, sdr,
                                                  w0, w1, w2, w3, False, not has_base, narrow)
                                pb[j] = p
                                cb[j] = gb + bucket16(var * inv16)
                        for j in range(cnt):
                            i = i0 + j * istep
                            ui = np.uint64(i)
                            p = pb[j]
                            sg = 1.0
                            if mode == MODE_LOG:
                                sv = sf[ui]
                                if sv == 2 or sv == -2:
                                    of[ui] = 0.0 if sv > 0 else -0.0
                                    rf[ui] = p
                                    continue
                                sg = 1.0 if sv > 0 else -1.0
                            b = bf[ui] if has_base else 0.0
                            pt = p + b if has_base else p      # (not p + 0.0: as ``decode``)
                            ctx[np.uint64(n)] = cb[j]
                            xo = np.float64(xf[ui])
                            k, o, r, ok = quantize(mode, otype, xo, pt, step, inv, e_int, eb,
                                                   lo, hi, sg)
                            if ok:
                                codes[np.uint64(n)] = k
                                if mode == MODE_LOG or has_base:
                                    of[ui] = o
                                    rf[ui] = r if mode == MODE_LOG else o - b
                                else:
                                    rf[ui] = o      # rf is out: one store, not two
                            else:
                                codes[np.uint64(n)] = FLAG
                                outp[np.uint64(no)] = i
                                no += 1
                                o, r = exact_value(mode, otype, xo, p, pt, b, lo, hi)
                                of[ui] = o
                                rf[ui] = r
                            n += 1
                        c += geo[1] * 2 * s
                        if d != 2 or c >= W:
                            break
        s //= 2
        lvl -= 1
    return n, no


@inline
def _dec_run(mode, otype, arrs, has_base, geo, wts, lin, qp, state):
    of, rf, bf, sf, ce, lut, fc, words, lw, outv, outp, dense, pe = arrs
    i0, cnt, istep, o0, o2, o3, ov, sd, gb = geo
    w0, w1, w2, w3 = wts
    step, inv, lo_, hi_, inv16 = qp
    x0, x1, wp, bpos, op = state
    nov = outv.size
    # the run's predictions and context entries first, in a loop of their own: no point
    # of a run is a neighbour of another (they read the coarser grid only), and the
    # loop that decodes holds fewer values (``benchmarks/results/kernel_ab.md``); the
    # two interleaved in one int64 buffer (the prediction as its bits): a pointer fewer
    for j in range(cnt):
        p, var = _predict(rf, i0 + j * istep, o0, o2, o3, ov, sd, w0, w1, w2, w3, lin,
                          not has_base, mode == MODE_LOG or otype != OUT_F64)
        pe[np.uint64(2 * j)] = f64_bits(p)
        pe[np.uint64(2 * j + 1)] = np.int64(ce[np.uint64(gb + bucket16(var * inv16))])
    wp, bpos = run_start(wp, bpos, words.size, lw.size, cnt)
    j = -1
    while j < cnt - 1:      # (not a range: see ``lorenzo._pq_dec_vol``)
        j += 1
        i = i0 + j * istep
        ui = np.uint64(i)
        p = bits_f64(pe[np.uint64(2 * j)])
        sg = 1.0
        if mode == MODE_LOG:
            sv = sf[ui]
            if sv == 2 or sv == -2:
                of[ui] = 0.0 if sv > 0 else -0.0
                rf[ui] = p
                continue
            sg = 1.0 if sv > 0 else -1.0
        b = bf[ui] if has_base else 0.0
        pt = p + b if has_base else p      # not p + 0.0: an addition on the path to the next value
        e = pe[np.uint64(2 * j + 1)]
        cb = e & -256       # the class x ALPHABET
        slot = x0 & (M - 1)
        sym = np.int64(lut[np.uint64((cb << (PREC - 8)) + slot)])
        x0, x1, wp = rans_next(x0, x1, slot, fc[np.uint64(cb + sym)],
                               np.int64(words[np.uint64(wp)]), wp)
        hv = np.uint64(sym)
        if sym >= ESC:      # rare: an outlier (OUT) or an escaped high part
            if sym == OUT:
                v = outv[np.uint64(op)] if op < nov else 0.0
                if op < nov:
                    outp[np.uint64(op)] = i
                op += 1
                o, r = exact_value(mode, otype, v, p, pt, b, lo_, hi_)
                of[ui] = o
                rf[ui] = r
                continue
            hv, bpos = escape_high(lw, bpos)
        kb = e & 255
        z = hv << np.uint64(kb)
        if dense or kb:     # see core.dense_low
            w = bpos >> 6
            lo, bpos = bits_at(lw[np.uint64(w)], lw[np.uint64(w + 1)], bpos, kb)
            z |= lo
        o, r = reconstruct(mode, otype, unzigzag(np.int64(z)), pt, step, lo_, hi_, sg)
        if mode == MODE_LOG or has_base:
            of[ui] = o
            rf[ui] = r if mode == MODE_LOG else o - b
        else:
            rf[ui] = o      # rf is out (one pointer fewer held in the loop)
    return x0, x1, wp, bpos, op


@jit
def segments(T, H, W, order, kind, anchor, n0):
    """Where each row of points of a pass (each run of ``_run``: the decoder's unit)
    starts in the codes of a (T, H, W) volume coded from code n0 on by ``encode`` with
    every point coded (not the log domain), after its anchors; and where its codes end.
    The walk of ``encode`` and ``decode`` without their work: a row at a time (kept out
    of ``encode``, whose loops it slowed by 2-3% on the tuning's tiles)."""
    a, s, lvl = _levels(T, H, W, anchor)
    n = n0 + ((T - 1) // a + 1) * ((H - 1) // a + 1) * ((W - 1) // a + 1)
    top = 0
    out = np.empty(16, np.int64)
    o0, o1, o2 = order[0], order[1], order[2]
    while s >= 1:
        grp = G_L1 if lvl == 1 else (G_L2 if lvl == 2 else G_COARSE)
        for oi in range(3):
            d = o0 if oi == 0 else (o1 if oi == 1 else o2)
            nd = T if d == 0 else (H if d == 1 else W)
            if nd <= s:
                continue
            st0, sp0, st1, sp1, st2, sp2 = _plan(o0, o1, o2, oi, s)
            sd = (H * W if d == 0 else (W if d == 1 else 1)) * s
            cnt_x = (W - st2 + sp2 - 1) // sp2
            for t in range(st0, T, sp0):
                for y in range(st1, H, sp1):
                    c = s if d == 2 else (t if d == 0 else y)
                    while True:
                        geo, _, _ = _run(c, d, 0, W, nd, s, sd, st2, sp2, cnt_x, kind, grp)
                        if top == out.size:
                            grown = np.empty(2 * out.size, np.int64)
                            grown[:top] = out
                            out = grown
                        out[top] = n
                        top += 1
                        n += geo[1]
                        c += geo[1] * 2 * s
                        if d != 2 or c >= W:
                            break
        s //= 2
        lvl -= 1
    return out[:top], n


@inline
def _quiet(c):
    """Whether context ``c`` is quiet (``QUIET``), as arithmetic that vectorizes."""
    return np.int64((c == G_L1 * NB) | (c == G_L2 * NB) | (c == G_COARSE * NB)
                    | (c == G_EDGE * NB))


@jit
def quiet_zeros(codes, ctx, blocks, size):
    """The share of codes that are 0 in a quiet context, over ``blocks`` blocks of
    ``size`` codes spread over the codes (all of them where they are fewer): a
    fraction of a ``quiet_stats`` pass, which a window whose runs cannot pay is then
    spared (blocks, not every k-th code: one code a cache line cost 13 ns each)."""
    n = codes.size
    if n <= blocks * size:
        blocks, size = 1, n
    z = 0
    for b in range(blocks):
        s0 = (n - size) * b // max(blocks - 1, 1)
        for i in range(s0, s0 + size):
            z += _quiet(ctx[np.uint64(i)]) & np.int64(codes[np.uint64(i)] == 0)
    return z / max(blocks * size, 1)


@jit
def quiet_stats(codes, ctx, starts):
    """(Z, S): how many quiet points (``QUIET``) have a code of 0, and how many stretches
    of quiet points ``runs_apply`` would find (``starts`` as there). Its runs would save
    the decoder Z - R symbols with R runs, R >= S (R - S: the runs that follow a code
    that ends one inside a stretch): a bound that spares most windows whose runs do not
    pay its pass. One pass over the codes taken as one row, which compiles to vector
    code, then the stretches that the rows' and chunks' starts cut in two."""
    n = codes.size
    ns = starts.size
    h = min(max(np.int64(starts[0]), 0), n) if ns else n
    z = 0
    s = 0
    if h < n:
        s = _quiet(ctx[h])
        z = s & np.int64(codes[h] == 0)
    for i in range(h + 1, n):      # (unsigned indices: no wrap-around test, vector code)
        q = _quiet(ctx[np.uint64(i)])
        z += q & np.int64(codes[np.uint64(i)] == 0)
        s += q & (_quiet(ctx[np.uint64(i - 1)]) ^ 1)
    for k in range(ns):
        s0 = min(max(np.int64(starts[k]), h), n)
        s1 = min(max(np.int64(starts[k + 1]) if k + 1 < ns else n, s0), n)
        for c0 in range(s0, s1, RUN_CHUNK):
            if c0 > h:
                s += _quiet(ctx[c0]) & _quiet(ctx[c0 - 1])
    return z, s


@jit
def runs_apply(codes, ctx, starts, limit):
    """Run coding (format v7) of an interpolation coding (``codes``, ``ctx``; the starts
    of its rows of points, ``segments``, as ``starts``; the codes before
    ``starts[0]`` are kept as they are). Each row is cut into the decoder's chunks of
    RUN_CHUNK points. In a chunk, a stretch of quiet points (``QUIET``: bucket 0, but
    the anchors), L long, is coded as runs: from its first point on, the number r of
    codes of 0 before the next code that is not 0 in it, as one symbol (as the code
    whose zigzag is r + 1, or 0 where the stretch's codes are 0 to its end; in
    ``RUN_ROW`` at the chunk's start, else ``RUN_MID``), then that code (in
    ``RUN_END``), then the next run, to the stretch's end. Every other point keeps its
    code and context. Returns (codes, contexts, their number m, the number of runs),
    or m = -1 where more than ``limit`` symbols would be made or ``starts`` is out of
    order.

    Whether a point starts a stretch depends on the contexts only, which the decoder
    knows before it decodes a chunk's codes: its loop carries no state from one code
    to the next (a run that started after a code of 0, as the Lorenzo predictors'
    do, cost every point of speckle at 1e-3 a tenth more time than without runs)."""
    n = codes.size
    ns = starts.size
    if limit < 0:
        return np.empty(0, np.int32), np.empty(0, np.uint8), -1, 0
    cap = min(limit, 2 * n) + 2     # a point makes at most two symbols
    oc = np.empty(cap, np.int32)
    ox = np.empty(cap, np.uint8)
    m = 0
    nr = 0
    head = np.int64(starts[0]) if ns else n
    if head < 0 or head > n or head > limit:
        return oc, ox, -1, nr
    for i in range(head):
        oc[m] = codes[i]
        ox[m] = ctx[i]
        m += 1
    for k in range(ns):
        s0 = np.int64(starts[k])
        s1 = np.int64(starts[k + 1]) if k + 1 < ns else n
        if s1 < s0 or s1 > n:
            return oc, ox, -1, nr
        for c0 in range(s0, s1, RUN_CHUNK):
            e = min(c0 + RUN_CHUNK, s1)
            i = c0
            while i < e:
                if m > limit:       # (a point makes at most two: the buffer holds them)
                    return oc, ox, -1, nr
                if QUIET[ctx[i]]:
                    q = i + 1
                    while q < e and QUIET[ctx[q]]:
                        q += 1
                    while i < q:    # the stretch's runs
                        j = i
                        while j < q and codes[j] == 0:
                            j += 1
                        z = 0 if j == q else j - i + 1
                        oc[m] = (z >> 1) ^ -(z & 1)
                        ox[m] = RUN_ROW if i == c0 else RUN_MID
                        m += 1
                        nr += 1
                        if j < q:
                            oc[m] = codes[j]
                            ox[m] = RUN_END
                            m += 1
                            j += 1
                        i = j
                        if m > limit:
                            return oc, ox, -1, nr
                else:
                    oc[m] = codes[i]
                    ox[m] = ctx[i]
                    m += 1
                    i += 1
    return oc, ox, (m if m <= limit else -1), nr


@inline
def _dec_run_z(mode, otype, arrs, has_base, geo, wts, lin, qp, state, ren):
    """``_dec_run`` of a run-coded window (``runs_apply``): a copy of its own, so that
    windows without runs decode through a loop without their tests. Each stretch of
    quiet points (marked in their entries' bit 16) is decoded in a loop of its own: a
    run's symbol, its points of code 0, the code that ends it, the next run. Every
    other point is decoded as in ``_dec_run``. A chunk reads at most two symbols a
    point (the streams are padded for them)."""
    of, rf, bf, sf, ce, lut, fc, words, lw, outv, outp, dense, pe = arrs
    i0, cnt, istep, o0, o2, o3, ov, sd, gb = geo
    w0, w1, w2, w3 = wts
    step, inv, lo_, hi_, inv16 = qp
    x0, x1, wp, bpos, op = state
    nov = outv.size
    for j in range(cnt):
        p, var = _predict(rf, i0 + j * istep, o0, o2, o3, ov, sd, w0, w1, w2, w3, lin,
                          not has_base, mode == MODE_LOG or otype != OUT_F64)
        bk = bucket16(var * inv16)
        pe[np.uint64(2 * j)] = f64_bits(p)
        pe[np.uint64(2 * j + 1)] = np.int64(ce[np.uint64(gb + bk)]) | (np.int64(bk == 0) << 16)
    wp, bpos = run_start(wp, bpos, words.size, lw.size, 2 * cnt)
    j = -1
    while j < cnt - 1:      # (not a range: see ``lorenzo._pq_dec_vol``)
        j += 1
        e = pe[np.uint64(2 * j + 1)]
        if (e >> 16) != 0:
            # a stretch of quiet points: its end, then its runs
            je = j + 1
            while je < cnt and (pe[np.uint64(2 * je + 1)] >> 16) != 0:
                je += 1
            er = ren[1] if j == 0 else ren[0]
            while True:
                cb = er & 0xFF00
                slot = x0 & (M - 1)
                sym = np.int64(lut[np.uint64((cb << (PREC - 8)) + slot)])
                x0, x1, wp = rans_next(x0, x1, slot, fc[np.uint64(cb + sym)],
                                       np.int64(words[np.uint64(wp)]), wp)
                hv = np.uint64(sym) if sym < OUT else np.uint64(0)  # (no coder writes OUT)
                if sym == ESC:
                    hv, bpos = escape_high(lw, bpos)
                kb = er & 255
                z = hv << np.uint64(kb)
                if kb:
                    w = bpos >> 6
                    lo, bpos = bits_at(lw[np.uint64(w)], lw[np.uint64(w + 1)], bpos, kb)
                    z |= lo
                # the run's codes of 0: z - 1 of them, then a code that is not 0; z = 0
                # (or past the stretch, as a damaged stream may say): to its end
                jz = j + np.int64(z) - 1 if z != np.uint64(0) and z <= np.uint64(je - j) else je
                while j < jz:
                    ui = np.uint64(i0 + j * istep)
                    p = bits_f64(pe[np.uint64(2 * j)])
                    b = bf[ui] if has_base else 0.0
                    o, _ = reconstruct(mode, otype, np.int64(0), p + b if has_base else p,
                                       step, lo_, hi_, 1.0)
                    if has_base:
                        of[ui] = o
                        rf[ui] = o - b
                    else:
                        rf[ui] = o
                    j += 1
                if j == je:
                    break
                # the code that ends the run
                i = i0 + j * istep
                ui = np.uint64(i)
                p = bits_f64(pe[np.uint64(2 * j)])
                b = bf[ui] if has_base else 0.0
                pt = p + b if has_base else p
                cb = ren[2] & 0xFF00
                slot = x0 & (M - 1)
                sym = np.int64(lut[np.uint64((cb << (PREC - 8)) + slot)])
                x0, x1, wp = rans_next(x0, x1, slot, fc[np.uint64(cb + sym)],
                                       np.int64(words[np.uint64(wp)]), wp)
                if sym == OUT:
                    v = outv[np.uint64(op)] if op < nov else 0.0
                    if op < nov:
                        outp[np.uint64(op)] = i
                    op += 1
                    o, r = exact_value(mode, otype, v, p, pt, b, lo_, hi_)
                    of[ui] = o
                    rf[ui] = r
                else:
                    hv = np.uint64(sym)
                    if sym == ESC:
                        hv, bpos = escape_high(lw, bpos)
                    kb = ren[2] & 255
                    z = hv << np.uint64(kb)
                    if kb:
                        w = bpos >> 6
                        lo, bpos = bits_at(lw[np.uint64(w)], lw[np.uint64(w + 1)], bpos, kb)
                        z |= lo
                    o, r = reconstruct(mode, otype, unzigzag(np.int64(z)), pt, step, lo_,
                                       hi_, 1.0)
                    if has_base:
                        of[ui] = o
                        rf[ui] = o - b
                    else:
                        rf[ui] = o
                j += 1
                if j == je:
                    break
                er = ren[0]
            j -= 1
            continue
        i = i0 + j * istep
        ui = np.uint64(i)
        p = bits_f64(pe[np.uint64(2 * j)])
        b = bf[ui] if has_base else 0.0
        pt = p + b if has_base else p
        cb = e & 0xFF00     # the class x ALPHABET
        slot = x0 & (M - 1)
        sym = np.int64(lut[np.uint64((cb << (PREC - 8)) + slot)])
        x0, x1, wp = rans_next(x0, x1, slot, fc[np.uint64(cb + sym)],
                               np.int64(words[np.uint64(wp)]), wp)
        hv = np.uint64(sym)
        if sym >= ESC:      # rare: an outlier (OUT) or an escaped high part
            if sym == OUT:
                v = outv[np.uint64(op)] if op < nov else 0.0
                if op < nov:
                    outp[np.uint64(op)] = i
                op += 1
                o, r = exact_value(mode, otype, v, p, pt, b, lo_, hi_)
                of[ui] = o
                rf[ui] = r
                continue
            hv, bpos = escape_high(lw, bpos)
        kb = e & 255
        z = hv << np.uint64(kb)
        if dense or kb:     # see core.dense_low
            w = bpos >> 6
            lo, bpos = bits_at(lw[np.uint64(w)], lw[np.uint64(w + 1)], bpos, kb)
            z |= lo
        o, r = reconstruct(mode, otype, unzigzag(np.int64(z)), pt, step, lo_, hi_, 1.0)
        if has_base:
            of[ui] = o
            rf[ui] = o - b
        else:
            rf[ui] = o
    return x0, x1, wp, bpos, op


@jit
def decode(out, rec, base, sgn, steps, mode, otype, lo, hi, order, kind, anchor, cmap,
           kbs, lut, fc, words, lw, outv, outp, st, runs):
    """Inverse of ``encode`` with the entropy decoding fused in. ``st`` carries the
    decoder state across calls (channels): x0, x1, word pos, bit accumulator, bits in it,
    byte pos, escape pos, outlier pos. ``lut``/``fc``: flat tables (class x slot ->
    symbol; class x symbol -> freq << FC_SHIFT | cumulative freq, ``core.FC_SHIFT``).
    ``runs`` (1: a run-coded window, format v7; a literal: each way compiles on its own,
    and only where it is used)."""
    mode = literally(mode)
    otype = literally(otype)
    runs = literally(runs)
    T, H, W = out.shape
    of = out.ravel()
    rf = rec.ravel()
    sf = sgn.ravel()
    has_base = base is not None
    bf = base.ravel() if base is not None else rf
    x0 = st[0]
    x1 = st[1]
    wp = st[2]
    bpos = st[3]
    op = st[7]
    nov = outv.size
    nw1 = words.size - 1
    HW = H * W
    a, s, lvl = _levels(T, H, W, anchor)
    for t in range(0, T, a):
        for y in range(0, H, a):
            for xx in range(0, W, a):
                i = t * HW + y * W + xx
                ui = np.uint64(i)
                if mode == MODE_LOG and (sf[ui] == 2 or sf[ui] == -2):
                    of[ui] = 0.0 if sf[ui] > 0 else -0.0
                    rf[ui] = 0.0
                    continue
                c = np.int64(cmap[G_ANCHOR * NB])
                slot = x0 & (M - 1)
                sym = np.int64(lut[np.uint64(c * M + slot)])
                x0, x1, wp = rans_next(x0, x1, slot, fc[np.uint64(c * ALPHABET + sym)],
                                       np.int64(words[np.uint64(wp if wp < nw1 else nw1)]), wp)
                v = outv[np.uint64(op)] if op < nov else 0.0
                if op < nov:
                    outp[np.uint64(op)] = i
                op += 1
                b = bf[ui] if has_base else 0.0
                if sym == OUT and abs(v) < np.inf:
                    of[ui] = v
                    rf[ui] = log_of_exact(v, 0.0) if mode == MODE_LOG else v - b
                elif mode == MODE_LOG:
                    of[ui] = 0.0
                    rf[ui] = 0.0
                else:
                    of[ui] = to_out(finite(b), otype, lo, hi)
                    rf[ui] = of[ui] - b
    if not padded(words, lw, st, (2 if runs else 1) * min(W, RUN_CHUNK)):
        raise ValueError("interp.decode: streams not padded for its runs")
    if mode != MODE_LOG and base is None and rf.ctypes.data != of.ctypes.data:
        raise ValueError("interp.decode: rec must be out itself here")  # (``_dec_run``)
    if runs and (mode == MODE_LOG or cmap.size != N_CTX_RUNS):
        raise ValueError("interp.decode: run coding in the log domain or a model of "
                         "another coding")
    pe = np.empty(2 * RUN_CHUNK, np.int64)  # a run's predictions and context entries
    ce = ctx_entries(cmap, kbs)
    ren = np.zeros(3, np.int64)     # the run coding's context entries
    if runs:
        for j in range(3):
            ren[j] = ce[RUN_MID + j]
    arrs = (of, rf, bf, sf, ce, lut, fc, words, lw, outv, outp, dense_low(kbs), pe)
    o0, o1, o2 = order[0], order[1], order[2]
    while s >= 1:
        step = steps[lvl]
        inv = 1.0 / step
        qp = (step, inv, lo, hi, inv * 16.0)
        grp = G_L1 if lvl == 1 else (G_L2 if lvl == 2 else G_COARSE)
        for oi in range(3):
            d = o0 if oi == 0 else (o1 if oi == 1 else o2)
            nd = T if d == 0 else (H if d == 1 else W)
            if nd <= s:
                continue
            st0, sp0, st1, sp1, st2, sp2 = _plan(o0, o1, o2, oi, s)
            sd = (HW if d == 0 else (W if d == 1 else 1)) * s
            cnt_x = (W - st2 + sp2 - 1) // sp2
            for t in range(st0, T, sp0):
                for y in range(st1, H, sp1):
                    row = t * HW + y * W
                    c = s if d == 2 else (t if d == 0 else y)
                    while True:
                        geo, wts, lin = _run(c, d, row, W, nd, s, sd, st2, sp2, cnt_x,
                                             kind, grp)
                        i0, left = geo[0], geo[1]
                        while left > 0:     # in chunks of at most RUN_CHUNK points
                            m = min(left, RUN_CHUNK)
                            g = (i0, m) + geo[2:]
                            if runs:
                                if lin:
                                    x0, x1, wp, bpos, op = _dec_run_z(
                                        mode, otype, arrs, has_base, g, wts, True, qp,
                                        (x0, x1, wp, bpos, op), ren)
                                else:
                                    x0, x1, wp, bpos, op = _dec_run_z(
                                        mode, otype, arrs, has_base, g, wts, False, qp,
                                        (x0, x1, wp, bpos, op), ren)
                            elif lin:
                                x0, x1, wp, bpos, op = _dec_run(
                                    mode, otype, arrs, has_base, g, wts, True, qp,
                                    (x0, x1, wp, bpos, op))
                            else:
                                x0, x1, wp, bpos, op = _dec_run(
                                    mode, otype, arrs, has_base, g, wts, False, qp,
                                    (x0, x1, wp, bpos, op))
                            i0 += m * geo[2]
                            left -= m
                        c += geo[1] * 2 * s
                        if d != 2 or c >= W:
                            break
        s //= 2
        lvl -= 1
    st[0] = x0
    st[1] = x1
    st[2] = wp
    st[3] = bpos
    st[7] = op
