"""Bit-exact coding of floats: each value's IEEE bit pattern mapped to an integer that
follows the float order (``quantize._ordered_bits``), predicted from neighbours with
integer arithmetic modulo 2^64 (so every pattern, NaN payloads and -0.0 included, comes
back exactly) and the residual coded.

Predictors (``kind``): 0 the previous frame (2-D Lorenzo on the first), 1 2-D Lorenzo,
2 3-D Lorenzo. Contexts: group (first frame / others) x mean bit length of the
neighbours' residuals.
"""

from __future__ import annotations

import numpy as np

from .core import (
    ALPHABET,
    ESC,
    NB,
    M,
    bit_length,
    bits_at,
    escape_high,
    inline,
    jit,
    rans_next,
)

N_CTX = 2 * NB
GROUPS = np.array([NB], np.int64)


@inline
def _pred(qf, i, qa, t, y, xx, HW, W, kind):
    """Prediction (uint64, modulo 2^64) of point i from earlier points; ``qa``: the
    value to its left (carried in a register by the caller). Without branches: a
    neighbour that is not there is read at point i itself and multiplied by 0, and the
    kinds are selected by masks (an inlined helper with branches around array reads pays
    reference-count calls per value; see ``core.pick``)."""
    left = np.uint64(xx > 0)
    up = np.uint64(y > 0)
    ul = left & up
    pv = np.uint64(t > 0 and kind != 1)
    b = qf[np.uint64(i - up * W)] * up
    c = qf[np.uint64(i - ul * (W + 1))] * ul
    p2 = qa * left + b - c
    j = np.uint64(i) - pv * np.uint64(HW)
    d = qf[j] * pv
    e = qf[j - pv * left] * (pv & left)
    f = qf[j - pv * up * np.uint64(W)] * (pv & up)
    g = qf[j - pv * ul * np.uint64(W + 1)] * (pv & ul)
    p3 = p2 + d - e - f + g
    m0 = np.uint64(0) - np.uint64(kind == 0 and t > 0)
    m3 = np.uint64(0) - np.uint64(kind == 2 and t > 0)
    m2 = ~(m0 | m3)
    return (d & m0) | (p3 & m3) | (p2 & m2)


@inline
def _ctx(act, i, t, y, xx, HW, W):
    """Context: group (first frame or not) x rounded mean bit length of the left and
    upper neighbours' residuals (branch-free, as ``_pred``)."""
    left = np.int64(xx > 0)
    up = np.int64(y > 0)
    s = (left * np.int64(act[np.uint64(i - left)])
         + up * np.int64(act[np.uint64(i - up * W)]))
    h = (left + up) >> 1                 # the mean of 0, 1 or 2 values, rounded
    b = (s + h) >> h
    return np.int64(t == 0) * NB + min(b, NB - 1)


@jit
def encode(q, kind, act, codes, ctx):
    """q: ordered-bit integers (uint64, any shape (T, H, W)); writes int64 residual codes
    and contexts in raster order."""
    T, H, W = q.shape
    qf = q.ravel()
    af = act.ravel()
    HW = H * W
    n = 0
    for t in range(T):
        for y in range(H):
            qa = np.uint64(0)
            for xx in range(W):
                i = t * HW + y * W + xx
                qi = qf[np.uint64(i)]
                r = qi - _pred(qf, i, qa, t, y, xx, HW, W, kind)
                qa = qi
                ctx[np.uint64(n)] = _ctx(af, i, t, y, xx, HW, W)
                k = np.int64(r)
                codes[np.uint64(n)] = k
                z = np.uint64((k << 1) ^ (k >> 63))
                bl = bit_length(z)
                af[np.uint64(i)] = bl
                n += 1
    return n


@jit
def decode(q, kind, act, cmap, kbs, lut, fc, words, lw, st):
    """Inverse of ``encode`` (decoder state in ``st`` as in ``interp.decode``)."""
    T, H, W = q.shape
    qf = q.ravel()
    af = act.ravel()
    HW = H * W
    x0 = st[0]
    x1 = st[1]
    wp = st[2]
    bpos = st[3]
    nw1 = words.size - 1
    nlw = lw.size - 2
    for t in range(T):
        for y in range(H):
            qa = np.uint64(0)
            for xx in range(W):
                i = t * HW + y * W + xx
                c = np.int64(cmap[_ctx(af, i, t, y, xx, HW, W)])
                slot = x0 & (M - 1)
                sym = np.int64(lut[np.uint64(c * M + slot)])
                x0, x1, wp = rans_next(x0, x1, slot, fc[np.uint64(c * ALPHABET + sym)],
                                       np.int64(words[np.uint64(wp if wp < nw1 else nw1)]), wp)
                hv = np.uint64(sym)
                if sym >= ESC:
                    hv, bpos = escape_high(lw, bpos)
                kb = kbs[np.uint64(c)]
                z = hv << np.uint64(kb)
                if kb:
                    w = bpos >> 6
                    w = w if w < nlw else nlw
                    lo, bpos = bits_at(lw[np.uint64(w)], lw[np.uint64(w + 1)], bpos, kb)
                    z |= lo
                r = (z >> np.uint64(1)) ^ (np.uint64(0) - (z & np.uint64(1)))
                qa = _pred(qf, i, qa, t, y, xx, HW, W, kind) + r
                qf[np.uint64(i)] = qa
                af[np.uint64(i)] = bit_length(z)
    st[0] = x0
    st[1] = x1
    st[2] = wp
    st[3] = bpos
