"""Transform coding of a volume (T, H, W) (format v8, ``predictors.transform``): a
separable 3-D CDF 9/7 wavelet transform (lifting, whole-sample symmetric extension, so
any length), its coefficients quantized on a uniform grid of step ``d`` (a few times the
bound), the volume reconstructed from them by the inverse transform, and each value then
corrected on the bound's grid around that reconstruction (``core.quantize``: the bound
is checked exactly, a value that cannot meet it is stored exactly).

The transform is separable and full along each axis (as SPERR does where the axes take
different numbers of levels): every level along time, then every level along the
frame's rows, then along its columns; an axis of n points takes a level while the part
left is at least ``MIN_LEN`` points long, at most ``MAX_LEVELS``. Along an axis, a
coefficient's band is 0 in the approximation left after the last level, else the level
counted from it (1: the coarsest detail; the finest: the number of levels).

Codes, in the order the decoder reads them: every coefficient's code in raster order
over (t, y, x) of the transformed volume, each in the context of its band class (the
sum of its three bands, capped) and of the magnitudes of its neighbours before it (left,
above, previous frame) where they lie in the same band; then every value's correction
in raster order, in the context of its left and upper neighbours' corrections (FLAG for
a value stored exactly).

Arithmetic: the decoder's reconstruction is the encoder's (plain IEEE operations in a
fixed order, as everywhere in these kernels); the forward transform is the encoder's
alone.
"""

from __future__ import annotations

import numpy as np
from numba import literally

from .core import (
    ALPHABET,
    ESC,
    FLAG,
    KMAX,
    NB,
    OUT,
    M,
    bits_at,
    bucket16,
    escape_high,
    inline,
    jit,
    quantize,
    rans_next,
    reconstruct,
    unzigzag,
)

# CDF 9/7 lifting steps (predict, update, predict, update) and the scaling of the two
# halves after them (low-pass by sqrt(2)/K, high-pass by K/sqrt(2): every band's synthesis
# functions of norm 0.94-1.04, so that one step suits them all)
P1 = -1.586134342059924
U1 = -0.052980118572961
P2 = 0.882911075530934
U2 = 0.443506852043971
KS = 1.230174104914001
S_LOW = 1.4142135623730951 / KS
S_HIGH = KS / 1.4142135623730951
I_LOW = KS / 1.4142135623730951
I_HIGH = 1.4142135623730951 / KS
MIN_LEN = 9          # an axis part takes a level while it is at least this long
MAX_LEVELS = 6
N_CLS = 10           # band classes: the sum of a coefficient's three bands, capped
N_COEF_CTX = N_CLS * NB
N_CORR = 8           # contexts of the corrections: min(|left| + |above|, 7)
N_CTX = N_COEF_CTX + N_CORR
GROUPS = np.array([c * NB for c in range(1, N_CLS + 1)], np.int64)
CMAX = float(KMAX)   # coefficient codes are clamped to [-KMAX, KMAX]


def levels(n: int) -> int:
    """The levels an axis of ``n`` points takes."""
    k = 0
    while n >= MIN_LEN and k < MAX_LEVELS:
        k += 1
        n -= n // 2
    return k


