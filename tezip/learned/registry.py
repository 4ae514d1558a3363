"""Models a decoder can find by hash: the shipped ones (package data) and the ones a
caller supplies. Loaded once per process and shared (read-only)."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from ..models_path import default_model_path, pretrained_dir
from .model import MODEL_FORMAT, Model, from_bytes, load

_LOCK = threading.Lock()
_BY_HASH: dict[str, Model] = {}
_SHIPPED: dict[str, Path] | None = None


def _shipped() -> dict[str, Path]:
    """hash -> path of every shipped model file of the current format."""
    global _SHIPPED
    if _SHIPPED is None:
        found = {}
        d = pretrained_dir()
        for p in sorted(d.glob("*.safetensors")) if d.is_dir() else []:
            data = p.read_bytes()
            if MODEL_FORMAT.encode() in data[:4096]:
                found[hashlib.sha256(data).hexdigest()] = p
        _SHIPPED = found
    return _SHIPPED


def remember(model: Model) -> Model:
    with _LOCK:
        return _BY_HASH.setdefault(model.hash, model)


def by_hash(h: str) -> Model | None:
    """A shipped (or already loaded) model with this content hash, else None."""
    with _LOCK:
        m = _BY_HASH.get(h)
        if m is not None:
            return m
        path = _shipped().get(h)
        if path is None:
            return None
        m = load(path)
        _BY_HASH[h] = m
        return m


def from_embedded(data: bytes, where: str) -> Model:
    m = from_bytes(data, where)
    return remember(m)


_BY_FILE: dict[tuple[str, int, int], Model] = {}


def from_file(path: str) -> Model:
    """The model in ``path``, read once per process while the file is unchanged (a
    DataLoader worker opening many shards reads the data set's model once)."""
    try:
        st = os.stat(path)
        key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    except OSError:
        return remember(load(path))     # load() names the problem
    with _LOCK:
        m = _BY_FILE.get(key)
    if m is None:
        m = remember(load(path))
        with _LOCK:
            _BY_FILE[key] = m
    return m


def default() -> Model | None:
    """The shipped default forecaster, if this installation has one."""
    p = default_model_path()
    if not p.is_file():
        return None
    return from_file(str(p))


def is_shipped(h: str) -> bool:
    return h in _shipped()
