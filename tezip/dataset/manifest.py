"""The data set manifest (``manifest.json``): one schema, one reader with one version rule,
one writer, and the check of a data set against it. No torch.

::

    {"format": "tezip-dataset", "version": 1, "created_by": "tezip 0.1.0",
     "codec": {"mode": "rel", "bound": 0.001, ...}, "model_hash": null,
     "total_frames": 264, "total_raw_bytes": 32813248, "total_bytes": 3203986,
     "shards": [{"file": "shard-000000.tez", "bytes": 287984, "sha256": "...",
                 "frames": 72, "shape": [72, 109, 110], "dtype": "float32",
                 "source": "/abs/path/iris.npy", "dataset": null,
                 "source_frames": [0, 72], "first_frame": 0}, ...]}

``source`` is the absolute path of the input the shard was cut from (older data sets may
hold the path as given on the command line); ``source_frames`` is ``[a, b)`` in it;
``first_frame`` is the shard's offset in the concatenation of all shards.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..codec import TezFile, __version__
from ..errors import CorruptFileError, FormatVersionError, InputError, TezipError
from ..io import atomic_output
from ..windows import DEFAULT_WINDOW, window_length

MANIFEST = "manifest.json"
FORMAT = "tezip-dataset"
VERSION = 1


@dataclass(frozen=True)
class ShardInfo:
    """One shard: consecutive frames of one source stack."""

    file: str
    frames: int
    shape: tuple[int, ...]
    dtype: str
    bytes: int | None = None
    sha256: str | None = None
    source: str | None = None
    dataset: str | None = None
    source_frames: tuple[int, int] | None = None

    @property
    def frame_shape(self) -> tuple[int, ...]:
        return self.shape[1:]


@dataclass(frozen=True)
class Manifest:
    """A checked manifest. ``root`` is the data set directory; shard files are
    ``root / shard.file``."""

    root: Path
    shards: tuple[ShardInfo, ...]
    codec: dict[str, Any]
    total_frames: int
    raw: dict[str, Any] = field(repr=False)

    @property
    def window_request(self) -> int | None:
        """The window length the shards were written with (frames; None: automatic,
        ``windows.window_length``, which depends on the frames' size). A manifest of
        tezip 0.7.5 or older always records a number."""
        w = self.codec.get("window", DEFAULT_WINDOW)
        if w is None:
            return None
        try:
            return max(1, int(w))
        except (TypeError, ValueError):
            return DEFAULT_WINDOW

    @property
    def window(self) -> int:
        """Frames per window of the shards (the loader's unit of reading): the length
        asked for, or for automatic windows the shortest of the shards' (``windows.
        window_length`` of their frames; ``shard_windows`` has each one's)."""
        w = self.window_request
        if w is None:
            return min(self.shard_windows, default=window_length(None, 1))
        return w

    @property
    def shard_windows(self) -> tuple[int, ...]:
        """Each shard's window length (frames): the one asked for, or the automatic one of
        its frames."""
        w = self.window_request
        return tuple(w if w is not None else window_length(None, math.prod(s.frame_shape))
                     for s in self.shards)

    @property
    def frame_shapes(self) -> list[tuple[int, ...]]:
        """The distinct frame shapes, in order of first appearance."""
        return list(dict.fromkeys(s.frame_shape for s in self.shards))


def model_path(manifest: Manifest) -> Path | None:
    """The data set's own model file (``prepare --adapt``), or None."""
    name = manifest.raw.get("model_file")
    if name is None:
        return None
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
        raise CorruptFileError(f"{manifest.root / MANIFEST}: bad model_file {name!r}")
    return manifest.root / name


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def is_dataset_dir(path: str | os.PathLike[str]) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, MANIFEST))


