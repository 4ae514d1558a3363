"""Entropy coding of a window's codes: the model (contexts merged into classes, low bits
and a 12-bit frequency table per class) and its streams, packed into bytes and back.

The coding itself is compiled (``kernels.entropy``); decoding is fused into the
predictor kernels, which take the flat tables of ``Tables``. Every stream is validated
on the way in, so a damaged one raises ``CorruptFileError`` or decodes to values that the
window checksum rejects, never anything worse.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .errors import CorruptFileError
from .kernels import entropy as K
from .kernels.consts import ALPHABET, FLAG, RANS_L
from .kernels.core import words64
from .payload import PROBE_BYTES
from .zstd_util import unzstd_at_most, zstd

_MODEL_HEAD = struct.Struct("<HB")
# zstd level of the entropy model: level 9 makes it 5-14% smaller than level 3, for a
# few us more up to 2 KB (raw), but 120-300 us more at 4-10 KB with the encoder's caches
# cold (up to 3% of encoding, for under 0.1% of the shared stacks' files). So level 9 up
# to _MODEL_CHEAP bytes, and up to _MODEL_SMALL where the model is at least
# 1/_MODEL_SHARE of its window's streams (small windows: a 3 KB file was 0.7% larger with
# level 3); level 3 otherwise
_MODEL_CHEAP = 2048
_MODEL_SMALL = 4096
_MODEL_SHARE = 16


@dataclass
class Streams:
    """The coded form of a window's codes: model, rANS words, bit stream (escapes and
    raw low bits)."""

    model: bytes
    words: bytes
    low: bytes
    low_stored: tuple[bytes, int] | None = None    # ``low`` as the payload stores it
    #                                                (``encode``'s ``store``), if known


STATS_CODES = 1 << 17    # the model's classes and low bits are chosen from one code in
STATS_STEP = 4           # every ``_stats_step`` (``sample_offsets``) where that leaves at
#                          least this many codes, from every code otherwise: the
#                          statistics' pass over the codes was a seventh of encoding smoke
#                          at 1e-3 (0.62 ms of a window of 540,672 codes). The frequencies
#                          are still counted on every code (``symbolize``). On the shared
#                          stacks at 1e-2..1e-4: encoding 1.04-1.08x as fast as with every
#                          code's statistics, the files 0.9994-1.0003x the size


def sample_offsets(step: int, n: int = 4096) -> np.ndarray:
    """Where the model's statistics take their codes (``ctx_stats_narrow``): in each run
    of 4 x ``step`` codes, every ``step``-th from a place below ``step`` that a hash of
    the run's index chooses (splitmix64's finalizer; ``n`` runs, then again). A sample
    that no period of the data lines up with and that covers every row alike. Every
    ``step``-th code lined up with data periodic in a few codes (the second break-test's
    uint16 stack, every other pixel 65535: 1.61x the size of its file with every code's
    statistics; now 1.00x); blocks of 1024 codes, one of every ``step`` at a hashed
    place, missed or doubled rows that come once a frame (the third's stack of 64 x 1024
    frames whose first rows are noise: 1.035x; now 1.0005x)."""
    x = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return (x % np.uint64(step)).astype(np.uint8)


_OFFSETS = {s: sample_offsets(s, 4096 if s > 1 else 1) for s in range(1, STATS_STEP + 1)}


REFINE_CODES = 1 << 16    # about as many codes as fewer low bits are priced on (``refine_kb``)


@functools.cache
def _offsets(step: int) -> np.ndarray:
    return _OFFSETS[step] if step in _OFFSETS else sample_offsets(step)


def _stats_step(n: int) -> int:
    return max(1, min(STATS_STEP, n // STATS_CODES))


def encode(codes: np.ndarray, ctx: np.ndarray, n_ctx: int, groups: np.ndarray,
           outliers: bool = True, store: Store | None = None) -> Streams:
    """Code ``codes`` (int32 with FLAG for outliers, or int64 residuals when ``outliers``
    is False) under contexts ``ctx`` (uint8, < n_ctx). ``store``: how the payload stores
    a bit stream (``payload.store``: its bytes, zstd-compressed or not, and the raw size
    if compressed, else 0); where given, the streams may come with the bit stream's
    stored form (``Streams.low_stored``)."""
    cnt, zsum, zcnt, blen = _model_stats(codes, ctx, n_ctx, outliers)
    cmap, n_class = K.class_map(cnt, groups)
    rule = K.choose_kb(zsum, zcnt, cmap, n_class)
    kb = _fewer_low_bits(codes, ctx, cmap, n_class, rule, blen, outliers)
    sym, low, counts = _symbols(codes, ctx, cmap, kb, n_class, blen, outliers)
    if store is not None and kb is not rule and _may_compress(
            store, codes, ctx, cmap, rule, n_class, outliers):
        # fewer low bits are priced as if raw low bits never compressed; on periodic data
        # (checkerboards) the mean rule's do where the payload is stored (zstd), and code
        # smaller: a break-test's checkerboard stacks coded 1.31x as large with the
        # fewer. Where the payload may store the mean rule's bit stream compressed, both
        # are coded, the smaller kept
        rsym, rlow, rcounts = _symbols(codes, ctx, cmap, rule, n_class, blen, outliers)
        rst = store(rlow)
        if rst[1]:
            mine = _finish(cmap, kb, sym, low, counts, store(low))
            alt = _finish(cmap, rule, rsym, rlow, rcounts, rst)
            return min(mine, alt, key=_stored_bytes)
    return _finish(cmap, kb, sym, low, counts)


Store = Callable[[bytes], tuple[bytes, int]]
_PROBE_CODES = 1 << 16    # a large window's first codes, coded with the mean rule's low
#                           bits to ask whether its bit stream would be stored compressed
_PROBE_BYTES = PROBE_BYTES    # the payload compresses a stream up to 2 x this whole, a
#                               longer one where its first _PROBE_BYTES compress
#                               (``payload.store``)


def _may_compress(store: Store, codes: np.ndarray, ctx: np.ndarray, cmap: np.ndarray,
                  kb: np.ndarray, n_class: int, outliers: bool) -> bool:
    """Whether the payload may store the bit stream of ``codes`` with low bits ``kb``
    compressed, asked as the payload decides (``payload.store``): a stream of up to 32
    KB is compressed whole, a longer one where its first 16 KB compress. A probe of a
    large window's first codes said no where the payload said yes: a stream whose first
    16 KB compress just by 3% and whose first 32 KB do not (a break-test's stack,
    periodic in its middle only: 1.02x the mean rule's size), and a stream of under 32
    KB whose first codes are noise (1.013x)."""
    n = codes.size
    m = min(n, _PROBE_CODES)
    while True:
        low = _probe(codes[:m], ctx[:m], cmap, kb, n_class, outliers)
        if len(low) > 2 * _PROBE_BYTES:     # over 32 KB: the test on its first 16 KB
            return store(low[:_PROBE_BYTES])[1] != 0
        if m == n:                          # all of it, up to 32 KB
            return store(low)[1] != 0
        # more codes: all where the stream may be short (up to 48 KB, at the rate of the
        # first m), else as many as should give 48 KB
        m = n if len(low) * (n / m) <= 3 * _PROBE_BYTES else min(
            n, int(m * 3 * _PROBE_BYTES / max(len(low), 1)) + 1)


def _probe(codes: np.ndarray, ctx: np.ndarray, cmap: np.ndarray, kb: np.ndarray,
           n_class: int, outliers: bool) -> bytes:
    """The bit stream of ``codes``, up to 2 x _PROBE_BYTES + 1 bytes (a buffer sized for
    the whole window, as ``_symbols`` takes, cost its clearing: 3-4 ms a probe of a
    window of 2M codes)."""
    cap = 2 * _PROBE_BYTES + 1
    _, low, nbytes, _ = K.symbolize(codes, ctx, FLAG, outliers, cmap, kb, n_class, cap + 8)
    return low.view(np.uint8)[:min(nbytes, cap)].tobytes()


def _stored_bytes(s: Streams) -> int:
    assert s.low_stored is not None
    return len(s.model) + len(s.words) + len(s.low_stored[0])


def _symbols(codes: np.ndarray, ctx: np.ndarray, cmap: np.ndarray, kb: np.ndarray,
             n_class: int, blen: np.ndarray,
             outliers: bool) -> tuple[np.ndarray, bytes, np.ndarray]:
    """(class-and-symbol of each code, the bit stream, counts per class and symbol)."""
    # the bit stream's expected size, from every few codes' bit lengths: twice that
    # (untouched, the rest of a large buffer costs no memory)
    sym, low, nbytes, counts = K.symbolize(codes, ctx, FLAG, outliers, cmap, kb, n_class,
                                           2 * K.stream_bytes(blen, cmap, kb) + 4096)
    if nbytes > 8 * (low.size - 1):     # the bit stream outgrew it (codes the sampled
        #                                 ones did not foretell): once more, with its size
        sym, low, nbytes, counts = K.symbolize(codes, ctx, FLAG, outliers, cmap, kb,
                                               n_class, nbytes)
    return sym, low.astype("<u8", copy=False).view(np.uint8)[:nbytes].tobytes(), counts


def _finish(cmap: np.ndarray, kb: np.ndarray, sym: np.ndarray, low: bytes,
            counts: np.ndarray, low_stored: tuple[bytes, int] | None = None) -> Streams:
    freq = K.normalize(counts)
    words = K.rans_encode(sym, freq)
    return Streams(_pack_model(cmap, kb, freq, 2 * words.size + len(low)),
                   words.astype("<u2").tobytes(), low, low_stored)


def low_bits(codes: np.ndarray, ctx: np.ndarray, cmap: np.ndarray, n_class: int,
             zsum: np.ndarray, zcnt: np.ndarray, blen: np.ndarray,
             outliers: bool = True) -> np.ndarray:
    """The raw low bits of each class: from its mean code (``choose_kb``), but fewer where
    the class mixes small codes with large ones and its codes, priced exactly, code
    smaller with fewer (``propose_kb``, ``refine_kb``; ``estimate_bits`` prices the mean
    rule's)."""
    return _fewer_low_bits(codes, ctx, cmap, n_class, K.choose_kb(zsum, zcnt, cmap, n_class),
                           blen, outliers)


def _fewer_low_bits(codes: np.ndarray, ctx: np.ndarray, cmap: np.ndarray, n_class: int,
                    rule: np.ndarray, blen: np.ndarray, outliers: bool) -> np.ndarray:
    """``rule`` itself where no class takes fewer low bits, or where they save under
    MIN_SAVING of the window's bits (roughly: ``_rough_bits``), else a new array. On
    the shared stacks at 1e-4, classes switched for 0.05-0.35% of a window, and the
    probes and both codings that a switch brings (``encode``) made encoding iris and
    smoke 1.10-1.12x as slow (with MIN_SAVING and REFINE_CODES: 1.01-1.02x)."""
    cand, some = K.propose_kb(blen, cmap, n_class, rule)
    if some:
        # priced on about REFINE_CODES codes (a window of 2M codes priced on every 4th
        # took 3.3 ms, a third of its entropy coding; a smoke window's 540K on every
        # 4th 0.2 ms, 1.5% of encoding smoke)
        step = max(1, min(64, codes.size // REFINE_CODES))
        kb, saved = K.refine_kb(codes, ctx, cmap, rule, cand, FLAG, outliers, step,
                                _offsets(step))
        if saved * step >= MIN_SAVING * _rough_bits(blen):
            return kb
    return rule


MIN_SAVING = 0.01


def _rough_bits(blen: np.ndarray) -> float:
    """A window's bits, roughly, from its codes' bit lengths per context (``blen``):
    each code's bits past the leading one, and the entropy of the bit lengths in its
    context. (log2 of the context's mean code + 1 a code overestimated a window of
    mostly 0s 18x, and the 1% rule threw away a 23% saving.)"""
    b = blen.astype(np.float64)
    n = b.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.nansum(np.where(b > 0, b * np.log2(b / n), 0.0))
    raw = float((b[:, 1:] @ np.arange(0, b.shape[1] - 1, dtype=np.float64)).sum())
    return float(ent) + raw


def estimate_bits(codes: np.ndarray, ctx: np.ndarray, n_ctx: int, groups: np.ndarray,
                  outlier_bits: float, outliers: bool = True) -> float:
    """Estimated coded size in bits (to rank candidates without coding), with the mean
    rule's low bits (``K.choose_kb``): ``encode`` takes fewer only where they code
    smaller (``low_bits``), so this is what ``encode`` codes or more. Pricing the fewer
    here too ranked the tuning's candidates differently where its sample tiles' edges
    make classes of small and large codes: encoding smoke at 1e-3 took 1.1x as long (a
    finalist more) for the same file, and 6 of a break-test's 1,514 files were larger
    (up to 1.11x; configurations ranked on a price that cannot see what zstd makes of
    the bit stream). It did find better predictors for a detector-like uint16 stack
    (dead and hot columns, 2% saturated pixels: 0.70x the size at abs 4, against 0.83x
    now)."""
    cnt, zsum, zcnt, _ = _model_stats(codes, ctx, n_ctx, outliers)
    cmap, n_class = K.class_map(cnt, groups)
    return float(K.estimate_bits(codes, ctx, n_ctx, cmap, n_class,
                                 K.choose_kb(zsum, zcnt, cmap, n_class), FLAG, outliers,
                                 outlier_bits, zcnt))


def _model_stats(codes: np.ndarray, ctx: np.ndarray, n_ctx: int,
                 outliers: bool) -> tuple[np.ndarray, ...]:
    """``_ctx_stats`` of one code in every ``_stats_step`` (``sample_offsets``), every
    statistic scaled to the whole window: ``class_map`` compares the counts with a size,
    ``estimate_bits`` counts the raw low bits from the numbers of codes, and the
    bit-length histogram sizes the bit stream's first buffer. Only for the int32 codes of
    the value predictors (|code| <= KMAX: an escaped high part is under 2^32, its 6-bit
    length always fits); the bit-exact predictors' int64 codes go up to 2^64, and a
    class whose low bits were chosen on codes that missed its largest would escape one
    of 64 bits (the break-test's float64 lossless stack, refused by its decoder). Those
    keep every code's statistics."""
    step = _stats_step(codes.size) if codes.dtype == np.int32 else 1
    if step == 1:
        return _ctx_stats(codes, ctx, n_ctx, outliers)
    cnt, zsum, zcnt, blen = K.ctx_stats_narrow(codes, ctx, n_ctx, FLAG, outliers, step,
                                               _OFFSETS[step])
    return cnt * step, zsum * step, zcnt * step, blen * step


def _ctx_stats(codes: np.ndarray, ctx: np.ndarray, n_ctx: int,
               outliers: bool) -> tuple[np.ndarray, ...]:
    """Per-context statistics of every code (``kernels.entropy.ctx_stats``), summed as
    integers where the codes are those of a value predictor (int32: no sum can
    overflow)."""
    if codes.dtype == np.int32:
        return K.ctx_stats_narrow(codes, ctx, n_ctx, FLAG, outliers, 1, _OFFSETS[1])
    return K.ctx_stats(codes, ctx, n_ctx, FLAG, outliers)


def _pack_model(cmap: np.ndarray, kb: np.ndarray, freq: np.ndarray, streams: int) -> bytes:
    """The model's bytes; ``streams``: the bytes of the streams it goes with."""
    n_class = freq.shape[0]
    head = _MODEL_HEAD.pack(cmap.size, n_class) + cmap.astype(np.uint8).tobytes()
    # per class, its frequencies up to the last used symbol, all classes in one call (a
    # call per class cost 0.1-0.3 ms a window on models of 30-50 classes)
    used = freq != 0
    nsym = np.where(used.any(axis=1), freq.shape[1] - np.argmax(used[:, ::-1], axis=1), 0)
    rows = freq[np.arange(freq.shape[1]) < nsym[:, None]]
    raw = b"".join([kb.astype(np.uint8).tobytes(), K.varint_encode(nsym).tobytes(),
                    K.varint_encode(rows).tobytes()])
    best = len(raw) <= _MODEL_CHEAP or (len(raw) <= _MODEL_SMALL
                                        and _MODEL_SHARE * len(raw) >= streams)
    return head + zstd(raw, 9 if best else 3)


@dataclass
class Tables:
    """What the fused decoders take."""

    cmap: np.ndarray     # uint8 [n_ctx]
    kbs: np.ndarray      # int64 [n_class]
    lut: np.ndarray      # uint8 [n_class * M]
    fc: np.ndarray       # uint32 [n_class * ALPHABET]: freq << FC_SHIFT | cumulative
    words: np.ndarray    # uint16, then ``run_pad`` + 2 zeros (see ``tables``)
    low: np.ndarray      # the bit stream as uint64 words (``kernels.core.words64``), then
    #                      3 ``run_pad`` zeros
    low_len: int         # bytes in the bit stream
    n_words: int         # 16-bit words in the rANS stream (``words`` without its padding)
    run_pad: int         # the padding's run length
    st: np.ndarray = field(default_factory=lambda: np.zeros(8, np.int64))
    # decoder state, updated by the kernels: x0, x1, word pos, bit pos, run_pad (read),
    # -, -, outlier pos

    def __post_init__(self) -> None:
        w = self.words
        if (w.size < self.n_words + self.run_pad + 2
                or self.low.size < (self.low_len + 7) // 8 + 2 + 3 * self.run_pad):
            raise ValueError("streams shorter than their padding")
        self.st[0] = (int(w[0]) << 16) | int(w[1])
        self.st[1] = (int(w[2]) << 16) | int(w[3])
        self.st[2] = 4
        self.st[4] = self.run_pad

    def check_end(self) -> None:
        """After decoding: every stream consumed exactly, the rANS states back where the
        encoder started (a damaged stream overruns, stops short or ends elsewhere)."""
        st = self.st
        nbits_left = 8 * self.low_len - int(st[3])
        if (int(st[2]) != self.n_words or int(st[0]) != RANS_L or int(st[1]) != RANS_L
                or not 0 <= nbits_left < 8):
            raise CorruptFileError("entropy-coded streams do not match the data they code")


def tables(s: Streams, n_ctx: int, run_pad: int) -> Tables:
    """Parse and validate a window's model and streams. ``run_pad``: the most points a
    fused decoder takes between bounds on its stream positions (``kernels.core.
    run_start``: min(frame width, RUN_CHUNK); 0 for decoders that bound every read);
    the streams are padded with zeros for it (about 26 bytes a point)."""
    m = s.model
    if len(m) < _MODEL_HEAD.size:
        raise CorruptFileError("truncated entropy model")
    nc, n_class = _MODEL_HEAD.unpack_from(m)
    if nc != n_ctx or n_class < 1 or len(m) < _MODEL_HEAD.size + nc:
        raise CorruptFileError("inconsistent entropy model")
    cmap = np.frombuffer(m, np.uint8, nc, _MODEL_HEAD.size).copy()
    if cmap.max() >= n_class:
        raise CorruptFileError("inconsistent entropy model")
    body = unzstd_at_most(m[_MODEL_HEAD.size + nc:], n_class * (1 + 10 + ALPHABET * 3),
                          "entropy model")
    kbs, lut, fc, status = K.model_tables(np.frombuffer(body, np.uint8), n_class)
    if status == K.MODEL_TRUNCATED:
        raise CorruptFileError("truncated entropy model")
    if status != K.MODEL_OK:
        raise CorruptFileError("inconsistent entropy model")
    if len(s.words) % 2 or len(s.words) < 8:
        raise CorruptFileError("truncated entropy-coded data")
    n_words = len(s.words) // 2
    words = np.zeros(n_words + run_pad + 2, np.uint16)
    words[:n_words] = np.frombuffer(s.words, "<u2")
    return Tables(cmap, kbs, lut, fc, words, words64(s.low, 3 * run_pad), len(s.low),
                  n_words, run_pad)
