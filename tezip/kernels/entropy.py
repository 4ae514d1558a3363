"""Entropy coding kernels: contexts merged into classes, the split of each code into an
entropy-coded high part and raw low bits, static rANS with one table per class (two
interleaved states, 16-bit words), and code-length estimates for ranking candidates.

A code ``k`` (int) becomes ``z = zigzag(k)``; class ``c`` keeps ``kb[c]`` low bits raw and
codes ``hi = z >> kb[c]`` as a symbol below ESC, or ESC with ``hi - ESC`` in the escape
stream; OUT marks an outlier (its value travels exactly, elsewhere). Decoding is fused
into the predictor kernels (``core.rans_step`` / ``core.read_code``).
"""

from __future__ import annotations

import math

import numpy as np

from .core import ALPHABET, ESC, FC_SHIFT, OUT, PREC, RANS_L, M, bit_length, inline, jit, mulhi

MIN_CLASS = 1024      # contexts are merged until a class holds this many codes
MAX_CLASSES = 250


@jit
def class_map(counts, groups):
    """Merge adjacent contexts (never across the group boundaries listed in ``groups``,
    ascending context indices where a new group starts) until every class holds at least
    MIN_CLASS codes. Returns (map context -> class, number of classes)."""
    n = counts.size
    cmap = np.zeros(n, np.uint8)
    cls = 0
    acc = 0
    gi = 0
    first = True
    for i in range(n):
        newgroup = gi < groups.size and i == groups[gi]
        if newgroup:
            gi += 1
        if not first and counts[i] > 0 and cls < MAX_CLASSES - 1 and (
                acc >= MIN_CLASS or (newgroup and acc > 0)):
            cls += 1
            acc = 0
        if counts[i] > 0:
            first = False
        cmap[i] = cls
        acc += counts[i]
    if cls > 0 and acc < MIN_CLASS // 4:
        # the last class is tiny: fold it into the one before
        for i in range(n):
            if cmap[i] == cls:
                cmap[i] = cls - 1
        cls -= 1
    return cmap, cls + 1


@jit
def choose_kb(zsum, zcnt, cmap, n_class):
    """Low bits per class from the mean zigzag code of its contexts: keep the mean of the
    high part near 8, where low bits stop being near-uniform."""
    s = np.zeros(n_class, np.float64)
    c = np.zeros(n_class, np.float64)
    for i in range(zsum.size):
        s[cmap[i]] += zsum[i]
        c[cmap[i]] += zcnt[i]
    kb = np.zeros(n_class, np.int64)
    for j in range(n_class):
        if c[j] > 0:
            mean = s[j] / c[j]
            kb[j] = max(0, min(60, int(math.floor(math.log2(mean + 1.0))) - 3))
    return kb


KB_PROPOSE = 0.02   # a class whose bit lengths price fewer low bits this much cheaper
#                     than the mean rule's is priced exactly (``propose_kb``)
KB_SWITCH = 0.01    # ... and takes the fewer where its exact price is this much lower
KB_CANDS = 5        # the fewer low-bit counts priced exactly per proposed class


