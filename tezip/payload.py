"""A window's payload (format v2), packed and unpacked in one place.

Layout: ``u32 meta length | meta (JSON) | sections back to back``. The meta record names
the predictor and its configuration, the frame count, the section sizes, which sections
are zstd-compressed (their raw sizes, 0 for stored as is), the number of outliers, the
CRC-32 of the reconstruction and, for learned predictors, the model hash and the CRC-32
of the forecasts.

Sections, in order: the entropy model, the rANS words, the bit stream (escapes and raw
low bits), the outliers' exact values (native dtype, little-endian, in coding order), the sign and
zero masks (point-wise relative mode; the fill mask of ``shuffle``), the byte planes of
``shuffle`` (its own zstd frames). Unused sections are empty. The last section is newer
than the others: a payload without it lists five sizes (every payload written before it,
and every one that leaves it empty, so those bytes did not change).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

from .errors import CorruptFileError
from .zstd_util import unzstd_exact, zstd

SECTIONS = ("model", "words", "low", "outliers", "masks", "planes")
_BASE = 5                 # sections every payload lists; the later ones only when used
_COMPRESSIBLE = {"low", "outliers", "masks"}
PROBE_BYTES = 1 << 14     # the raw low bits are near uniform by design: a stream of over
#                           2 x this is compressed only if its first PROBE_BYTES compress (on
#                           the shared stacks no stream above 4 KB ever shrank, and trying
#                           cost up to 0.8 ms a window; ``entropy`` asks the same question)
_META_LEN = struct.Struct("<I")
MAX_META = 1 << 16


@dataclass
class Payload:
    meta: dict
    sections: dict[str, bytes]


def pack(meta: dict, sections: dict[str, bytes],
         stored: dict[str, tuple[bytes, int]] | None = None) -> bytes:
    """``stored``: sections already in their stored form (``store``), by name."""
    parts, raw = [], []
    used = max([_BASE] + [i + 1 for i, n in enumerate(SECTIONS) if sections.get(n)])
    for name in SECTIONS[:used]:
        data, size = (stored[name] if stored and name in stored
                      else store(name, sections.get(name, b"")))
        parts.append(data)
        raw.append(size)
    meta = {**meta, "s": [len(p) for p in parts], "z": raw}
    mb = json.dumps(meta, separators=(",", ":"), allow_nan=False).encode()
    if len(mb) > MAX_META:
        raise ValueError("window metadata too large")
    return _META_LEN.pack(len(mb)) + mb + b"".join(parts)


def store(name: str, data: bytes) -> tuple[bytes, int]:
    """Section ``name`` holding ``data`` as a payload stores it: (its bytes,
    zstd-compressed where that saves 3%; its raw size then, else 0)."""
    if name in _COMPRESSIBLE and len(data) >= 64 and (
            name != "low" or len(data) <= 2 * PROBE_BYTES
            or len(zstd(data[:PROBE_BYTES], 3)) < 0.97 * PROBE_BYTES):
        z = zstd(data, 3)
        if len(z) < 0.97 * len(data):
            return z, len(data)
    return data, 0


def peek_meta(payload: bytes) -> dict:
    """The meta record only (``tezip info``)."""
    return _meta(payload)[0]


def _meta(payload: bytes) -> tuple[dict, int]:
    if len(payload) < _META_LEN.size:
        raise CorruptFileError("truncated window")
    (mlen,) = _META_LEN.unpack_from(payload)
    if mlen > MAX_META or _META_LEN.size + mlen > len(payload):
        raise CorruptFileError("bad window metadata length")
    try:
        meta = json.loads(payload[_META_LEN.size:_META_LEN.size + mlen],
                          parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError):
        raise CorruptFileError("bad window metadata") from None
    if not isinstance(meta, dict):
        raise CorruptFileError("bad window metadata")
    return meta, _META_LEN.size + mlen


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} in window metadata")


def unpack(payload: bytes, limits: dict[str, int]) -> Payload:
    """Split a payload into its meta record and (decompressed) sections; ``limits``: the
    largest raw size each section may have for this window (a damaged size is refused
    before anything is allocated)."""
    meta, pos = _meta(payload)
    try:
        sizes = [int(v) for v in meta["s"]]
        raw = [int(v) for v in meta["z"]]
    except (KeyError, TypeError, ValueError, OverflowError):
        raise CorruptFileError("bad window metadata") from None
    if (not _BASE <= len(sizes) <= len(SECTIONS) or len(raw) != len(sizes) or min(sizes) < 0
            or min(raw) < 0 or pos + sum(sizes) != len(payload)
            or (len(sizes) > _BASE and sizes[-1] == 0)):
        raise CorruptFileError("window metadata does not match its payload")
    sections = dict.fromkeys(SECTIONS, b"")
    for name, size, rsize in zip(SECTIONS, sizes, raw, strict=False):
        data = payload[pos:pos + size]
        pos += size
        limit = limits.get(name, math.inf)
        if rsize:
            if name not in _COMPRESSIBLE or rsize > limit:
                raise CorruptFileError(f"bad size of the {name} section")
            data = unzstd_exact(data, rsize)
        elif size > limit:
            raise CorruptFileError(f"bad size of the {name} section")
        sections[name] = data
    return Payload(meta, sections)