def bands(n: int) -> np.ndarray:
    """Per index along an axis of ``n`` points, its band (uint8)."""
    lv = levels(n)
    lens = [n]
    for _ in range(lv):
        lens.append(lens[-1] - lens[-1] // 2)
    out = np.zeros(n, np.uint8)
    for lvl in range(lv):       # the detail of level lvl (0: finest) spans lens[lvl+1]..lens[lvl]
        out[lens[lvl + 1]:lens[lvl]] = lv - lvl
    return out


# --- the transform -----------------------------------------------------------------------

@inline
def _predict(v, n, nb, c):
    for i in range(1, n, 2):
        j = i + 1 if i + 1 < n else i - 1
        for b in range(nb):
            v[i, b] += c * (v[i - 1, b] + v[j, b])


@inline
def _update(v, n, nb, c):
    for i in range(0, n, 2):
        h = i - 1 if i > 0 else 1
        j = i + 1 if i + 1 < n else i - 1
        for b in range(nb):
            v[i, b] += c * (v[h, b] + v[j, b])


@inline
def _unpredict(v, n, nb, c):
    for i in range(1, n, 2):
        j = i + 1 if i + 1 < n else i - 1
        for b in range(nb):
            v[i, b] -= c * (v[i - 1, b] + v[j, b])


@inline
def _unupdate(v, n, nb, c):
    for i in range(0, n, 2):
        h = i - 1 if i > 0 else 1
        j = i + 1 if i + 1 < n else i - 1
        for b in range(nb):
            v[i, b] -= c * (v[h, b] + v[j, b])


@jit
def _lift(v, lens, nlev, forward, tmp):
    """All ``nlev`` levels along the first axis of ``v`` (N, B) (``lens``: the part each
    level transforms), in place; ``tmp``: a buffer of N x B."""
    nb = v.shape[1]
    for kk in range(nlev):
        k = kk if forward else nlev - 1 - kk
        n = lens[k]
        h = lens[k + 1]
        if forward:
            _predict(v, n, nb, P1)
            _update(v, n, nb, U1)
            _predict(v, n, nb, P2)
            _update(v, n, nb, U2)
            for i in range(n):
                j = i // 2 if i % 2 == 0 else h + i // 2
                f = S_LOW if i % 2 == 0 else S_HIGH
                for b in range(nb):
                    tmp[j, b] = v[i, b] * f
            for i in range(n):
                for b in range(nb):
                    v[i, b] = tmp[i, b]
        else:
            for i in range(n):
                j = i // 2 if i % 2 == 0 else h + i // 2
                f = I_LOW if i % 2 == 0 else I_HIGH
                for b in range(nb):
                    tmp[i, b] = v[j, b] * f
            for i in range(n):
                for b in range(nb):
                    v[i, b] = tmp[i, b]
            _unupdate(v, n, nb, U2)
            _unpredict(v, n, nb, P2)
            _unupdate(v, n, nb, U1)
            _unpredict(v, n, nb, P1)


@jit
def _lens(n0, nlev):
    lens = np.empty(nlev + 1, np.int64)
    lens[0] = n0
    for k in range(nlev):
        lens[k + 1] = lens[k] - lens[k] // 2
    return lens


@jit
def _axis(v, nlev, forward):
    """All ``nlev`` levels along the middle axis of ``v`` (A, N, B), in place."""
    na, n0, nb = v.shape
    if nlev == 0:
        return
    lens = _lens(n0, nlev)
    tmp = np.empty((n0, nb), np.float64)
    for a in range(na):
        _lift(v[a], lens, nlev, forward, tmp)


@jit
def forward(c):
    """The forward transform of ``c`` (float64, (T, H, W), C-contiguous), in place."""
    T, H, W = c.shape
    _time(c.reshape(T, H * W), levels_jit(T), True, _time_block(c))
    _axis(c, levels_jit(H), True)
    _rows(c.reshape(T * H, W), levels_jit(W), True)


TIME_BLOCK = 256            # columns transformed at once along time (``_time``) ...
TIME_BLOCK_BYTES = 28 << 20  # ... in volumes larger than this: a volume past the last-level
#                             cache is otherwise streamed from memory by every lifting step
#                             (65 x 256 x 256: the time axis 24 -> 10 ms; 33 x 1024 x 1024:
#                             230 -> 90 ms); a smaller one runs faster whole (33 x 256 x
#                             256: 3.5-3.8 ms whole, 3.7-4.8 in blocks)


@inline
def _time_block(c):
    return TIME_BLOCK if c.size * 8 > TIME_BLOCK_BYTES else 0


@jit
def _time(v, nlev, forward, block):
    """All ``nlev`` levels along the first axis of ``v`` (T, B): at once where ``block``
    is 0, else ``block`` columns at a time through a contiguous buffer. Each column's
    arithmetic is the same either way (the same bits)."""
    n0, nb = v.shape
    if nlev == 0:
        return
    if block == 0:
        _axis(v.reshape(1, n0, nb), nlev, forward)
        return
    lens = _lens(n0, nlev)
    buf = np.empty((n0, block), np.float64)
    tmp = np.empty((n0, block), np.float64)
    for b0 in range(0, nb, block):
        bb = min(block, nb - b0)
        b = buf if bb == block else np.empty((n0, bb), np.float64)     # (contiguous)
        t = tmp if bb == block else np.empty((n0, bb), np.float64)
        for i in range(n0):
            for j in range(bb):
                b[i, j] = v[i, b0 + j]
        _lift(b, lens, nlev, forward, t)
        for i in range(n0):
            for j in range(bb):
                v[i, b0 + j] = b[i, j]


ROWS = 32   # rows transformed at once along the frame's last axis (``_rows``)


@jit
def _rows(v, nlev, forward):
    """``_axis`` along the last axis of ``v`` (R, W): blocks of ROWS rows transposed into
    a buffer, so that the lifting's inner loop runs across rows (6.4 ms for the columns
    of 33 x 128 x 128 row by row; 0.6 ms along the other axes)."""
    R, W = v.shape
    if nlev == 0:
        return
    lens = _lens(W, nlev)
    buf = np.empty((W, ROWS), np.float64)
    tbuf = np.empty((W, ROWS), np.float64)
    for r0 in range(0, R, ROWS):
        nr = min(ROWS, R - r0)
        b = buf if nr == ROWS else np.empty((W, nr), np.float64)     # (contiguous)
        tmp = tbuf if nr == ROWS else np.empty((W, nr), np.float64)
        for j in range(nr):
            for i in range(W):
                b[i, j] = v[r0 + j, i]
        _lift(b, lens, nlev, forward, tmp)
        for j in range(nr):
            for i in range(W):
                v[r0 + j, i] = b[i, j]


@jit
def inverse(c):
    """The inverse of ``forward``, in place (the decoder's and the encoder's alike)."""
    T, H, W = c.shape
    _rows(c.reshape(T * H, W), levels_jit(W), False)
    _axis(c, levels_jit(H), False)
    _time(c.reshape(T, H * W), levels_jit(T), False, _time_block(c))


@inline
def levels_jit(n):
    k = 0
    while n >= MIN_LEN and k < MAX_LEVELS:
        k += 1
        n -= n // 2
    return k


# --- contexts ------------------------------------------------------------------------------
# (scalar helpers, the encoder's and the decoder's alike: the loops load the values)

@inline
def _coef_ctx(bands, bk_s):
    """A coefficient's context: its band class (``bands``: the sum of its three bands)
    and ``bk_s``, the bucket of its same-band neighbours' magnitudes."""
    return (bands if bands < N_CLS - 1 else N_CLS - 1) * NB + bk_s


@inline
def _corr_ctx(s):
    """A correction's context from its left and upper neighbours' magnitudes ``s``."""
    return N_COEF_CTX + (s if s < N_CORR - 1 else N_CORR - 1)


@jit
def context_tables(bt, by, bx):
    """Per axis, whether each index's predecessor lies in its band (uint8), and the
    neighbour-sum buckets (``bucket16(2 s)``, s = 0..765)."""
    st = np.zeros(bt.size, np.uint8)
    sy = np.zeros(by.size, np.uint8)
    sx = np.zeros(bx.size, np.uint8)
    for i in range(1, bt.size):
        st[i] = bt[i - 1] == bt[i]
    for i in range(1, by.size):
        sy[i] = by[i - 1] == by[i]
    for i in range(1, bx.size):
        sx[i] = bx[i - 1] == bx[i]
    bk = np.empty(3 * 255 + 1, np.int64)
    for s in range(bk.size):
        bk[s] = bucket16(2.0 * s)
    return st, sy, sx, bk


# --- encoding ------------------------------------------------------------------------------

@jit
def code_coefficients(c, d, bt, by, bx, codes, ctx, n0):
    """Quantize the transformed volume ``c`` on the grid of step ``d`` (in place: the
    dequantized coefficients), writing codes and contexts from ``n0``; returns the
    position after them."""
    T, H, W = c.shape
    HW = H * W
    cf = c.ravel()
    aq = np.zeros(T * HW, np.uint8)
    st, sy, sx, bk = context_tables(bt, by, bx)
    inv = 1.0 / d
    n = n0
    for t in range(T):
        pt = st[t] != 0
        for y in range(H):
            pu = sy[y] != 0
            syb = np.int64(bt[t]) + np.int64(by[y])
            row = (t * H + y) * W
            for x in range(W):
                i = row + x
                ui = np.uint64(i)
                s = 0
                if sx[x]:
                    s += np.int64(aq[ui - np.uint64(1)])
                if pu:
                    s += np.int64(aq[ui - np.uint64(W)])
                if pt:
                    s += np.int64(aq[ui - np.uint64(HW)])
                k = np.floor(cf[ui] * inv + 0.5)
                if not abs(k) <= CMAX:      # past the codes' range, or NaN (d tiny)
                    k = CMAX if k > 0.0 else (-CMAX if k < 0.0 else 0.0)
                ki = np.int64(k)
                codes[np.uint64(n)] = ki
                ctx[np.uint64(n)] = _coef_ctx(syb + np.int64(bx[x]), bk[np.uint64(s)])
                a = abs(ki)
                aq[ui] = a if a < 255 else 255
                cf[ui] = k * d
                n += 1
    return n


@jit
def code_corrections(xv, r, out, mode, otype, step, inv, e_int, eb, lo, hi, codes, ctx,
                     outp, n0, no0):
    """Each value of ``xv`` against the reconstruction ``r`` (float64): its code on the
    bound's grid (FLAG where it is stored exactly: its position goes to ``outp``), its
    reconstruction into ``out``. Returns (codes, outliers) after them."""
    mode = literally(mode)
    otype = literally(otype)
    T, H, W = xv.shape
    xf = xv.ravel()
    rf = r.ravel()
    of = out.ravel()
    am = np.zeros(T * H * W, np.uint8)
    n = n0
    no = no0
    for ty in range(T * H):
        row = ty * W
        up = (ty % H) != 0
        for x in range(W):
            i = row + x
            ui = np.uint64(i)
            s = 0
            if x > 0:
                s += np.int64(am[ui - np.uint64(1)])
            if up:
                s += np.int64(am[ui - np.uint64(W)])
            ctx[np.uint64(n)] = _corr_ctx(s)
            xo = np.float64(xf[ui])
            k, o, _, ok = quantize(mode, otype, xo, rf[ui], step, inv, e_int, eb, lo, hi, 1.0)
            if ok:
                codes[np.uint64(n)] = k
                a = abs(k)
                am[ui] = a if a < 255 else 255
                of[ui] = o
            else:
                codes[np.uint64(n)] = FLAG
                outp[np.uint64(no)] = i
                no += 1
                am[ui] = 255
                of[ui] = xo if abs(xo) < np.inf else 0.0
            n += 1
    return n, no


# --- decoding ------------------------------------------------------------------------------

@jit
def decode(out, d, bt, by, bx, mode, otype, step, lo, hi, cmap, kbs, lut, fc, words, lw,
           outv, outp, st):
    """Decode a volume (``out``: (T, H, W), the output type) coded by
    ``code_coefficients`` and ``code_corrections``; outliers' positions to ``outp``,
    their values (from ``outv``) left for the caller to put in; stream state in ``st``
    (as the other decoders keep it). Every stream position is bounded at each read."""
    mode = literally(mode)
    otype = literally(otype)
    T, H, W = out.shape
    HW = H * W
    nw1 = words.size - 1
    nlw = lw.size - 2
    nov = outv.size
    x0 = st[0]
    x1 = st[1]
    wp = st[2]
    bpos = st[3]
    op = st[7]
    c = np.empty((T, H, W), np.float64)
    cf = c.ravel()
    of = out.ravel()
    aq = np.zeros(T * HW, np.uint8)
    sa, sy, sx, bk = context_tables(bt, by, bx)
    # each context's class, looked up at once from (band class, neighbours' sum): the
    # bucket and the class map were two loads more on the chain from one symbol to the
    # next (6.6 -> 5.5 ns a coefficient, 5.5 -> 4.7 a correction on iris)
    ccs = np.empty(N_CLS * 766, np.uint8)
    for b in range(N_CLS):
        for q in range(766):
            ccs[b * 766 + q] = cmap[np.uint64(_coef_ctx(b, bk[q]))]
    ccr = np.empty(511, np.uint8)
    for q in range(511):
        ccr[q] = cmap[np.uint64(_corr_ctx(q))]
    for t in range(T):
        pt = sa[t] != 0
        for y in range(H):
            pu = sy[y] != 0
            syb = np.int64(bt[t]) + np.int64(by[y])
            row = (t * H + y) * W
            # the left neighbour's magnitude is kept in a register: read back from
            # ``aq``, its store sat on the chain from one symbol to the next context
            # (7.8 -> 6.9 ns a coefficient on iris)
            left = np.int64(0)
            for x in range(W):
                ui = np.uint64(row + x)
                s = left if sx[x] else np.int64(0)
                if pu:
                    s += np.int64(aq[ui - np.uint64(W)])
                if pt:
                    s += np.int64(aq[ui - np.uint64(HW)])
                bb = syb + np.int64(bx[x])
                bb = bb if bb < N_CLS - 1 else N_CLS - 1
                cc = np.int64(ccs[np.uint64(bb * 766 + s)])
                slot = x0 & (M - 1)
                sym = np.int64(lut[np.uint64(cc * M + slot)])
                x0, x1, wp = rans_next(x0, x1, slot, fc[np.uint64(cc * ALPHABET + sym)],
                                       np.int64(words[np.uint64(wp if wp < nw1 else nw1)]),
                                       wp)
                k = np.int64(0)
                # (an outlier's symbol is never written here: a damaged stream's reads
                # 0, and the checks after decoding fail)
                if sym != OUT:
                    hv = np.uint64(sym)
                    if sym == ESC:
                        hv, bpos = escape_high(lw, bpos)
                    kb = kbs[np.uint64(cc)]
                    z = hv << np.uint64(kb)
                    if kb:
                        w = bpos >> 6
                        w = w if w < nlw else nlw
                        low, bpos = bits_at(lw[np.uint64(w)], lw[np.uint64(w + 1)], bpos, kb)
                        z |= low
                    k = unzigzag(np.int64(z))
                a = abs(k)
                left = a if a < 255 else 255
                aq[ui] = left
                cf[ui] = np.float64(k) * d
    inverse(c)
    am = aq
    for ty in range(T * H):
        row = ty * W
        up = (ty % H) != 0
        left = np.int64(0)          # (a register, as above: 7.2 -> 5.7 ns a correction)
        for x in range(W):
            i = row + x
            ui = np.uint64(i)
            s = left
            if up:
                s += np.int64(am[ui - np.uint64(W)])
            cc = np.int64(ccr[np.uint64(s)])
            slot = x0 & (M - 1)
            sym = np.int64(lut[np.uint64(cc * M + slot)])
            x0, x1, wp = rans_next(x0, x1, slot, fc[np.uint64(cc * ALPHABET + sym)],
                                   np.int64(words[np.uint64(wp if wp < nw1 else nw1)]), wp)
            if sym == OUT:
                v = outv[np.uint64(op)] if op < nov else 0.0
                if op < nov:
                    outp[np.uint64(op)] = i
                op += 1
                am[ui] = 255
                left = 255
                of[ui] = v if abs(v) < np.inf else 0.0
                continue
            hv = np.uint64(sym)
            if sym == ESC:
                hv, bpos = escape_high(lw, bpos)
            kb = kbs[np.uint64(cc)]
            z = hv << np.uint64(kb)
            if kb:
                w = bpos >> 6
                w = w if w < nlw else nlw
                low, bpos = bits_at(lw[np.uint64(w)], lw[np.uint64(w + 1)], bpos, kb)
                z |= low
            k = unzigzag(np.int64(z))
            o, _ = reconstruct(mode, otype, k, cf[ui], step, lo, hi, 1.0)
            a = abs(k)
            left = a if a < 255 else 255
            am[ui] = left
            of[ui] = o
    st[0] = x0
    st[1] = x1
    st[2] = wp
    st[3] = bpos
    st[7] = op