@jit
def propose_kb(blen, cmap, n_class, kb):
    """Fewer low bits to price exactly (``refine_kb``) for the classes where the mean
    rule (``choose_kb``) may cost most: on a class of small and large codes (saturated,
    dead or hot pixels beside smooth ones; every other column 65535), every small code
    pays the low bits the large ones set the mean to. Per class, up to KB_CANDS counts
    (-1: none): the one its bit-length histogram (``blen``, per context) prices cheapest
    (``_kb_price``: a uniform spread within a bit length) where that saves over
    KB_PROPOSE, the counts on either side of it, and the fewest with which no code
    escapes (a high part of 8 bits at most), and all but the longest 1%. Only a
    proposal: the bit lengths cannot see codes of one bit length that sit on a few
    values, which the coder codes almost free (a switch on this price alone made 73 of a
    break-test's 1,514 files larger, up to 1.32x). Returns (candidates, whether any)."""
    h = np.zeros((n_class, 65), np.float64)
    for i in range(cmap.size):
        for b in range(65):
            h[cmap[i], b] += np.float64(blen[i, b])
    cand = np.full((n_class, KB_CANDS), -1, np.int64)
    some = False
    for j in range(n_class):
        if kb[j] == 0:
            continue
        hj = h[j]
        nlogn = np.zeros(65, np.float64)
        for b in range(65):
            if hj[b] > 0.0:
                nlogn[b] = hj[b] * math.log2(hj[b])
        price = _kb_price(hj, nlogn, kb[j])
        # an escaped high part's length has 6 bits: at least 1 low bit where a code has
        # 64 (the bit-exact predictors' int64 codes), as the mean rule always keeps
        top = 64
        while top > 0 and hj[top] == 0.0:
            top -= 1
        lo = max(0, top - 63)
        best = kb[j]
        bp = price
        for k in range(lo, kb[j]):
            p = _kb_price(hj, nlogn, k)
            if p < bp:
                best = k
                bp = p
        if bp < (1.0 - KB_PROPOSE) * price:
            some = True
            b99 = top
            above = hj[top]
            tot = 0.0
            for b in range(65):
                tot += hj[b]
            while b99 > 0 and above + hj[b99 - 1] <= 0.01 * tot:
                b99 -= 1
                above += hj[b99]
            m = 0
            for k in (best, best - 1, best + 1, top - 8, b99 - 8):
                fresh = lo <= k < kb[j]
                for q in range(m):
                    fresh = fresh and cand[j, q] != k
                if fresh:
                    cand[j, m] = k
                    m += 1
    return cand, some


@inline
def _kb_price(n, nlogn, k):
    """Estimated bits of a class's codes (bit-length histogram ``n``, 65 bins; ``nlogn``
    its n log2 n) with ``k`` low bits: each code's raw bits (k, or for a longer code its
    bits past the leading one, as if uniform, plus an escape's 6), and the entropy of
    its high part's bit length (0 for codes of at most k bits, one escape symbol from 9
    on)."""
    tot = 0.0
    small = 0.0
    raw = 0.0
    ent = 0.0
    esc = 0.0
    for b in range(65):
        v = n[b]
        tot += v
        if b <= k:
            small += v
        elif b - k >= 9:
            esc += v
            raw += v * (b - 1 + 6)
        else:
            raw += v * (b - 1)
            ent -= nlogn[b]
    raw += small * k
    if small > 0.0:
        ent -= small * math.log2(small)
    if esc > 0.0:
        ent -= esc * math.log2(esc)
    if tot > 0.0:
        ent += tot * math.log2(tot)
    return raw + ent


