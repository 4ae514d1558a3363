"""The decoder's fuzz target, shared by tests/test_fuzz.py (a fixed budget in every test
run) and benchmarks/fuzz_decoder.py (as long as you like).

``check(blob, reference)`` decodes a possibly damaged .tez image and returns "error" (a
TezipError was raised) or "ok" (it decoded to exactly ``reference``); any other outcome
(another exception, different data without an error, an allocation beyond
``MEMORY_LIMIT``) raises AssertionError or propagates the exception."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np

import tezip

FIXTURES = Path(__file__).parent / "fixtures"
MEMORY_LIMIT = 64 << 20     # the seeds are a few kB; a decoder may not allocate 64 MB for them


def seeds(learned: bool = True, versions: str = "v*") -> list[tuple[str, bytes, np.ndarray]]:
    out = []
    for p in sorted(FIXTURES.glob(f"{versions}/*.tez")):
        if not learned and "prednet" in p.stem:
            continue
        out.append((f"{p.parent.name}/{p.stem}", p.read_bytes(), np.load(p.with_suffix(".npy"))))
    return out


def mutate(blob: bytes, rng: np.random.Generator) -> bytes:
    """One to three random mutations of the kinds that damage files in practice."""
    b = bytearray(blob)
    for _ in range(int(rng.integers(1, 4))):
        kind = int(rng.integers(0, 7))
        n = len(b)
        if n == 0:
            break
        i = int(rng.integers(0, n))
        if kind == 0:                                   # flip bits of one byte
            b[i] ^= int(rng.integers(1, 256))
        elif kind == 1:                                 # truncate
            del b[i:]
        elif kind == 2:                                 # insert random bytes
            b[i:i] = rng.integers(0, 256, int(rng.integers(1, 16)), np.uint8).tobytes()
        elif kind == 3:                                 # delete a run
            del b[i:i + int(rng.integers(1, 32))]
        elif kind == 4:                                 # overwrite a run with random bytes
            k = int(rng.integers(1, 32))
            b[i:i + k] = rng.integers(0, 256, min(k, n - i), np.uint8).tobytes()
        elif kind == 5:                                 # duplicate a run elsewhere
            j = int(rng.integers(0, n))
            b[j:j] = b[i:i + int(rng.integers(1, 64))]
        else:                                           # an extreme integer somewhere
            v = rng.choice([0, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000]).item()
            b[i:i + 4] = int(v).to_bytes(4, "little")[: max(0, min(4, n - i))]
    return bytes(b)


def _decode(blob: bytes, limit: int) -> tuple[np.ndarray, tuple, np.dtype] | None:
    """Decode ``blob`` whole: None on a TezipError, else (array, declared shape, dtype);
    AssertionError if the decoder's peak allocation passed ``limit`` bytes."""
    tracemalloc.start()
    try:
        try:
            with tezip.open(blob) as f:
                got = f.read_all(), tuple(f.shape), f.dtype
        except tezip.TezipError:
            return None
        finally:
            peak = tracemalloc.get_traced_memory()[1]
        assert peak <= limit, f"decoder allocated {peak} bytes for a {len(blob)}-byte file"
    finally:
        tracemalloc.stop()
    return got


def check(blob: bytes, reference: np.ndarray) -> str:
    decoded = _decode(blob, MEMORY_LIMIT)
    if decoded is None:
        return "error"
    got = decoded[0]
    assert got.dtype == reference.dtype and got.shape == reference.shape, \
        "a damaged file decoded without error to another shape or dtype"
    assert got.tobytes() == reference.tobytes(), "a damaged file decoded to different data"
    return "ok"


CRAFTED_MEMORY_LIMIT = 4 << 30   # a valid header may declare windows of up to 2**27 values


def _leaves(obj: object, path: tuple = ()) -> list[tuple]:
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _leaves(v, (*path, k))]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in _leaves(v, (*path, i))]
    return [path]


def reseal(blob: bytes, edit) -> bytes:
    """Rewrite a .tez image with ``edit(header, entries, payloads)`` applied (lists and a
    dict it may change in place), every container checksum recomputed."""
    import copy
    import io

    from tezip.container import ContainerReader, ContainerWriter

    r = ContainerReader(blob)
    header = copy.deepcopy(r.header)
    entries = list(r.entries)
    payloads = [r.payload(i) for i in range(len(entries))]
    version, model = r.version, r.model_bytes
    r.close()
    edit(header, entries, payloads)
    buf = io.BytesIO()
    w = ContainerWriter(None, header, fileobj=buf, check=False, version=version)  # crafted
    for e, p in zip(entries, payloads, strict=True):
        w.add_window(e.t0, e.frames, p)
    w.close(model)
    return buf.getvalue()


def set_leaf(obj: dict, path: tuple, value: object) -> None:
    node = obj
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value


def craft(blob: bytes, rng: np.random.Generator) -> bytes:
    """A file damaged *and resealed*: one window payload mutated, or one header field or
    index entry set to an extreme value, then every checksum of the container recomputed,
    as an attacker (or a buggy writer) would. Only the decoder's own checks stand."""
    kind = int(rng.integers(0, 10))

    def edit(header: dict, entries: list, payloads: list) -> None:
        if kind < 6:                                           # a window's bytes
            i = int(rng.integers(0, len(payloads)))
            payloads[i] = mutate(payloads[i], rng)
        elif kind < 9:                                         # a header value
            leaves = _leaves(header)
            path = leaves[int(rng.integers(0, len(leaves)))]
            set_leaf(header, path, [0, -1, 1, 2**31, 2**62, -2**63, 1e300, "x", None, [], {}][
                int(rng.integers(0, 11))])
        else:                                                  # an index entry's frames
            i = int(rng.integers(0, len(entries)))
            e = entries[i]
            entries[i] = type(e)(e.offset, e.length, e.t0,
                                 int(rng.choice([0, 1, e.frames + 1, 2**31])), e.crc)

    return reseal(blob, edit)


def damage_window(blob: bytes, rng: np.random.Generator) -> bytes:
    """One window payload mutated and the container resealed (index and footer checksums
    recomputed), but not the window's own checksum of its reconstruction, which a writer
    computes from the data: the decoder's last line of defence. Every outcome must be a
    TezipError or exactly the original data (``check``)."""
    def edit(header: dict, entries: list, payloads: list) -> None:
        i = int(rng.integers(0, len(payloads)))
        payloads[i] = mutate(payloads[i], rng)

    return reseal(blob, edit)


def check_crafted(blob: bytes) -> str:
    """A resealed file may legitimately decode to other data; what must hold: a TezipError
    or a result of the declared shape and dtype, no other exception, bounded memory."""
    decoded = _decode(blob, CRAFTED_MEMORY_LIMIT)
    if decoded is None:
        return "error"
    got, shape, dtype = decoded
    assert got.shape == shape and got.dtype == dtype
    return "decoded"
