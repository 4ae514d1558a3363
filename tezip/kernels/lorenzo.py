"""Lorenzo prediction over a 3-D volume (T, H, W), predict-quantize-reconstruct value by
value in raster order (as SZ does): 3-D, p = a + b - c + d - e - f + g from the seven
reconstructed neighbours before the point in (t, y, x), or 2-D within each frame,
p = a + b - c; neighbours outside the volume count as 0.

Contexts: group (3-D, or the first frame / 2-D) x bucket of the code magnitudes of the
neighbours in the row above (and in the previous frame, for 3-D): residuals cluster, so a
point next to large codes expects a large one. (Not the value to the left: the decoder
would have to finish it before decoding the next symbol.) ``act`` holds min(|code|, 255) of
every coded point (255 for an outlier).

Rows are coded with fixed neighbour availability (above? previous frame?), so the inner
loop has no boundary tests: the first value of a row goes through the general path.

``base`` (optional): a forecast; the predictor then runs on the forecast error, as in
``interp``.
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
    M,
    bits_at,
    bucket16,
    dense_low,
    escape_high,
    exact_value,
    inline,
    jit,
    pick,
    quantize,
    rans_next,
    reconstruct,
    unzigzag,
)

G_3D, G_2D = 0, 1
N_CTX = 2 * NB
GROUPS = np.array([NB], np.int64)


@inline
def _pred(rf, af, i, ra, first, last, up, prev, W, HW):
    """Prediction and neighbour activity of point i (``first``/``last``: it starts/ends
    its row; ``up``: the row above exists; ``prev``: the previous frame takes part). The
    activity comes from the row above and the previous frame only, so that the decoder's
    entropy decoding does not wait for the value just before. A neighbour that is not
    there counts 0: its read goes to point i itself (in bounds) and ``pick`` drops it,
    without branches (see ``core.pick``). ``ra``: the value to the left, as stored in
    ``rf``, carried in a register by the caller (a load right after its store would put
    the store-to-load latency on the path from one value to the next). What is stored
    there is exact in ``rf``'s type (``to_out`` rounded it; ``rf`` is float64 in the log
    domain and with a base), so the carried value is the stored one."""
    left = not first
    ul = up and left
    pl = prev and left
    pu = prev and up
    pul = pu and left
    # offsets and weights by selects on the flags, not flags multiplied as integers
    # (decoding 3-9% faster)
    z = np.int64(0)
    oW = W if up else z
    oW1 = (W + 1) if ul else z
    a = pick(left, ra, 0.0)
    b = pick(up, np.float64(rf[np.uint64(i - oW)]), 0.0)
    c = pick(ul, np.float64(rf[np.uint64(i - oW1)]), 0.0)
    ab = np.int64(af[np.uint64(i - oW)])
    ac = np.int64(af[np.uint64(i - oW1)])
    s = (ab + ab if up else z) + (ac if ul else z)
    ur = up and not last
    oWm = (W - 1) if ur else z
    ar = np.int64(af[np.uint64(i - oWm)])
    s += ar if ur else z
    q = b - c
    j = i - (HW if prev else z)
    d = pick(prev, np.float64(rf[np.uint64(j)]), 0.0)
    ad = np.int64(af[np.uint64(j)])
    s += ad + ad if prev else z
    e = pick(pl, np.float64(rf[np.uint64(j - (1 if pl else z))]), 0.0)
    f = pick(pu, np.float64(rf[np.uint64(j - (W if pu else z))]), 0.0)
    g = pick(pul, np.float64(rf[np.uint64(j - ((W + 1) if pul else z))]), 0.0)
    q2 = q + ((d - e) - (f - g))
    q = pick(prev, q2, q)
    # the value to the left enters last: one addition on the path from one value to the
    # next (the rest does not depend on it)
    p = a + q
    return p, s


@inline
def _enc_row(mode, otype, arrs, has_base, row, W, HW, up, prev, gb, qp, n, no):
    xf, bf, of, rf, sf, af, codes, ctx, outp = arrs
    step, inv, e_int, eb, lo, hi = qp
    ra = 0.0
    for xx in range(W):
        i = row + xx
        ui = np.uint64(i)
        p, s = _pred(rf, af, i, ra, xx == 0, xx == W - 1, up, prev, W, HW)
        sg = 1.0
        if mode == MODE_LOG:
            sv = sf[ui]
            if sv == 2 or sv == -2:
                of[ui] = 0.0 if sv > 0 else -0.0
                rf[ui] = p
                ra = p
                af[ui] = 0
                continue
            sg = 1.0 if sv > 0 else -1.0
        b = bf[ui] if has_base else 0.0
        pt = p + b if has_base else p      # not p + 0.0: an addition on the path to the next value
        ctx[np.uint64(n)] = gb + bucket16(2.0 * s)
        xo = np.float64(xf[ui])
        k, o, r, ok = quantize(mode, otype, xo, pt, step, inv, e_int, eb, lo, hi, sg)
        if ok:
            codes[np.uint64(n)] = k
            of[ui] = o
            ra = r if mode == MODE_LOG else o - b
            rf[ui] = ra
            ak = abs(k)
            af[ui] = ak if ak < 255 else 255
        else:
            codes[np.uint64(n)] = FLAG
            outp[np.uint64(no)] = i
            no += 1
            af[ui] = 255
            o, r = exact_value(mode, otype, xo, p, pt, b, lo, hi)
            of[ui] = o
            rf[ui] = r
            ra = np.float64(rf[ui])
        n += 1
    return n, no


@jit
def encode(x, base, out, rec, sgn, act, step, e_int, eb, mode, otype, lo, hi, three,
           codes, ctx, outp, n0, no0):
    """Code the volume ``x``; same conventions as ``interp.encode``. Returns (n, no)."""
    mode = literally(mode)
    otype = literally(otype)
    T, H, W = x.shape
    xf = x.ravel()
    of = out.ravel()
    rf = rec.ravel()
    sf = sgn.ravel()
    af = act.ravel()
    has_base = base is not None
    bf = base.ravel() if base is not None else rf
    arrs = (xf, bf, of, rf, sf, af, codes, ctx, outp)
    qp = (step, 1.0 / step, e_int, eb, lo, hi)
    n = n0
    no = no0
    HW = H * W
    for t in range(T):
        prev = three and t > 0
        gb = (G_3D if prev else G_2D) * NB
        for y in range(H):
            n, no = _enc_row(mode, otype, arrs, has_base, t * HW + y * W, W, HW, y > 0, prev,
                             gb, qp, n, no)
    return n, no


@inline
def _dec_row(mode, otype, arrs, has_base, row, W, HW, up, prev, gb, qp, state):
    of, rf, bf, sf, af, cmap, kbs, lut, fc, words, lw, outv, outp, dense = arrs
    step, lo, hi = qp
    x0, x1, wp, bpos, op = state
    nov = outv.size
    nw1 = words.size - 1
    nlw = lw.size - 2
    ra = 0.0
    for xx in range(W):
        i = row + xx
        ui = np.uint64(i)
        p, s = _pred(rf, af, i, ra, xx == 0, xx == W - 1, up, prev, W, HW)
        sg = 1.0
        if mode == MODE_LOG:
            sv = sf[ui]
            if sv == 2 or sv == -2:
                of[ui] = 0.0 if sv > 0 else -0.0
                rf[ui] = p
                ra = p
                af[ui] = 0
                continue
            sg = 1.0 if sv > 0 else -1.0
        b = bf[ui] if has_base else 0.0
        pt = p + b if has_base else p      # not p + 0.0: an addition on the path to the next value
        c = np.int64(cmap[np.uint64(gb + bucket16(2.0 * s))])
        slot = x0 & (M - 1)
        sym = np.int64(lut[np.uint64(c * M + slot)])
        x0, x1, wp = rans_next(x0, x1, slot, fc[np.uint64(c * ALPHABET + sym)],
                               np.int64(words[np.uint64(wp if wp < nw1 else nw1)]), wp)
        hv = np.uint64(sym)
        if sym >= ESC:      # rare: an outlier (OUT) or an escaped high part
            if sym == OUT:
                v = outv[np.uint64(op)] if op < nov else 0.0
                if op < nov:
                    outp[np.uint64(op)] = i
                op += 1
                af[ui] = 255
                o, r = exact_value(mode, otype, v, p, pt, b, lo, hi)
                of[ui] = o
                rf[ui] = r
                ra = np.float64(rf[ui])
                continue
            hv, bpos = escape_high(lw, bpos)
        kb = kbs[np.uint64(c)]
        z = hv << np.uint64(kb)
        if dense or kb:     # see core.dense_low
            w = bpos >> 6
            w = w if w < nlw else nlw
            low, bpos = bits_at(lw[np.uint64(w)], lw[np.uint64(w + 1)], bpos, kb)
            z |= low
        k = unzigzag(np.int64(z))
        ak = abs(k)
        af[ui] = ak if ak < 255 else 255
        o, r = reconstruct(mode, otype, k, pt, step, lo, hi, sg)
        of[ui] = o
        # rf is of itself unless in the log domain or with a base; stored again then,
        # so that the value carried to the right is read right after its store
        ra = r if mode == MODE_LOG else o - b
        rf[ui] = ra
    return x0, x1, wp, bpos, op


@jit
def decode(out, rec, base, sgn, act, step, mode, otype, lo, hi, three, cmap, kbs, lut, fc,
           words, lw, outv, outp, st):
    """Inverse of ``encode`` with the entropy decoding fused in (state in ``st`` as in
    ``interp.decode``)."""
    mode = literally(mode)
    otype = literally(otype)
    T, H, W = out.shape
    of = out.ravel()
    rf = rec.ravel()
    sf = sgn.ravel()
    af = act.ravel()
    has_base = base is not None
    bf = base.ravel() if base is not None else rf
    arrs = (of, rf, bf, sf, af, cmap, kbs, lut, fc, words, lw, outv, outp,
            dense_low(kbs))
    qp = (step, lo, hi)
    x0 = st[0]
    x1 = st[1]
    wp = st[2]
    bpos = st[3]
    op = st[7]
    HW = H * W
    for t in range(T):
        prev = three and t > 0
        gb = (G_3D if prev else G_2D) * NB
        for y in range(H):
            x0, x1, wp, bpos, op = _dec_row(mode, otype, arrs, has_base, t * HW + y * W, W,
                                            HW, y > 0, prev, gb, qp, (x0, x1, wp, bpos, op))
    st[0] = x0
    st[1] = x1
    st[2] = wp
    st[3] = bpos
    st[7] = op