@jit
def refine_kb(codes, ctx, cmap, kb, cand, outl_flag, use_flag, step, offs):
    """The low bits per class: ``kb`` (the mean rule's), or for a class with candidates
    (``propose_kb``) the count whose price on its codes is lowest, where that is over
    KB_SWITCH below the price of ``kb``'s. The price is what ``estimate_bits`` counts:
    the empirical entropy of the class's symbols (high parts, escapes, outliers), the
    raw low and escaped bits, and 10 bits a used symbol for the table. One pass over the
    codes of the proposed classes, or over the sample ``ctx_stats_narrow`` takes
    (``step``, ``offs``; step 1: every code): the proposal's low bits are never fewer
    than the longest code needs (``propose_kb``), so a sample only prices. Returns (the
    low bits, the bits they save on the codes priced)."""
    n_class = kb.size
    nk = KB_CANDS + 1
    # the proposed classes' rows, compact (one class's tables of 6 x 256 counts are 12 KB)
    row = np.full(n_class, -1, np.int64)
    n_on = 0
    for j in range(n_class):
        if cand[j, 0] >= 0:
            row[j] = n_on
            n_on += 1
    ks = np.full((max(n_on, 1), nk), -1, np.int64)
    nks = np.zeros(max(n_on, 1), np.int64)
    for j in range(n_class):
        r = row[j]
        if r >= 0:
            ks[r, 0] = kb[j]
            m = 1
            while m <= KB_CANDS and cand[j, m - 1] >= 0:
                ks[r, m] = cand[j, m - 1]
                m += 1
            nks[r] = m
    hist = np.zeros((max(n_on, 1), nk, ALPHABET), np.int64)
    raw = np.zeros((max(n_on, 1), nk), np.int64)
    mask = offs.size - 1
    for g4 in range(codes.size // (4 * step)):
        o4 = 4 * g4 * step + np.int64(offs[g4 & mask])
        for h in range(4):
            i = np.uint64(o4 + h * step)
            r = row[cmap[ctx[i]]]
            if r < 0:
                continue
            k = np.int64(codes[i])
            if use_flag and k == outl_flag:
                for m in range(nks[r]):
                    hist[r, m, OUT] += 1
                continue
            z = np.uint64((k << 1) ^ (k >> 63))
            for m in range(nks[r]):
                kk = ks[r, m]
                hi = z >> np.uint64(kk)
                if hi >= ESC:
                    hist[r, m, ESC] += 1
                    raw[r, m] += kk + 6 + bit_length(hi - np.uint64(ESC))
                else:
                    hist[r, m, hi] += 1
                    raw[r, m] += kk
    out = kb.copy()
    saved = 0.0
    for j in range(n_class):
        r = row[j]
        if r < 0:
            continue
        best = 0
        bp = 0.0
        p0 = 0.0
        for m in range(nks[r]):
            tot = 0
            for s in range(ALPHABET):
                tot += hist[r, m, s]
            p = np.float64(raw[r, m])
            for s in range(ALPHABET):
                n = hist[r, m, s]
                if n > 0:
                    p += 10.0 - n * math.log2(n / tot)
            if m == 0:
                p0 = p
                bp = p
            elif p < bp:
                best = m
                bp = p
        if best > 0 and bp < (1.0 - KB_SWITCH) * p0:
            out[j] = ks[r, best]
            saved += p0 - bp
    return out, saved


@jit
def _fold_stats(bl, zs, outl):
    """The four tables of ``ctx_stats`` (bit-length histograms, zigzag sums, outlier
    counts; by position mod 4) folded into (count, zigzag sum, zigzag count, bit-length
    histogram of 65 bins) per context."""
    n_ctx = bl.shape[1]
    blen = bl[0, :, :65] + bl[1, :, :65] + bl[2, :, :65] + bl[3, :, :65]
    cnt = np.zeros(n_ctx, np.int64)
    zsum = np.zeros(n_ctx, np.float64)
    zcnt = np.zeros(n_ctx, np.float64)
    for c in range(n_ctx):
        m = 0
        for j in range(65):
            m += blen[c, j]
        zcnt[c] = np.float64(m)
        cnt[c] = m + outl[0, c] + outl[1, c] + outl[2, c] + outl[3, c]
        zsum[c] = np.float64((zs[0, c] + zs[1, c]) + (zs[2, c] + zs[3, c]))
    return cnt, zsum, zcnt, blen


@jit
def ctx_stats(codes, ctx, n_ctx, outl_flag, use_flag):
    """Per context: number of codes, sum and number of zigzag codes, and the histogram
    of their bit lengths (outliers, the codes equal to ``outl_flag`` when ``use_flag``,
    excluded). Four tables, one per position mod 4: consecutive codes of one context
    would otherwise wait on each other's update (exact: the sums of integer codes below
    2^53 do not depend on the order)."""
    outl = np.zeros((4, n_ctx), np.int64)
    zs = np.zeros((4, n_ctx), np.float64)
    bl = np.zeros((4, n_ctx, 65), np.int64)
    for i in range(codes.size):
        h = i & 3
        c = ctx[i]
        k = np.int64(codes[i])
        if use_flag and k == outl_flag:
            outl[h, c] += 1
        else:
            z = np.uint64((k << 1) ^ (k >> 63))
            zs[h, c] += np.float64(z)
            bl[h, c, bit_length(z)] += 1
    return _fold_stats(bl, zs, outl)


@jit
def ctx_stats_narrow(codes, ctx, n_ctx, outl_flag, use_flag, step, offs):
    """``ctx_stats`` of int32 codes (value predictors: |code| <= KMAX, zigzag codes below
    2^32), of every code (``step`` 1) or of one in every ``step``: in the r-th run of 4 x
    ``step`` codes, its codes o, o + step, o + 2 step and o + 3 step, o = ``offs[r %
    offs.size]`` (``offs.size`` a power of two, its entries below ``step``;
    ``entropy.sample_offsets``; a tail of fewer than 4 x ``step`` codes is left out). The
    sums as integers, which cannot overflow (an integer addition is quicker to wait on
    than a float one), and an outlier counted in a 66th bin of the histogram instead of a
    branch of its own (1.5 -> 1.0-1.1 ns per code). The sums are exact; the float ones
    are the same while each of their four partial sums stays below 2^53 (past that, as
    with 2^25 codes near KMAX in one context, the low bits chosen for a class may differ
    by one: either coding is valid). The two loops are written out in full: with the
    per-code steps in an inlined helper, or every code taken through the sample's index,
    this took 1.2-2x as long; an offset per run of four (not per code) took 0.25 ms for a
    smoke window of 508K codes (per code 0.30, every 3rd code as a strided view 0.21)."""
    zs = np.zeros((4, n_ctx), np.int64)
    bl = np.zeros((4, n_ctx, 66), np.int64)
    if step == 1:
        for i in range(codes.size):
            h = i & 3
            c = ctx[i]
            k = np.int64(codes[i])
            z = np.uint64((k << 1) ^ (k >> 63))
            o = use_flag and k == outl_flag
            b = 65 if o else bit_length(z)
            zs[h, c] += 0 if o else np.int64(z)
            bl[h, c, b] += 1
    else:
        mask = offs.size - 1
        for g4 in range(codes.size // (4 * step)):    # (a tail of under 4 groups left out)
            o4 = 4 * g4 * step + np.int64(offs[g4 & mask])
            for h in range(4):
                i = np.uint64(o4 + h * step)
                c = ctx[i]
                k = np.int64(codes[i])
                z = np.uint64((k << 1) ^ (k >> 63))
                o = use_flag and k == outl_flag
                b = 65 if o else bit_length(z)
                zs[h, c] += 0 if o else np.int64(z)
                bl[h, c, b] += 1
    return _fold_stats(bl, zs, bl[:, :, 65])


@jit
def stream_bytes(blen, cmap, kb):
    """An upper bound on the bytes of the bit stream ``symbolize`` writes: every code's
    low bits, and for the codes whose high part may escape (bit length >= kb + 8), the
    6-bit length and the escaped bits."""
    bits = 0
    for ctxi in range(blen.shape[0]):
        k = kb[cmap[ctxi]]
        for bl in range(65):
            m = blen[ctxi, bl]
            if m:
                bits += m * k
                if bl >= k + 8:
                    bits += m * (6 + bl - k)
    return bits // 8 + 16


@inline
def _put(acc, nacc, v, n):
    """Append the n (<= 64) bits of v (v < 2^n) to a bit writer whose partial word
    ``acc`` holds ``nacc`` (< 64) bits. Returns (acc, nacc, the completed word, whether
    one was completed): the caller stores a completed word as the stream's next one.
    The partial word stays in a register (a read-modify-write of the stream for every
    code, as before, cost about 1 ns per value)."""
    acc |= v << np.uint64(nacc)
    nacc += n
    if nacc >= 64:
        nacc -= 64
        # the bits of v that did not fit: v >> (n - nacc), in two shifts (it may be 64)
        return (v >> np.uint64(1)) >> np.uint64(n - nacc - 1), nacc, acc, True
    return acc, nacc, acc, False


@jit
def symbolize(codes, ctx, outl_flag, use_flag, cmap, kb, n_class, low_bytes):
    """Codes -> (class and symbol of each code, bit stream, counts per class and symbol).
    With ``use_flag``, codes equal to ``outl_flag`` mark outliers. A code's class ``c``
    and symbol ``s`` are one uint16, ``c * ALPHABET + s`` (``n_class`` <= MAX_CLASSES:
    below 2^16), the row of ``rans_encode``'s table: one store here and one load there
    instead of two each (0.5-0.7 ns a code less for the two kernels). The bit stream
    holds, per code, an escape's high part (6-bit length, then the bits) and the class's
    low bits, least significant bit first; ``low_bytes``: its expected size
    (``stream_bytes``). It is returned as 64-bit words (the first ``nbytes`` bytes of
    their little-endian bytes); where ``nbytes`` is more than 8 x (words - 1), it may be
    cut short: call again with ``low_bytes`` = ``nbytes``. (A stream that grew in place,
    reassigned in the loop, made this 2.6x as slow.)"""
    n = codes.size
    sym = np.empty(n, np.uint16)
    low = np.zeros(low_bytes // 8 + 3, np.uint64)
    # two count tables, alternating: consecutive equal symbols would otherwise wait on
    # each other's increment
    counts2 = np.zeros((2, n_class * ALPHABET), np.int64)
    acc = np.uint64(0)
    nacc = 0
    wpos = 0
    lim = low.size - 1          # words past it are counted, not stored (the caller
    #                             calls again with the size returned)
    for i in range(n):
        c = cmap[ctx[i]]
        row = np.int64(c) * ALPHABET
        k = np.int64(codes[i])
        if use_flag and k == outl_flag:
            sym[i] = row + OUT
            counts2[i & 1, row + OUT] += 1
            continue
        z = np.uint64((k << 1) ^ (k >> 63))
        kk = kb[c]
        hi = z >> np.uint64(kk)
        lowbits = z & ((np.uint64(1) << np.uint64(kk)) - np.uint64(1))
        # the low bits are written in each branch, not once after both: the common path
        # then has one write and one branch (0.2-0.8 ns a value faster than one shared
        # write after the escape's)
        if hi < ESC:
            j = row + np.int64(hi)
            sym[i] = j
            counts2[i & 1, j] += 1
            # kk == 0 appends nothing and completes no word: the branch is then never
            # taken (where classes with and without low bits alternate, once per 64 bits)
            acc, nacc, word, full = _put(acc, nacc, lowbits, kk)
            if full:
                if wpos < lim:
                    low[wpos] = word
                wpos += 1
            continue
        sym[i] = row + ESC
        counts2[i & 1, row + ESC] += 1
        e = hi - np.uint64(ESC)
        ln = bit_length(e)
        acc, nacc, word, full = _put(acc, nacc, np.uint64(ln), 6)
        if full:
            if wpos < lim:
                low[wpos] = word
            wpos += 1
        acc, nacc, word, full = _put(acc, nacc, e, ln)
        if full:
            if wpos < lim:
                low[wpos] = word
            wpos += 1
        acc, nacc, word, full = _put(acc, nacc, lowbits, kk)
        if full:
            if wpos < lim:
                low[wpos] = word
            wpos += 1
    if wpos <= lim:
        low[wpos] = acc
    counts = (counts2[0] + counts2[1]).reshape(n_class, ALPHABET)
    return sym, low, (64 * wpos + nacc + 7) // 8, counts


@jit
def normalize(counts):
    """Counts -> frequencies summing to M per used class (every present symbol >= 1)."""
    nc = counts.shape[0]
    freq = np.zeros((nc, ALPHABET), np.int64)
    for c in range(nc):
        tot = 0
        for s in range(ALPHABET):
            tot += counts[c, s]
        if tot == 0:
            freq[c, 0] = M           # an unused class still gets a valid table
            continue
        acc = 0
        best = 0
        bestv = -1
        for s in range(ALPHABET):
            n = counts[c, s]
            if n > 0:
                f = max(1, (n * M + tot // 2) // tot)
                freq[c, s] = f
                acc += f
                if n > bestv:
                    bestv = n
                    best = s
        d = M - acc
        if d >= 0:
            freq[c, best] += d
        else:
            while d < 0:            # take from the largest, keeping every symbol >= 1
                bi = 0
                bv = 0
                for s in range(ALPHABET):
                    if freq[c, s] > bv:
                        bv = freq[c, s]
                        bi = s
                take = min(-d, bv - 1)
                if take <= 0:
                    break
                freq[c, bi] -= take
                d += take
    return freq


@jit
def rans_encode(sym, freq):
    """The codes' class-and-symbol rows (``symbolize``) under ``freq``: two interleaved
    rANS states (even/odd positions), 16-bit words; decoding reads the words front to
    back: two initial states, then renormalisation words. Division by a
    frequency is an exact 64-bit reciprocal multiply (x < 2^32, f < 2^12)."""
    n = sym.size
    nc = freq.shape[0]
    # per class and symbol: the renormalisation threshold f << (32 - PREC), M - f, the
    # cumulative frequency, and ceil(2^64 / f) (0 for f == 1); one row, one cache line
    tab = np.zeros((nc * ALPHABET, 4), np.int64)
    for c in range(nc):
        acc = 0
        for s in range(ALPHABET):
            f = freq[c, s]
            j = c * ALPHABET + s
            tab[j, 0] = f << (32 - PREC)
            tab[j, 1] = M - f
            tab[j, 2] = acc
            if f > 1:
                # ceil(2^64 / f) = floor((2^64 - 1) / f) + 1 for f not a power of two
                q = np.uint64(0xFFFFFFFFFFFFFFFF) // np.uint64(f)
                tab[j, 3] = np.int64(q + np.uint64(1))
            acc += f
    buf = np.empty(n + 8, np.uint16)
    pos = buf.size
    x0 = np.int64(RANS_L)
    x1 = np.int64(RANS_L)
    i = n - 1
    if i >= 0 and (i & 1) == 0:          # the last symbol is even: it goes with x0
        j = np.uint64(sym[i])
        x0, w, big = _rans_put(x0, tab[j, 0], tab[j, 1], tab[j, 2], tab[j, 3])
        buf[np.uint64(pos - 1)] = w
        pos -= 1 if big else 0
        i -= 1
    while i >= 1:                        # (odd, even) pairs from the end
        j1 = np.uint64(sym[i])
        j0 = np.uint64(sym[i - 1])
        x1, w, big = _rans_put(x1, tab[j1, 0], tab[j1, 1], tab[j1, 2], tab[j1, 3])
        buf[np.uint64(pos - 1)] = w
        pos -= 1 if big else 0
        x0, w, big = _rans_put(x0, tab[j0, 0], tab[j0, 1], tab[j0, 2], tab[j0, 3])
        buf[np.uint64(pos - 1)] = w
        pos -= 1 if big else 0
        i -= 2
    pos -= 4
    buf[pos] = (x0 >> 16) & 0xFFFF
    buf[pos + 1] = x0 & 0xFFFF
    buf[pos + 2] = (x1 >> 16) & 0xFFFF
    buf[pos + 3] = x1 & 0xFFFF
    return buf[pos:].copy()


@inline
def _rans_put(x, thr, mf, cum, r):
    """Encode a symbol into state x (scalars only: an array passed to an inlined helper
    costs reference-count updates). Returns (state, the low 16 bits of the state before,
    whether they are emitted): renormalise while x >= thr = f << (32 - PREC) (at most
    once), then x = M * (x // f) + x % f + cum, written x + (x // f) * (M - f) + cum, one
    multiplication fewer after the quotient (x // f = the high half of x * r; x itself
    for f == 1, whose r is 0)."""
    big = x >= thr
    w = x & 0xFFFF
    x = (x >> 16) if big else x
    q = np.int64(mulhi(np.uint64(x), np.uint64(r))) if mf != M - 1 else x
    return x + q * mf + cum, w, big


@inline
def _varint(buf, p):
    """One unsigned varint of ``buf`` from byte p: (value, next p, ok). A value of 2^63 or
    more reads as a negative one (the callers refuse negative counts and frequencies),
    including one past 2^64, whose high bits were once dropped (2^64 read as 0)."""
    v = np.uint64(0)
    sh = 0
    nb = buf.size
    while True:
        if p >= nb or sh > 63:
            return np.int64(v), p, False
        b = np.uint64(buf[p])
        p += 1
        if sh == 63 and (b & np.uint64(0x7E)) != np.uint64(0):
            v = np.uint64(0xFFFFFFFFFFFFFFFF)       # past 2^64: -1
        v |= (b & np.uint64(0x7F)) << np.uint64(sh)
        sh += 7
        if b < np.uint64(0x80):
            return np.int64(v), p, True


MODEL_OK, MODEL_TRUNCATED, MODEL_INCONSISTENT = 0, 1, 2


@jit
def model_tables(raw, n_class):
    """A window's model body (``n_class`` low-bit counts, then per class the number of
    symbols it codes and their frequencies, as varints) -> (low bits per class, and the
    flat tables of the fused decoders: ``lut[c * M + slot]`` the symbol, ``fc[c *
    ALPHABET + s]`` = freq << FC_SHIFT | cumulative freq; status): MODEL_OK, MODEL_TRUNCATED,
    or MODEL_INCONSISTENT (what no coder writes: a class whose frequencies do not sum to
    M, more than 62 low bits or ALPHABET symbols, bytes left over). One pass in one call
    (in numpy steps and three calls, about 100 us more a window)."""
    # every entry is written when the status is MODEL_OK (the frequencies of a class
    # cover its M slots, and its ALPHABET symbols are all set); not read otherwise
    kbs = np.zeros(max(n_class, 1), np.int64)
    lut = np.empty(max(n_class, 1) * M, np.uint8)
    fc = np.empty(max(n_class, 1) * ALPHABET, np.uint32)
    if raw.size < n_class:
        return kbs, lut, fc, MODEL_TRUNCATED
    nsym = np.zeros(max(n_class, 1), np.int64)
    p = n_class
    bad = False
    for c in range(n_class):
        kbs[c] = raw[c]
        v, p, ok = _varint(raw, p)
        if not ok:
            return kbs, lut, fc, MODEL_INCONSISTENT
        nsym[c] = v
        bad = bad or kbs[c] > 62 or v > ALPHABET or v < 0
    if bad:
        return kbs, lut, fc, MODEL_INCONSISTENT
    for c in range(n_class):
        acc = 0
        for s in range(nsym[c]):
            f, p, ok = _varint(raw, p)
            if not ok:
                return kbs, lut, fc, MODEL_TRUNCATED
            if f < 0 or f > M - acc:        # not acc + f > M: f may be near 2^63
                bad = True
            elif not bad:
                fc[np.uint64(c * ALPHABET + s)] = (f << FC_SHIFT) | acc
                # unsigned indices: no test for negative ones, so the loop compiles to
                # a fill (a slice assignment, or signed indices: 1.5-1.8x the time of
                # this function on iris's windows at 1e-4, 50-75 us a window)
                b0 = c * M + acc
                sv = np.uint8(s)
                for k in range(f):
                    lut[np.uint64(b0 + k)] = sv
                acc += f
        for s in range(nsym[c], ALPHABET):
            fc[np.uint64(c * ALPHABET + s)] = acc      # (never read: no slot maps to them)
        bad = bad or acc != M
    if bad or p != raw.size:
        return kbs, lut, fc, MODEL_INCONSISTENT
    return kbs, lut, fc, MODEL_OK


@jit
def estimate_bits(codes, ctx, n_ctx, cmap, n_class, kb, outl_flag, use_flag, outl_bits,
                  zcnt):
    """Estimated length in bits of coding ``codes`` under ``ctx`` (``zcnt``: the number
    of codes of each context that are not outliers, from ``ctx_stats``) with classes
    ``cmap`` and low bits ``kb``: the empirical entropy of each class's symbols, its raw
    low bits, escapes, outliers and the tables."""
    counts = np.zeros((n_class, ALPHABET), np.int64)
    # the raw bits as integers, the low bits from the counts per context: no float sum
    # from value to value (the same value: every term is an integer below 2^53)
    n_out = 0
    raw = 0
    for i in range(codes.size):
        c = cmap[ctx[i]]
        k = np.int64(codes[i])
        if use_flag and k == outl_flag:
            counts[c, OUT] += 1
            n_out += 1
            continue
        z = np.uint64((k << 1) ^ (k >> 63))
        hi = z >> np.uint64(kb[c])
        if hi >= ESC:
            counts[c, ESC] += 1
            raw += 6 + bit_length(hi - np.uint64(ESC))
        else:
            counts[c, hi] += 1
    for j in range(n_ctx):
        raw += kb[cmap[j]] * np.int64(zcnt[j])
    bits = n_out * outl_bits + np.float64(raw)
    for c in range(n_class):
        tot = 0
        used = 0
        for s in range(ALPHABET):
            tot += counts[c, s]
        for s in range(ALPHABET):
            n = counts[c, s]
            if n > 0:
                used += 1
                bits -= n * math.log2(n / tot)
        bits += 10.0 * used + 24.0
    return bits


@jit
def varint_encode(vals):
    out = np.empty(vals.size * 10 + 1, np.uint8)
    p = 0
    for i in range(vals.size):
        v = np.uint64(vals[i])
        while v >= np.uint64(0x80):
            out[p] = np.uint8((v & np.uint64(0x7F)) | np.uint64(0x80))
            p += 1
            v >>= np.uint64(7)
        out[p] = np.uint8(v)
        p += 1
    return out[:p].copy()