def read(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of ``directory`` as a dict, checked for its format and version (the
    one version rule: older or equal versions are read, newer ones refused); the shard
    entries are not checked here (``load`` and ``verify`` do)."""
    root = Path(directory)
    path = root / MANIFEST
    if not root.is_dir():
        raise InputError(f"{root}: no such data set directory")
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{root} has no {MANIFEST}: write one with `tezip prepare` "
                         "(or it is still running)") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CorruptFileError(f"{path}: not a readable JSON manifest ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise InputError(f"{path} is not a tezip data set manifest")
    version = raw.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CorruptFileError(f"{path}: bad manifest version {version!r}")
    if version > VERSION:
        raise FormatVersionError(f"{path} has manifest version {version}; this tezip reads "
                                 f"up to version {VERSION}: upgrade tezip")
    if not isinstance(raw.get("shards"), list) or not raw["shards"]:
        raise InputError(f"{path} lists no shards")
    return raw


def parse_entry(e: Any) -> ShardInfo:
    """One shard entry; raises ValueError when it is malformed."""
    try:
        file = str(e["file"])
        shape = tuple(int(s) for s in e["shape"])
        frames = int(e.get("frames", shape[0]))
        dtype = np.dtype(e["dtype"]).name
        sf = e.get("source_frames")
        info = ShardInfo(
            file, frames, shape, dtype,
            int(e["bytes"]) if e.get("bytes") is not None else None,
            str(e["sha256"]) if e.get("sha256") else None,
            str(e["source"]) if e.get("source") is not None else None,
            str(e["dataset"]) if e.get("dataset") is not None else None,
            (int(sf[0]), int(sf[1])) if sf is not None else None)
    except (KeyError, TypeError, ValueError, IndexError, OverflowError, AttributeError):
        raise ValueError("incomplete") from None
    if (Path(file).name != file or file in ("", ".", "..") or len(shape) not in (3, 4)
            or frames != shape[0] or min(shape) < 1):
        raise ValueError("malformed")
    return info


def load(directory: str | os.PathLike[str]) -> Manifest:
    """Read and check ``directory/manifest.json``; problems raise a TezipError naming them."""
    raw = read(directory)
    root = Path(directory)
    shards = []
    for i, e in enumerate(raw["shards"]):
        try:
            shards.append(parse_entry(e))
        except ValueError:
            name = e.get("file") if isinstance(e, dict) else None
            raise CorruptFileError(f"{root / MANIFEST}: shard entry {i}"
                                   f"{f' ({name!r})' if name else ''} is malformed") from None
    codec = raw.get("codec") if isinstance(raw.get("codec"), dict) else {}
    return Manifest(root, tuple(shards), codec, sum(s.frames for s in shards), raw)


def from_stacks(paths: Iterable[str | os.PathLike[str]]) -> Manifest:
    """Uncompressed ``.npy`` stacks as a data set, each one shard (for baselines: the same
    loaders read them, e.g. ``examples/train_ddp.py --raw``). Files keep their paths."""
    shards = []
    for p in paths:
        path = Path(p).absolute()
        try:
            a = np.load(path, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError:
            raise InputError(f"{p}: no such file") from None
        except (OSError, ValueError) as exc:
            raise InputError(f"{p}: not a readable .npy file ({exc})") from None
        if a.ndim not in (3, 4) or min(a.shape) < 1:
            raise InputError(f"{p}: expected a stack (T, H, W[, C]), got shape {a.shape}")
        shape = tuple(int(s) for s in a.shape)
        shards.append(ShardInfo(str(path), shape[0], shape, a.dtype.name,
                                path.stat().st_size, None, str(path), None, (0, shape[0])))
    if not shards:
        raise InputError("no stacks given")
    raw = {"format": FORMAT, "version": VERSION, "codec": {}, "shards": []}
    return Manifest(Path("/"), tuple(shards), {}, sum(s.frames for s in shards), raw)


def build(codec: dict[str, Any], entries: list[dict[str, Any]],
          model_hash: str | None = None, model_file: str | None = None) -> dict[str, Any]:
    """A manifest from shard entries (``first_frame`` is filled in here); ``model_file``:
    the data set's own model (``prepare --adapt``), in the data set directory."""
    first = 0
    shards = []
    for e in entries:
        shards.append({**e, "first_frame": first})
        first += int(e["frames"])
    raw = sum(math.prod(e["shape"]) * np.dtype(e["dtype"]).itemsize for e in entries)
    return {"format": FORMAT, "version": VERSION, "created_by": f"tezip {__version__}",
            "codec": codec, "model_hash": model_hash,
            **({"model_file": model_file} if model_file else {}), "total_frames": first,
            "total_raw_bytes": raw, "total_bytes": sum(int(e["bytes"]) for e in entries),
            "shards": shards}


def text(manifest: dict[str, Any]) -> str:
    """JSON with one line per top-level key and one line per shard."""
    lines = []
    for k, v in manifest.items():
        if k == "shards":
            items = [" " + json.dumps(e) for e in v]
            lines.append(f'"{k}": [\n' + ",\n".join(items) + "\n]" if items else f'"{k}": []')
        else:
            lines.append(f"{json.dumps(k)}: {json.dumps(v)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def write_json(path: str | os.PathLike[str], obj: Any, body: str | None = None, *,
               force: bool = False) -> None:
    """``obj`` as JSON (or ``body``) at ``path``, through the one atomic-output helper;
    ``force``: replace a file already there (else OutputExistsError)."""
    with atomic_output(path, force=force) as tmp:
        Path(tmp).write_text(json.dumps(obj) + "\n" if body is None else body)


def write(directory: str | os.PathLike[str], manifest: dict[str, Any]) -> Path:
    path = Path(directory) / MANIFEST
    write_json(path, manifest, text(manifest))
    return path


@dataclass
class DatasetReport:
    directory: str
    shards: int = 0
    frames: int = 0
    bytes: int = 0
    ok: int = 0
    problems: list[tuple[str, str]] = field(default_factory=list)   # (file, what is wrong)

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"directory": self.directory, "shards": self.shards, "frames": self.frames,
                "bytes": self.bytes, "ok": self.ok, "passed": self.passed,
                "problems": [{"file": f, "problem": p} for f, p in self.problems]}


