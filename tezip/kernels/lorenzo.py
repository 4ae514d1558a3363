"""Lorenzo prediction over a 3-D volume (T, H, W), value by value in raster order (as SZ
does): 3-D, p = a + b - c + d - e - f + g from the seven neighbours before the point in
(t, y, x), or 2-D within each frame, p = a + b - c; neighbours outside the volume count
as 0.

Prequantized (``encode_pq``/``decode_pq``, format v3, what new files use): every value
is first put on the bound's grid on its own (``grid``: round(x / step), 0-aligned), and
the prediction runs on those grid indices, exactly in integers (as cuSZ's dual
quantization does). The codes come out as many and as small as when predicting from
reconstructed values (the v2 form below; the shared stacks' files within 0.02%), but no
floating-point operation sits on the path from one value to the next: the encoder's
values are independent of each other, and the decoder's chain is one integer addition.
Only two frames of grid indices are kept, in a ring with a zero border (no boundary
tests). A value stored exactly (an outlier) keeps its own grid index where it has one
(the decoder gets it from the stored value), else the prediction's.

Contexts: group (3-D, or the first frame / 2-D) x bucket of the code magnitudes
(min(|code|, 255), 255 for an outlier) of the neighbours in the row above (and in the
previous frame, for 3-D): residuals cluster, so a point next to large codes expects a
large one. (Not the value to the left: the decoder would have to finish it before
decoding the next symbol.)

Second stage (``wts``, format v4, fitted per stack by the encoder): the Lorenzo residual
v = g - p of a point is itself predicted from the residuals of its neighbours in the
rows above and in the previous frame (``_pq_corr_row``), and the code is v less that
prediction; the residuals are kept in a ring of their own.

Run coding (``runs_apply``, ``decode_pq_runs``, format v6): a stretch of points whose
neighbours' codes are all 0 is one symbol, how many of its first codes are 0, and the
decoder writes those without entropy decoding (a window's writer chooses it; the tuning
ranks the plain codings).

The v2 form (``decode``; read only): predictions from the reconstructed values, each
value quantized around its prediction; ``act`` holds the code magnitudes; rows are
decoded with fixed neighbour availability (above? previous frame?), and the first value
of a row goes through the general path. ``base`` (optional): a forecast; the predictor
then runs on the forecast error, as in ``interp``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import literally

from .core import (
    ALPHABET,
    ESC,
    FLAG,
    KMAX,
    MODE_FLOAT,
    MODE_INT,
    MODE_LOG,
    NB,
    OUT,
    PREC,
    RUN_CHUNK,
    M,
    bits_at,
    bucket16,
    ctx_entries,
    dense_low,
    escape_high,
    exact_value,
    inline,
    ipick,
    jit,
    outlined,
    padded,
    pick,
    pw_limit,
    rans_next,
    reconstruct,
    run_start,
    scalar,
    to_out,
    unzigzag,
    within,
)

G_3D, G_2D = 0, 1
N_CTX = 2 * NB
GROUPS = np.array([NB], np.int64)
# run coding (format v6, prequantized only; ``runs_apply``): three contexts after those,
# each a group of its own: a run that starts inside a row, one that starts a row, and the
# point that ends a run
RUN_MID, RUN_ROW, RUN_END = N_CTX, N_CTX + 1, N_CTX + 2
N_CTX_RUNS = N_CTX + 3
GROUPS_RUNS = np.array([NB, RUN_MID, RUN_ROW, RUN_END], np.int64)


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
    """Decode a v2 Lorenzo window (predictions from reconstructed values), the entropy
    decoding fused in (state in ``st`` as in ``interp.decode``)."""
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


# --- prequantized Lorenzo (format v3) -----------------------------------------------------

QMAX = float(2**50)     # grid indices beyond: no index (the value is an outlier)


@inline
def grid(mode, v, inv, e_int):
    """The grid index of a value (a float), and whether it has one: round(v / step) for
    floats, of log2|v| in the log domain; floor((v + e) / step) for integers, exact for
    |v + e| < 2^50 (the argument of ``core.quantize``), so that |v - index x step| <= e.
    Not finite or past ``QMAX``: none (NaN compares false)."""
    if mode == MODE_INT:
        g = np.floor((v + e_int + 0.5) * inv)
    elif mode == MODE_FLOAT:
        g = np.floor(v * inv + 0.5)
    else:
        av = abs(v)
        g = np.floor(math.log2(av) * inv + 0.5) if av > 0.0 and av < np.inf else np.nan
    return g, abs(g) <= QMAX


@inline
def from_grid(mode, otype, g, step, lo, hi, sg):
    """The output value of grid index ``g`` (a float; ``sg`` the sign in the log domain)."""
    if mode == MODE_INT:
        o = g * step
        return lo if o < lo else (hi if o > hi else o)
    if mode == MODE_FLOAT:
        return to_out(g * step, otype, lo, hi)
    return to_out(sg * math.exp2(g * step), otype, lo, hi)


# ring entries: a grid index and its point's activity in one int64 (index << 8 |
# activity), so one load reads both; indices wrap alike in the encoder and the decoder
N_S = 6 * 255 + 1           # activity sums s = 2 up + up-left + up-right + 2 previous


@inline
def _unpack(v):
    return v >> 8, v & 255


@inline
def _pq_pred(rg, j, dp, ra, Wp, nb, three):
    """Integer prediction and neighbour activity sum of ring position j (as ``_pred``):
    neighbours outside the volume are the ring's zero border (``dp``: the offset of the
    previous frame's slot, the zero slot for the first frame; ``ra``: the index to the
    left, 0 at the start of a row; ``Wp``: a ring row; ``three``: a constant at each call
    site, so each way is a loop of its own). ``nb``:
    what the points before read that this one needs (its up-left and up indices and
    activities, its previous frame's left and up-left indices), passed on: one load of
    the row above and two of the previous frame per point."""
    cu, bu, al, au, el, gl = nb
    u = j - Wp
    br, ar = _unpack(rg[np.uint64(u + 1)])
    s = (au + au) + al + ar
    q = bu - cu
    if three:
        jj = j + dp
        d, ad = _unpack(rg[np.uint64(jj)])
        f, _ = _unpack(rg[np.uint64(jj - Wp)])
        s += ad + ad
        q += (d - el) - (f - gl)
        return ra + q, s, (bu, br, au, ar, d, f)
    return ra + q, s, (bu, br, au, ar, gl, gl)


N_W = 7         # the second stage's weights: up, up-left, up-right, up-up, previous frame,
#                 its left and its up


V_MAX = float(2**21)     # residuals enter the second stage clamped to [-V_MAX, V_MAX]


@inline
def _vstore(v):
    """A residual as the residual ring holds it: clamped (so that every sum of the second
    stage is an exact float), as a float64."""
    f = np.float64(v)
    return V_MAX if f > V_MAX else (-V_MAX if f < -V_MAX else f)


@inline
def _pq_corr_row(rv, pcf, jv0, dv, Wp, W, wt):
    """The second stage of a fitted prequantized Lorenzo, for a row: ``pcf[x]`` the
    residual expected at x (a float holding an integer), from the residuals of the rows
    above and of the previous frame in the residual ring ``rv`` (``_vring``; ``dv`` the
    previous frame's offset), weighted by ``wt`` (sixteenths) and floored. Nothing of
    the row itself takes part: nothing is added to the decoder's path from one value to
    the next (with the left neighbour's residual, decoding ks_pypde took 1.4-1.8x as
    long). Exact: the weights are at most 64, the residuals 2^21, so every product and
    sum is an integer below 2^30, and (s + 8) / 16 is s x 0.0625 + 0.5, both exact; as
    float64 lanes, the row's loop is vector code."""
    wu, wul, wur, wuu, wp, wpl, wpu = wt
    for xx in range(W):
        u = np.uint64(jv0 + xx - Wp)
        q = np.uint64(jv0 + xx + dv)
        sm = (((wu * rv[u] + wul * rv[u - np.uint64(1)]) + (wur * rv[u + np.uint64(1)]
               + wuu * rv[u - np.uint64(Wp)])) + ((wp * rv[q] + wpl * rv[q - np.uint64(1)])
              + wpu * rv[q - np.uint64(Wp)]))
        pcf[xx] = np.floor(sm * 0.0625 + 0.5)


@inline
def _vring(t, H, W):
    """The residual ring: three slots of (H + 2) x (W + 2) (two zero rows above, a zero
    column on each side), frames in slots 0 and 1 in turn, slot 2 all 0. For frame t:
    (start of its row 0, offset to the previous frame's slot, the zero slot for the
    first frame: the previous frame takes part in the 2-D predictor's second stage as
    well)."""
    S = (H + 2) * (W + 2)
    dv = ((1 - (t & 1)) * S if t > 0 else 2 * S) - (t & 1) * S
    return (t & 1) * S + 2 * (W + 2) + 1, dv


@inline
def _pq_row_start(rg, j0, Wp):
    """``nb`` at a row's first point: the border's zeros but the up index and activity."""
    z = np.int64(0)
    b, a = _unpack(rg[np.uint64(j0 - Wp)])
    return z, b, z, a, z, z


@inline
def _pq_enc_row(mode, otype, arrs, row, j0, dp, W, go, qp, n, no, three, two, jv0, dv,
                wt):
    xf, of, sf, rg, ctab, codes, ctx, outp, rv, pcf = arrs
    step, inv, e_int, eb, lo, hi = qp
    ra = np.int64(0)
    Wp = W + 2
    nb = _pq_row_start(rg, j0, Wp)
    if two:     # (a constant at each call site)
        _pq_corr_row(rv, pcf, jv0, dv, Wp, W, wt)
    for xx in range(W):
        i = row + xx
        ui = np.uint64(i)
        uj = np.uint64(j0 + xx)
        uv = np.uint64(jv0 + xx)
        p, s, nb = _pq_pred(rg, j0 + xx, dp, ra, Wp, nb, three)
        pl = p
        if two:
            p = pl + np.int64(pcf[np.uint64(xx)])
        sg = 1.0
        if mode == MODE_LOG:
            sv = sf[ui]
            if sv == 2 or sv == -2:
                of[ui] = 0.0 if sv > 0 else -0.0
                rg[uj] = p << 8
                ra = p
                if two:
                    rv[uv] = _vstore(p - pl)
                continue
            sg = 1.0 if sv > 0 else -1.0
        ctx[np.uint64(n)] = ctab[np.uint64(go + s)]
        xo = np.float64(xf[ui])
        g, has = grid(mode, xo, inv, e_int)
        gi = ipick(has, np.int64(pick(has, g, 0.0)), p)
        k = gi - p
        o = from_grid(mode, otype, pick(has, g, 0.0), step, lo, hi, sg)
        ok = has and abs(k) <= KMAX
        if mode == MODE_FLOAT:
            ok = ok and within(xo, o, eb)
        elif mode == MODE_LOG:
            ok = ok and within(xo, o, pw_limit(eb, abs(xo)))
        ra = gi
        if two:
            rv[uv] = _vstore(gi - pl)
        if ok:
            codes[np.uint64(n)] = k
            of[ui] = o
            ak = abs(k)
            rg[uj] = (gi << 8) | (ak if ak < 255 else 255)
        else:
            codes[np.uint64(n)] = FLAG
            outp[np.uint64(no)] = i
            no += 1
            rg[uj] = (gi << 8) | 255
            of[ui] = xo if abs(xo) < np.inf else 0.0    # the caller puts non-finite ones in
        n += 1
    return n, no


@inline
def _ring(t, H, W, three):
    """The ring of a (T, H, W) volume: three slots of (H + 1) x (W + 2), whose first row
    and first and last columns stay 0 (the neighbours outside the volume); frames go to
    slots 0 and 1 in turn, slot 2 stays 0. For frame t: (offset of its context group in
    the context table, start of its row 0 in the ring, offset to the previous frame's
    slot)."""
    S = (H + 1) * (W + 2)
    fb = (t & 1) * S + (W + 2) + 1
    prev = three and t > 0
    dp = ((1 - (t & 1)) * S if prev else 2 * S) - (t & 1) * S
    return (G_3D if prev else G_2D) * N_S, fb, dp


@inline
def _ctx_table():
    """Context of each context group and activity sum (offset group x N_S)."""
    tab = np.empty(2 * N_S, np.uint8)
    for g in range(2):
        for s in range(N_S):
            tab[g * N_S + s] = g * NB + bucket16(2.0 * s)
    return tab


@inline
def _second_stage(wts, H, W):
    """(whether there is one, the residual ring, the weights as a tuple)."""
    two = False
    for j in range(N_W):
        two = two or wts[j] != 0
    rv = np.zeros(3 * (H + 2) * (W + 2) if two else 1, np.float64)
    wt = (np.float64(wts[0]), np.float64(wts[1]), np.float64(wts[2]), np.float64(wts[3]),
          np.float64(wts[4]), np.float64(wts[5]), np.float64(wts[6]))
    return two, rv, wt


@jit
def encode_pq(x, out, sgn, step, e_int, eb, mode, otype, lo, hi, three, codes, ctx, outp,
              n0, no0, wts):
    """Prequantized Lorenzo: code the volume ``x``: codes (FLAG for outliers) and contexts
    from position n0, outlier positions (flat indices into x, in coding order) from no0
    (as ``interp.encode``). Returns (n, no). Non-finite outliers leave 0 in ``out``: the
    caller puts the exact values in afterwards. ``wts``: the second stage's ``N_W``
    weights (``_pq_corr_row``, sixteenths; all 0: none, the plain form)."""
    mode = literally(mode)
    otype = literally(otype)
    T, H, W = x.shape
    xf = x.ravel()
    of = out.ravel()
    sf = sgn.ravel()
    rg = np.zeros(3 * (H + 1) * (W + 2), np.int64)
    two, rv, wt = _second_stage(wts, H, W)
    pcf = np.empty(W if two else 1, np.float64)
    arrs = (xf, of, sf, rg, _ctx_table(), codes, ctx, outp, rv, pcf)
    qp = (step, 1.0 / step, e_int, eb, lo, hi)
    n = n0
    no = no0
    for t in range(T):
        go, fb, dp = _ring(t, H, W, three)
        fv, dv = _vring(t, H, W)
        for y in range(H):
            # (each way its own loop: with the previous frame's reads or not, with the
            # second stage or not)
            row = (t * H + y) * W
            j0 = fb + y * (W + 2)
            if three and two:
                n, no = _pq_enc_row(mode, otype, arrs, row, j0, dp, W, go, qp, n, no, True,
                                    True, fv + y * (W + 2), dv, wt)
            elif three:
                n, no = _pq_enc_row(mode, otype, arrs, row, j0, dp, W, go, qp, n, no, True,
                                    False, fv + y * (W + 2), dv, wt)
            elif two:
                n, no = _pq_enc_row(mode, otype, arrs, row, j0, dp, W, go, qp, n, no, False,
                                    True, fv + y * (W + 2), dv, wt)
            else:
                n, no = _pq_enc_row(mode, otype, arrs, row, j0, dp, W, go, qp, n, no, False,
                                    False, fv + y * (W + 2), dv, wt)
    return n, no


_Q_BITS = np.uint64(0x1818181818181818)     # (``_quiet8``: NB = 24 in every byte)
_Q_B3 = np.uint64(0x0808080808080808)


@scalar
def _quiet8(w):
    """Whether each of the 8 contexts (bytes) in word ``w`` is 0 or NB: bucket 0 (no bit
    but those of 24 set, and bits 3 and 4 of each byte equal; in any byte order)."""
    return (w & ~_Q_BITS) == 0 and ((w >> np.uint64(1)) ^ w) & _Q_B3 == 0


@jit
def runs_apply(codes, ctx, W, limit):
    """Run coding of a prequantized Lorenzo coding (``codes``, ``ctx``: rows of ``W``
    codes in raster order). A stretch of points of activity 0 (their neighbours' codes
    all 0: the contexts' bucket 0), L long, whose first point's left neighbour has code
    0 (or which starts a row) is coded as one symbol, L - r (as the code whose zigzag is
    L - r; in ``RUN_ROW`` at a row's start, else ``RUN_MID``), where r is the number of
    its first points whose code is 0; where r < L, the code of the point after them
    (not 0) follows in ``RUN_END``, and the points after that are coded one by one as
    before. Every other point keeps its code and context. Returns (codes, contexts,
    their number m), or m = -1 where more than ``limit`` symbols would be made or the
    codes are not rows of ``W``.

    The decoder skips the entropy decoding of the points of a run (on the shared smoke
    stack at 1e-3, 32-63% of the codes are left). Bounding a run by its stretch keeps
    the contexts of the points past it: runs that went on past the stretch, their
    length coded as is, made smoke's windows 1.003-1.029x as large; these make them
    0.97-0.995x.

    A row's points are read 8 at a time where they are quiet and aligned (their contexts
    as one 64-bit word, their codes as four), and the symbol limit is checked once a row
    (its buffer holds a row's symbols past it): on a smoke window at 1e-3, 0.56 to 0.31
    ms alone, 0.62 to 0.50 ms inside compression (median)."""
    if NB != 24:
        raise AssertionError("runs_apply: _quiet8 is written for NB = 24")
    n = codes.size
    if W < 1 or n % W or limit < 0:
        return np.empty(0, np.int32), np.empty(0, np.uint8), -1
    # every point but the quiet ones of code 0 makes a symbol of its own (a run's, an
    # ending code's or its own code's): where those alone are past ``limit``, the runs
    # cannot pay, and the pass below is spared. Counted in blocks that vectorize, up to
    # the count at which they may pay (ks_pypde's windows at 1e-3 and 1e-4, under 1%
    # quiet, spent 1.6-1.9 ms each in that pass to find they do not)
    qz = 0
    need = n - limit
    for b0 in range(0, n, 4096):
        if qz >= need:
            break
        for i in range(b0, min(b0 + 4096, n)):  # (unsigned: no wrap-around test)
            c = ctx[np.uint64(i)]
            qz += np.int64((c == 0) | (c == NB)) & np.int64(codes[np.uint64(i)] == 0)
    if qz < need:
        return np.empty(0, np.int32), np.empty(0, np.uint8), -1
    cap = min(limit, n + n // 2 + 2 * (n // W) + 2) + 2 * W + 2     # (a point makes at
    #                                                                  most two symbols)
    oc = np.empty(cap, np.int32)
    ox = np.empty(cap, np.uint8)
    c64 = codes.view(np.uint64) if n % 2 == 0 else codes[:0].view(np.uint64)
    x64 = ctx[:n - n % 8].view(np.uint64)
    wide = c64.size > 0
    m = 0
    for r0 in range(0, n, W):
        if m > limit:
            return oc, ox, -1
        e = r0 + W
        x = 0
        while x < W:
            i = r0 + x
            c = ctx[i]
            if (c == 0 or c == NB) and (x == 0 or codes[i - 1] == 0):   # (bucket 0)
                # its first r codes 0 (one scan), then the rest of the stretch
                j = i
                while True:
                    if wide and j & 7 == 0 and j + 8 <= e:
                        h = j >> 1
                        if _quiet8(x64[j >> 3]) and (c64[h] | c64[h + 1] | c64[h + 2]
                                                     | c64[h + 3]) == 0:
                            j += 8
                            continue
                    if j < e and codes[j] == 0 and (ctx[j] == 0 or ctx[j] == NB):
                        j += 1
                        continue
                    break
                k = j
                while True:
                    if k & 7 == 0 and k + 8 <= e and _quiet8(x64[k >> 3]):
                        k += 8
                        continue
                    if k < e and (ctx[k] == 0 or ctx[k] == NB):
                        k += 1
                        continue
                    break
                s = k - j           # L - r
                oc[m] = (s >> 1) ^ -(s & 1)
                ox[m] = RUN_ROW if x == 0 else RUN_MID
                m += 1
                if s:
                    oc[m] = codes[j]
                    ox[m] = RUN_END
                    m += 1
                    j += 1
                x = j - r0
            else:
                oc[m] = codes[i]
                ox[m] = c
                m += 1
                x += 1
    return oc, ox, (m if m <= limit else -1)


@inline
def _run_length(e, x0, x1, wp, bpos, lut, fc, words, lw):
    """The zigzag code z of a run's L - r (``runs_apply``), decoded under context
    entry ``e`` (class << 8 | low bits); an outlier symbol (which no coder writes) is
    0. Returns (z, the stream states)."""
    cb = e & 0xFF00
    slot = x0 & (M - 1)
    sym = np.int64(lut[np.uint64((cb << (PREC - 8)) + slot)])
    x0, x1, wp = rans_next(x0, x1, slot, fc[np.uint64(cb + sym)],
                           np.int64(words[np.uint64(wp)]), wp)
    if sym == OUT:
        return np.uint64(0), x0, x1, wp, bpos
    hv = np.uint64(sym)
    if sym == ESC:
        hv, bpos = escape_high(lw, bpos)
    kb = e & 255
    z = hv << np.uint64(kb)
    if kb:
        w = bpos >> 6
        low, bpos = bits_at(lw[np.uint64(w)], lw[np.uint64(w + 1)], bpos, kb)
        z |= low
    return z, x0, x1, wp, bpos


@outlined
def _pq_dec_vol(mode, otype, arrs, T, H, W, qp, state, three, two, wt):
    """Decode the volume, row by row (``three``, ``two``: constants at each call site, as
    in ``_pq_pred``; a function of its own for each, ``core.outlined``). The rows are a
    loop here, not calls of a row helper: every array an inlined helper unpacks costs
    two atomic reference-count updates per call, 24 per row when each row was a call
    (decoding smoke at 1e-3 1.04-1.05x, ks_pypde 1.00-1.02x in ``kernel_ab.py``; the
    same change to ``encode_pq`` measured 0.92-0.96x)."""
    of, sf, rg, dtab, pq, lut, fc, words, lw, outv, outp, dense, rv, pc, pcf = arrs
    step, inv, e_int, lo, hi = qp
    x0, x1, wp, bpos, op = state
    nov = outv.size
    Wp = W + 2
    for t in range(T):
        go, fb, dp = _ring(t, H, W, three)
        fv, dv = _vring(t, H, W)
        for y in range(H):
            row = (t * H + y) * W
            j0 = fb + y * Wp
            jv0 = fv + y * Wp
            ra = np.int64(0)
            nb = _pq_row_start(rg, j0, Wp)
            if two:
                _pq_corr_row(rv, pcf, jv0, dv, Wp, W, wt)
            # the row's predictions but for the value to the left, and its context
            # entries, first, in a loop of their own (they read the rows before only),
            # interleaved in one buffer: the loop that decodes holds fewer values
            # (``benchmarks/results/kernel_ab.md``)
            for xx in range(W):
                q, s, nb = _pq_pred(rg, j0 + xx, dp, np.int64(0), Wp, nb, three)
                if two:     # the second stage's correction
                    c = np.int64(pcf[np.uint64(xx)])
                    pc[np.uint64(xx)] = c
                    q += c
                pq[np.uint64(2 * xx)] = q
                pq[np.uint64(2 * xx + 1)] = np.int64(dtab[np.uint64(go + s)])
            # a while loop, not ``for xx in range(W)``: numba's range keeps a count of
            # its own beside xx, one register more, and the rANS states were then
            # swapped through the stack (``kernel_ab.py``: smoke's 2-D decoding at 1e-3
            # 1.03x in three runs, ks_pypde's 3-D one with a second stage 0.98-1.00x)
            xx = -1
            while xx < W - 1:
                xx += 1
                if (xx & (RUN_CHUNK - 1)) == 0:    # chunks of RUN_CHUNK points (a loop over
                    #                                chunks measured 5-8% slower than this test)
                    wp, bpos = run_start(wp, bpos, words.size, lw.size, min(RUN_CHUNK, W - xx))
                i = row + xx
                ui = np.uint64(i)
                uj = np.uint64(j0 + xx)
                p = ra + pq[np.uint64(2 * xx)]
                uv = np.uint64(jv0 + xx)
                sg = 1.0
                if mode == MODE_LOG:
                    sv = sf[ui]
                    if sv == 2 or sv == -2:
                        of[ui] = 0.0 if sv > 0 else -0.0
                        rg[uj] = p << 8
                        ra = p
                        if two:     # the residual v = g - (p - correction)
                            rv[uv] = _vstore(pc[np.uint64(xx)])
                        continue
                    sg = 1.0 if sv > 0 else -1.0
                e = pq[np.uint64(2 * xx + 1)]
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
                        g, has = grid(mode, v, inv, e_int)
                        gi = ipick(has, np.int64(pick(has, g, 0.0)), p)
                        rg[uj] = (gi << 8) | 255
                        ra = gi
                        if two:
                            rv[uv] = _vstore((gi - p) + pc[np.uint64(xx)])
                        of[ui] = v if abs(v) < np.inf else 0.0
                        continue
                    hv, bpos = escape_high(lw, bpos)
                kb = e & 255
                z = hv << np.uint64(kb)
                if dense or kb:     # see core.dense_low
                    w = bpos >> 6
                    low, bpos = bits_at(lw[np.uint64(w)], lw[np.uint64(w + 1)], bpos, kb)
                    z |= low
                k = unzigzag(np.int64(z))
                gi = p + k
                ra = gi
                if two:
                    rv[uv] = _vstore(k + pc[np.uint64(xx)])
                ak = abs(k)
                rg[uj] = (gi << 8) | (ak if ak < 255 else 255)
                of[ui] = from_grid(mode, otype, np.float64(gi), step, lo, hi, sg)
    return x0, x1, wp, bpos, op


@outlined
def _pq_dec_vol_runs(mode, otype, arrs, T, H, W, qp, state, three, two, wt, ren):
    """``_pq_dec_vol`` of a run-coded window (``runs_apply``): a copy of its own, so
    that ``decode_pq`` compiles without the runs (with a flag for them, passed as a
    constant, it took 61 s a signature to compile instead of 13). Decode the volume,
    row by row, as ``_pq_dec_vol``."""
    of, sf, rg, dtab, pq, lut, fc, words, lw, outv, outp, dense, rv, pc, pcf = arrs
    step, inv, e_int, lo, hi = qp
    x0, x1, wp, bpos, op = state
    nov = outv.size
    Wp = W + 2
    per = 2     # symbols a point reads at most (``runs_apply``)
    for t in range(T):
        go, fb, dp = _ring(t, H, W, three)
        fv, dv = _vring(t, H, W)
        for y in range(H):
            row = (t * H + y) * W
            j0 = fb + y * Wp
            jv0 = fv + y * Wp
            ra = np.int64(0)
            nb = _pq_row_start(rg, j0, Wp)
            if two:
                _pq_corr_row(rv, pcf, jv0, dv, Wp, W, wt)
            # the row's predictions but for the value to the left, and its context
            # entries, first, in a loop of their own (they read the rows before only),
            # interleaved in one buffer: the loop that decodes holds fewer values
            # (``benchmarks/results/kernel_ab.md``)
            for xx in range(W):
                q, s, nb = _pq_pred(rg, j0 + xx, dp, np.int64(0), Wp, nb, three)
                if two:     # the second stage's correction
                    c = np.int64(pcf[np.uint64(xx)])
                    pc[np.uint64(xx)] = c
                    q += c
                pq[np.uint64(2 * xx)] = q
                # (bit 16: activity 0, where a run may start)
                pq[np.uint64(2 * xx + 1)] = np.int64(dtab[np.uint64(go + s)]) | (
                    np.int64(s == 0) << 16)
            # a while loop, not ``for xx in range(W)``: numba's range keeps a count of
            # its own beside xx, one register more, and the rANS states were then
            # swapped through the stack (``kernel_ab.py``: smoke's 2-D decoding at 1e-3
            # 1.03x in three runs, ks_pypde's 3-D one with a second stage 0.98-1.00x)
            xx = -1
            while xx < W - 1:
                xx += 1
                if (xx & (RUN_CHUNK - 1)) == 0:    # chunks of RUN_CHUNK points (a loop over
                    #                                chunks measured 5-8% slower than this test)
                    wp, bpos = run_start(wp, bpos, words.size, lw.size,
                                         per * min(RUN_CHUNK, W - xx))
                e = pq[np.uint64(2 * xx + 1)]
                if (e >> 16) != 0 and (
                        xx == 0 or (rg[np.uint64(j0 + xx - 1)] & 255) == 0):
                    # a run (``runs_apply``): the stretch of points of activity 0 from
                    # here, L long; L - r, then r points of code 0 (a damaged stream's
                    # L - r, past L, is L; its outlier symbol, which no coder writes, 0)
                    L = 1
                    while xx + L < W and (pq[np.uint64(2 * (xx + L) + 1)] >> 16) != 0:
                        L += 1
                    z, x0, x1, wp, bpos = _run_length(ren[0] if xx else ren[1], x0, x1, wp,
                                                      bpos, lut, fc, words, lw)
                    r = L - np.int64(z) if z < np.uint64(L) else np.int64(0)
                    for xr in range(xx, xx + r):
                        p = ra + pq[np.uint64(2 * xr)]
                        ra = p
                        if two:
                            rv[np.uint64(jv0 + xr)] = _vstore(pc[np.uint64(xr)])
                        rg[np.uint64(j0 + xr)] = p << 8
                        of[np.uint64(row + xr)] = from_grid(mode, otype, np.float64(p), step,
                                                            lo, hi, 1.0)
                    xx += r
                    if xx == W:
                        break
                    # the point that ends the run, its code in a context of its own;
                    # or, past the stretch, the next point as any other
                    e = ren[2] if r < L else pq[np.uint64(2 * xx + 1)]
                    wp, bpos = run_start(wp, bpos, words.size, lw.size,
                                         per * min(RUN_CHUNK, W - xx))
                i = row + xx
                ui = np.uint64(i)
                uj = np.uint64(j0 + xx)
                p = ra + pq[np.uint64(2 * xx)]
                uv = np.uint64(jv0 + xx)
                sg = 1.0
                if mode == MODE_LOG:
                    sv = sf[ui]
                    if sv == 2 or sv == -2:
                        of[ui] = 0.0 if sv > 0 else -0.0
                        rg[uj] = p << 8
                        ra = p
                        if two:     # the residual v = g - (p - correction)
                            rv[uv] = _vstore(pc[np.uint64(xx)])
                        continue
                    sg = 1.0 if sv > 0 else -1.0
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
                        g, has = grid(mode, v, inv, e_int)
                        gi = ipick(has, np.int64(pick(has, g, 0.0)), p)
                        rg[uj] = (gi << 8) | 255
                        ra = gi
                        if two:
                            rv[uv] = _vstore((gi - p) + pc[np.uint64(xx)])
                        of[ui] = v if abs(v) < np.inf else 0.0
                        continue
                    hv, bpos = escape_high(lw, bpos)
                kb = e & 255
                z = hv << np.uint64(kb)
                if dense or kb:     # see core.dense_low
                    w = bpos >> 6
                    low, bpos = bits_at(lw[np.uint64(w)], lw[np.uint64(w + 1)], bpos, kb)
                    z |= low
                k = unzigzag(np.int64(z))
                gi = p + k
                ra = gi
                if two:
                    rv[uv] = _vstore(k + pc[np.uint64(xx)])
                ak = abs(k)
                rg[uj] = (gi << 8) | (ak if ak < 255 else 255)
                of[ui] = from_grid(mode, otype, np.float64(gi), step, lo, hi, sg)
    return x0, x1, wp, bpos, op


@jit
def decode_pq(out, sgn, step, e_int, mode, otype, lo, hi, three, cmap, kbs, lut, fc, words,
              lw, outv, outp, st, wts):
    """Inverse of ``encode_pq``, the entropy decoding fused in (``st`` as in ``decode``)."""
    mode = literally(mode)
    otype = literally(otype)
    T, H, W = out.shape
    arrs, qp, sta, two, wt, ren = _pq_dec_setup(out, sgn, step, e_int, lo, hi, cmap, kbs,
                                                lut, fc, words, lw, outv, outp, st, wts,
                                                False)
    # (each way its own loop: with the previous frame's reads or not, with the second
    # stage or not)
    if three and two:
        sta = _pq_dec_vol(mode, otype, arrs, T, H, W, qp, sta, True, True, wt)
    elif three:
        sta = _pq_dec_vol(mode, otype, arrs, T, H, W, qp, sta, True, False, wt)
    elif two:
        sta = _pq_dec_vol(mode, otype, arrs, T, H, W, qp, sta, False, True, wt)
    else:
        sta = _pq_dec_vol(mode, otype, arrs, T, H, W, qp, sta, False, False, wt)
    _pq_dec_end(st, sta)


@jit
def decode_pq_runs(out, sgn, step, e_int, mode, otype, lo, hi, three, cmap, kbs, lut, fc,
                   words, lw, outv, outp, st, wts):
    """``decode_pq`` of a run-coded window (``runs_apply``): a kernel of its own, so
    that windows without runs decode without its tests (a flag tested per point made
    smoke's decoding at 1e-3 1.16x as slow) and ``decode_pq`` compiles without them (a
    flag passed as a constant still took 61 s a signature, not 13); compiled only where
    a run-coded window is decoded."""
    mode = literally(mode)
    otype = literally(otype)
    T, H, W = out.shape
    arrs, qp, sta, two, wt, ren = _pq_dec_setup(out, sgn, step, e_int, lo, hi, cmap, kbs,
                                                lut, fc, words, lw, outv, outp, st, wts,
                                                True)
    if three and two:
        sta = _pq_dec_vol_runs(mode, otype, arrs, T, H, W, qp, sta, True, True, wt, ren)
    elif three:
        sta = _pq_dec_vol_runs(mode, otype, arrs, T, H, W, qp, sta, True, False, wt, ren)
    elif two:
        sta = _pq_dec_vol_runs(mode, otype, arrs, T, H, W, qp, sta, False, True, wt, ren)
    else:
        sta = _pq_dec_vol_runs(mode, otype, arrs, T, H, W, qp, sta, False, False, wt, ren)
    _pq_dec_end(st, sta)


@inline
def _pq_dec_setup(out, sgn, step, e_int, lo, hi, cmap, kbs, lut, fc, words, lw, outv, outp,
                  st, wts, runs):
    """The decoders' arrays, parameters and states (``runs``: a run-coded window)."""
    T, H, W = out.shape
    of = out.ravel()
    sf = sgn.ravel()
    rg = np.zeros(3 * (H + 1) * (W + 2), np.int64)
    if (cmap.size == N_CTX_RUNS) != runs:
        raise ValueError("lorenzo.decode_pq: a model of another coding")
    if not padded(words, lw, st, (2 if runs else 1) * min(W, RUN_CHUNK)):
        raise ValueError("lorenzo.decode_pq: streams not padded for its runs")
    ctab = _ctx_table()
    ce = ctx_entries(cmap, kbs)
    ren = np.zeros(3, np.int64)     # the run coding's context entries
    if runs:
        for j in range(3):
            ren[j] = ce[RUN_MID + j]
    dtab = np.empty(ctab.size, np.uint16)    # context table entry -> ``ctx_entries``
    for s in range(ctab.size):
        dtab[s] = ce[np.int64(ctab[s])]
    pq = np.empty(2 * W, np.int64)     # a row's predictions (but the left value) and
    #                                    context entries, interleaved (``_pq_dec_vol``)
    two, rv, wt = _second_stage(wts, H, W)
    pc = np.empty(W if two else 1, np.int64)    # a row's second-stage corrections
    pcf = np.empty(W if two else 1, np.float64)     # ... as ``_pq_corr_row`` gives them
    arrs = (of, sf, rg, dtab, pq, lut, fc, words, lw, outv, outp, dense_low(kbs), rv, pc, pcf)
    qp = (step, 1.0 / step, e_int, lo, hi)
    sta = (st[0], st[1], st[2], st[3], st[7])
    return arrs, qp, sta, two, wt, ren


@inline
def _pq_dec_end(st, sta):
    x0, x1, wp, bpos, op = sta
    st[0] = x0
    st[1] = x1
    st[2] = wp
    st[3] = bpos
    st[7] = op


@jit
def stage_moments(codes, nch, T, H, W, max_points):
    """The normal equations of the second stage's least-squares fit on a window's plain
    prequantized Lorenzo codes (``codes``: its residuals, FLAG for outliers, one per
    value, ``nch`` channels of (T, H, W) one after another): (A'A, A'b, b'b, points),
    A's rows the residuals of a point's seven ``_pq_corr_row`` neighbours, b its own,
    each clamped as the residual ring holds it, over the points where all eight are
    residuals: in every ``step``-th row of frames t >= 1, rows y >= 2, columns 1..W-2,
    the step the smallest that keeps the points at most about ``max_points``."""
    m = np.zeros((N_W + 1, N_W + 1), np.float64)     # the moments of (A | b)
    f = np.zeros(N_W + 1, np.float64)
    HW = H * W
    rows = nch * max(T - 1, 0) * max(H - 2, 0)
    step = max(1, (rows * max(W - 2, 1)) // max(max_points, 1))
    n = 0
    r = 0
    for c in range(nch):
        for t in range(1, T):
            for y in range(2, H):
                r += 1
                if r % step != 0:
                    continue
                i0 = c * T * HW + t * HW + y * W
                for x in range(1, W - 1):
                    i = i0 + x
                    k0 = codes[i - W]
                    k1 = codes[i - W - 1]
                    k2 = codes[i - W + 1]
                    k3 = codes[i - 2 * W]
                    k4 = codes[i - HW]
                    k5 = codes[i - HW - 1]
                    k6 = codes[i - HW - W]
                    k7 = codes[i]
                    if (k0 == FLAG or k1 == FLAG or k2 == FLAG or k3 == FLAG or k4 == FLAG
                            or k5 == FLAG or k6 == FLAG or k7 == FLAG):
                        continue
                    f[0] = _vstore(k0)
                    f[1] = _vstore(k1)
                    f[2] = _vstore(k2)
                    f[3] = _vstore(k3)
                    f[4] = _vstore(k4)
                    f[5] = _vstore(k5)
                    f[6] = _vstore(k6)
                    f[7] = _vstore(k7)
                    for j in range(N_W + 1):
                        fj = f[j]
                        for k in range(j, N_W + 1):
                            m[j, k] += fj * f[k]
                    n += 1
    for j in range(N_W + 1):
        for k in range(j):
            m[j, k] = m[k, j]
    return m[:N_W, :N_W].copy(), m[:N_W, N_W].copy(), m[N_W, N_W], n