def _check_shard(directory: Path, info: ShardInfo) -> str | None:
    path = directory / info.file
    if not path.is_file():
        return "missing"
    if info.bytes is not None and path.stat().st_size != info.bytes:
        return f"size {path.stat().st_size} bytes, manifest says {info.bytes}"
    if info.sha256 is not None and sha256_file(path) != info.sha256:
        return "sha256 does not match the manifest (damaged)"
    try:
        with TezFile(path) as f:
            if tuple(f.shape) != info.shape or f.dtype.name != info.dtype:
                return (f"holds {tuple(f.shape)} {f.dtype.name}, manifest says "
                        f"{info.shape} {info.dtype}")
    except TezipError as exc:
        return f"not a readable .tez: {exc}"
    return None


def verify(directory: str | os.PathLike[str],
           progress: Callable[[int], None] | None = None) -> DatasetReport:
    """Check every shard of a data set against its manifest: present, size, sha256, and
    a .tez whose shape and dtype are the declared ones. Problems are listed, not raised."""
    raw = read(directory)
    root = Path(directory)
    rep = DatasetReport(str(directory), shards=len(raw["shards"]))
    expect_first = 0
    for i, e in enumerate(raw["shards"]):
        try:
            info = parse_entry(e)
            if info.bytes is None or info.sha256 is None:
                raise ValueError("incomplete")
            first = int(e["first_frame"])
        except (ValueError, KeyError, TypeError, OverflowError):
            rep.problems.append((f"shard #{i}", "manifest entry is incomplete or malformed"))
            continue
        if first != expect_first:
            problem: str | None = f"first_frame {first}, expected {expect_first}"
        else:
            problem = _check_shard(root, info)
        expect_first += info.frames
        rep.frames += info.frames
        rep.bytes += info.bytes
        if problem:
            rep.problems.append((info.file, problem))
        else:
            rep.ok += 1
        if progress:
            progress(1)
    if raw.get("total_frames") != rep.frames:
        rep.problems.append((MANIFEST, f"total_frames {raw.get('total_frames')} but the "
                                       f"shards hold {rep.frames}"))
    name = raw.get("model_file")
    if name is not None:        # prepare --adapt: the model the shards need to decode
        if not isinstance(name, str) or Path(name).name != name or not (root / name).is_file():
            rep.problems.append((str(name), "the data set's model is missing"))
        elif sha256_file(root / name) != raw.get("model_hash"):
            rep.problems.append((name, "sha256 is not the manifest's model_hash (damaged)"))
    return rep
