"""MPI-parallel dataset preparation: ``tezip prepare`` turns many stacks (or one huge one)
into ``.tez`` shards plus a ``manifest.json``, with the encoding spread over MPI ranks.

How a run goes (every rank runs the same code; rank 0 also talks to the user)::

    setup   rank 0 expands the inputs (globs, folders, FILE.h5:/dataset), creates the
            output directory, removes a stale manifest and temporary files; broadcast
    scan    sources are split over ranks by bytes on disk; each rank opens its sources
            (shape, dtype, identity) and, for a source larger than one shard, estimates
            its compression ratio by encoding the first window; allgather
    plan    every rank computes the same shard plan (a pure function of the scan):
            consecutive, window-aligned frame ranges of one source each, numbered in
            input order; shards go to ranks largest-first onto the least-loaded rank
    range   each rank checks its shards for resume (sidecar + sha256) and computes the
            min/max of the frames of those it must write; allgather; the value range
            of every source is the min/max over its shards (relative bounds then mean
            the same in every shard of a source, whatever the number of ranks)
    encode  each rank writes its shards (temp + rename) and a sidecar
            ``shard-NNNNNN.tez.json`` after each; progress goes to rank 0 as small
            point-to-point messages; rank 0 collects every rank's result, writes
            ``manifest.json`` (temp + os.replace) only if every rank succeeded, and
            broadcasts the outcome so that all ranks exit alike

Any failure is caught on the rank where it happens and travels in the next exchange, so
no rank waits forever for a rank that gave up; rank 0 reports it as
``rank R failed on INPUT: message``.

Without an MPI launcher (no PMI_*/OMPI_*/PMIX_* variables) the run is a single rank and
mpi4py is not even imported. ``TEZIP_MPI=0`` forces a single rank, ``TEZIP_MPI=1`` forces
the import of mpi4py.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import heapq
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from . import io, make_bound, mpi_env, predictors
from .codec import DEFAULT_WINDOW, ArrayStack, Options, TezFile, __version__, compress_stack
from .codec import check_stack as _check_stack
from .errors import InputError, OptionError, OutputError, TezipError
from .windows import window_length

MANIFEST = "manifest.json"
FORMAT = "tezip-dataset"
VERSION = 1
DEFAULT_SHARD_MB = 128.0
# a source estimated to compress better than this is still cut as if it compressed this
# well, so one shard never holds more than MAX_EST_RATIO x --shard-size of raw data and a
# huge, very compressible stack is still split over ranks
MAX_EST_RATIO = 16.0
_SIDE = ".json"
_TAG = 4242
_STACK_EXT = (".npy", ".h5", ".hdf5", ".hdf", ".nxs")
_FRAME_EXT = (".png", ".tif", ".tiff")
_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE",
                  "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS", "HYDI_CONTROL_FD")
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


# ---------------------------------------------------------------------------------------
# configuration


@dataclass(frozen=True)
class CodecConfig:
    """The codec options as the user gave them (also what the manifest records)."""

    mode: str = "lossless"
    bound: float | None = None
    rel_bound: float | None = None
    predictor: str = "auto"
    window: int = DEFAULT_WINDOW
    model: str | None = None            # learned model file (None: the shipped default)

    @classmethod
    def from_cli(cls, mode: str | None, bound: float | None, rel_bound: float | None,
                 predictor: str = "auto", window: int = DEFAULT_WINDOW,
                 model: str | None = None) -> CodecConfig:
        """The same defaults and checks as ``tezip compress``."""
        if mode is None:
            mode = "rel" if bound is not None else "lossless"
        if mode == "absrel" and rel_bound is None:
            raise OptionError("mode 'absrel' needs both --bound (absolute) and --rel-bound")
        if mode != "absrel" and rel_bound is not None:
            raise OptionError("--rel-bound is only for --mode absrel")
        cfg = cls(mode, bound, rel_bound, predictor, window,
                  None if model is None else str(model))
        cfg.options()  # validates
        return cfg

    def options(self) -> Options:
        return Options(make_bound(self.mode, self.bound, self.rel_bound),
                       predictor=self.predictor, window=self.window, model=self.model)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def model_identity(self) -> str | None:
        """The content hash of the model the shards may use (None: classical only)."""
        return predictors.model_identity(self.options())


@dataclass(frozen=True)
class PrepareConfig:
    """One ``tezip prepare`` run."""

    inputs: tuple[str, ...]
    out: Path
    codec: CodecConfig = field(default_factory=CodecConfig)
    dataset: str | None = None          # for HDF5 inputs without FILE:/dataset
    shard_size_mb: float = DEFAULT_SHARD_MB
    force: bool = False                 # rewrite every shard, trust nothing on disk
    progress: bool = True               # rank 0 prints the aggregated progress line

    def __post_init__(self) -> None:
        if not self.inputs:
            raise OptionError("no inputs given")
        if not (self.shard_size_mb > 0 and math.isfinite(self.shard_size_mb)):
            raise OptionError(f"--shard-size must be a positive number of MB, "
                              f"got {self.shard_size_mb}")

    @property
    def target_bytes(self) -> int:
        return max(1, int(self.shard_size_mb * 1e6))


class RankFailure(TezipError):
    """A rank failed; raised on every rank. ``report`` is True on the rank that should
    print it (rank 0)."""

    def __init__(self, message: str, report: bool) -> None:
        super().__init__(message)
        self.report = report


# ---------------------------------------------------------------------------------------
# communication: one rank without MPI, or mpi4py's COMM_WORLD


class Comm(Protocol):
    rank: int
    size: int

    def allgather(self, obj: Any) -> list[Any]: ...
    def bcast(self, obj: Any) -> Any: ...
    def send_root(self, obj: Any) -> None: ...
    def poll(self) -> list[tuple[int, Any]]: ...
    def flush(self) -> None: ...


class SerialComm:
    """The world of one rank."""

    rank = 0
    size = 1

    def allgather(self, obj: Any) -> list[Any]:
        return [obj]

    def bcast(self, obj: Any) -> Any:
        return obj

    def send_root(self, obj: Any) -> None:
        raise RuntimeError("rank 0 has no one to send to")

    def poll(self) -> list[tuple[int, Any]]:
        return []

    def flush(self) -> None:
        pass


class MpiComm:
    """mpi4py's COMM_WORLD. Waits before collectives sleep instead of spinning, so a rank
    that finished early does not take a core from one still working."""

    def __init__(self, comm: Any, mpi: Any) -> None:
        self._c = comm
        self._mpi = mpi
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._reqs: list[Any] = []

    def _settle(self) -> None:
        req = self._c.Ibarrier()
        delay = 1e-4
        while not req.Test():
            time.sleep(delay)
            delay = min(0.02, delay * 2)

    def allgather(self, obj: Any) -> list[Any]:
        self._settle()
        return self._c.allgather(obj)

    def bcast(self, obj: Any) -> Any:
        self._settle()
        return self._c.bcast(obj, root=0)

    def send_root(self, obj: Any) -> None:
        self._reqs = [r for r in self._reqs if not r.Test()]
        self._reqs.append(self._c.isend(obj, dest=0, tag=_TAG))

    def poll(self) -> list[tuple[int, Any]]:
        out = []
        status = self._mpi.Status()
        while self._c.iprobe(source=self._mpi.ANY_SOURCE, tag=_TAG, status=status):
            src = status.Get_source()
            out.append((src, self._c.recv(source=src, tag=_TAG)))
        return out

    def flush(self) -> None:
        for r in self._reqs:
            r.wait()
        self._reqs.clear()


def _launched_size() -> int | None:
    """How many processes the MPI launcher started, as its environment says (None: not
    started by an MPI launcher, 0: started by one that does not say how many)."""
    for var in _SIZE_VARS:
        with contextlib.suppress(ValueError):
            if var in os.environ:
                return int(os.environ[var])
    return 0 if any(v in os.environ for v in _LAUNCHER_VARS) else None


def get_comm() -> Comm:
    """SerialComm unless started by an MPI launcher (or TEZIP_MPI=1); then MpiComm over
    mpi4py's COMM_WORLD. Refuses a launch whose processes would each think they are
    alone (mpi4py missing, or built against another MPI than the launcher's)."""
    flag = os.environ.get("TEZIP_MPI", "").strip().lower()
    if flag in ("0", "no", "off", "false"):
        return SerialComm()
    launched = _launched_size()
    slurm = mpi_env.slurm_tasks()       # srun tasks, whether or not PMI variables say so
    if launched is None and slurm is None and flag not in ("1", "yes", "on", "true"):
        return SerialComm()
    try:
        from mpi4py import MPI
    except ImportError:
        if launched or slurm:
            raise OptionError(f"started by an MPI launcher (or srun) with {launched or slurm[1]}"
                              " processes but mpi4py is not installed; install it with "
                              "`pip install tezip[mpi]`, or run without mpirun") from None
        return SerialComm()
    comm = MPI.COMM_WORLD
    mpi_env.check_world(comm.Get_size())
    if comm.Get_size() == 1:
        if launched and launched > 1:
            raise OptionError(
                f"the MPI launcher started {launched} processes but each sees a world of 1: "
                "mpi4py's MPI library is not the launcher's; use the mpiexec that comes with "
                "it (the one in the same environment as `pip install tezip[mpi]`)")
        return SerialComm()
    return MpiComm(comm, MPI)


# ---------------------------------------------------------------------------------------
# inputs, scan and plan


@dataclass(frozen=True)
class Source:
    """One input stack: ``path`` as the user named it (or a glob/folder expanded it)."""

    path: str
    dataset: str | None = None


@dataclass
class SourceInfo:
    shape: tuple[int, ...]
    dtype: str
    dataset: str | None        # the dataset actually read (HDF5), else None
    identity: list[Any]        # size and mtime of the file(s), for resume
    est_ratio: float           # estimated compression ratio (1.0 when not estimated)

    @property
    def frame_bytes(self) -> int:
        return math.prod(self.shape[1:]) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Shard:
    index: int
    source: int
    t0: int
    t1: int
    raw_bytes: int

    @property
    def file(self) -> str:
        return f"shard-{self.index:06d}.tez"


def _has_magic(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _split_dataset(item: str) -> tuple[str, str | None]:
    """``run.h5:/entry/data`` -> ("run.h5", "/entry/data") when the whole is not a path."""
    if os.path.exists(item) or ":/" not in item:
        return item, None
    path, _, ds = item.rpartition(":/")
    return path, "/" + ds


def _dir_members(path: str) -> list[str] | None:
    """The stack files of a directory of stacks, or None for a folder of frames."""
    names = sorted(os.listdir(path))
    if any(n.lower().endswith(_FRAME_EXT) for n in names):
        return None
    found = [os.path.join(path, n) for n in names
             if n.lower().endswith(_STACK_EXT) and os.path.isfile(os.path.join(path, n))]
    if not found:
        raise InputError(f"{path} holds neither frame images ({', '.join(_FRAME_EXT)}) nor "
                         f"stack files ({', '.join(_STACK_EXT)})")
    return found


def expand_inputs(inputs: Iterable[str], dataset: str | None = None) -> list[Source]:
    """Files, quoted globs (sorted), folders (a folder of frames is one stack; a folder of
    stack files gives each, sorted) and ``FILE.h5:/dataset``, in the order given, without
    repeats. ``dataset`` applies to HDF5 inputs that do not name their own."""
    out: list[Source] = []
    seen: set[tuple[str, str | None]] = set()
    for item in inputs:
        path, ds = _split_dataset(item)
        if _has_magic(path) and not os.path.exists(path):
            paths = sorted(glob.glob(path, recursive=True))
            if not paths:
                raise InputError(f"no file matches {path}")
        elif not os.path.exists(path):
            raise InputError(f"no such file or directory: {path}")
        else:
            paths = [path]
        for p in paths:
            members = _dir_members(p) if os.path.isdir(p) else None
            for m in members if members is not None else [p]:
                fmt = io.detect_format(m)
                use = ds if ds is not None else (dataset if fmt == "hdf5" else None)
                if ds is not None and fmt != "hdf5":
                    raise OptionError(f"{item}: a dataset path applies to HDF5 files only")
                key = (os.path.realpath(m), use)
                if key not in seen:
                    seen.add(key)
                    out.append(Source(m, use))
    return out


def _identity(path: str) -> list[Any]:
    st = os.stat(path)
    if not os.path.isdir(path):
        return [st.st_size, st.st_mtime_ns]
    n = size = mtime = 0
    for e in os.scandir(path):
        if e.is_file():
            s = e.stat()
            n, size, mtime = n + 1, size + s.st_size, max(mtime, s.st_mtime_ns)
    return [n, size, mtime]


def _disk_bytes(path: str) -> int:
    if os.path.isdir(path):
        return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
    return os.path.getsize(path)


def _effective_window(codec: CodecConfig, shape: tuple[int, ...]) -> int:
    return window_length(codec.window, math.prod(shape[1:]))


def scan_source(src: Source, codec: CodecConfig, target_bytes: int) -> SourceInfo:
    """Open one source: layout, identity and (if it needs more than one shard) the ratio
    of its first window as an estimate for the whole."""
    with io.open_input(src.path, dataset=src.dataset) as stack:
        shape = tuple(int(s) for s in stack.shape)
        dtype = np.dtype(stack.dtype)
        _check_stack(shape, dtype)
        meta = stack.metadata or {}
        ratio = 1.0
        if math.prod(shape) * dtype.itemsize > target_bytes:
            n = min(shape[0], max(2, _effective_window(codec, shape)))
            sample = ArrayStack(stack.read(0, n))
            stats = compress_stack(sample, None, codec.options(), fileobj=_Counter())
            ratio = min(MAX_EST_RATIO, max(1.0, stats.ratio))
    return SourceInfo(shape, dtype.name, meta.get("dataset") if meta.get("format") == "hdf5"
                      else None, _identity(src.path), ratio)


class _Counter:
    """A write-only file that only counts bytes."""

    def __init__(self) -> None:
        self.n = 0

    def write(self, b: bytes) -> int:
        self.n += len(b)
        return len(b)


def plan_shards(infos: list[SourceInfo], codec: CodecConfig, target_bytes: int) -> list[Shard]:
    """Shards in global order: sources in input order, each cut into consecutive runs of
    whole windows. A source gets ceil(estimated compressed size / target) shards (at least
    one) and its windows are dealt out evenly, so the shards of a source differ by at most
    one window; every shard holds at least two frames (a stack of one frame is not a
    stack). Depends only on the inputs and options, never on the number of ranks."""
    shards: list[Shard] = []
    for s, info in enumerate(infos):
        t = info.shape[0]
        wlen = _effective_window(codec, info.shape)
        n_windows = -(-t // wlen)
        est = t * info.frame_bytes / info.est_ratio
        n = max(1, min(n_windows, t // 2, math.ceil(est / target_bytes)))
        cuts = [min(t, (i * n_windows // n) * wlen) for i in range(n + 1)]
        if n > 1 and cuts[-1] - cuts[-2] < 2:
            del cuts[-2]        # a last window of one frame joins the shard before it
        for a, b in zip(cuts, cuts[1:], strict=False):
            shards.append(Shard(len(shards), s, a, b, (b - a) * info.frame_bytes))
    return shards


def assign(weights: list[int], size: int) -> list[int]:
    """Rank of each item: largest first onto the least-loaded rank (ties: lower index,
    lower rank). Deterministic."""
    heap = [(0, r) for r in range(size)]
    owner = [0] * len(weights)
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        load, r = heapq.heappop(heap)
        owner[i] = r
        heapq.heappush(heap, (load + weights[i], r))
    return owner


# ---------------------------------------------------------------------------------------
# shards on disk


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def manifest_text(manifest: dict[str, Any]) -> str:
    """JSON with one line per top-level key and one line per shard."""
    lines = []
    for k, v in manifest.items():
        if k == "shards":
            items = [" " + json.dumps(e) for e in v]
            lines.append(f'"{k}": [\n' + ",\n".join(items) + "\n]" if items else f'"{k}": []')
        else:
            lines.append(f"{json.dumps(k)}: {json.dumps(v)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _write_json(path: Path, obj: Any, text: str | None = None) -> None:
    """Atomically: a temporary file in the same directory, fsync, os.replace."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(obj) + "\n" if text is None else text)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class _FrameRange:
    """Frames [t0, t1) of a stack, as a stack."""

    def __init__(self, stack: Any, t0: int, t1: int, metadata: dict[str, Any]) -> None:
        self._s, self._t0 = stack, t0
        self.shape = (t1 - t0, *stack.shape[1:])
        self.dtype = stack.dtype
        self.metadata = metadata

    def read(self, a: int, b: int) -> np.ndarray:
        return self._s.read(self._t0 + a, self._t0 + b)


def _part_range(view: _FrameRange, chunk: int) -> list[float] | None:
    """[min, max] of the finite values, None if there are none."""
    lo, hi = math.inf, -math.inf
    for a in range(0, view.shape[0], chunk):
        x = view.read(a, min(view.shape[0], a + chunk))
        if x.dtype.kind == "f":
            x = x[np.isfinite(x)]
        if x.size:
            lo, hi = min(lo, float(x.min())), max(hi, float(x.max()))
    return [lo, hi] if lo <= hi else None


def _model_hash(path: Path) -> str | None:
    """The content hash of the learned model a shard was written with, from its header."""
    with TezFile(path) as f:
        rec = f.header.get("model")
    return rec.get("hash") if isinstance(rec, dict) else None


def _needs_range(codec: CodecConfig, dtype: str) -> bool:
    """Mirrors compress_stack: the value range is used for relative bounds and floats."""
    return codec.mode in ("rel", "absrel") or np.dtype(dtype).kind == "f"


def _json_norm(obj: Any) -> Any:
    return json.loads(json.dumps(obj))


def _shard_key(codec: CodecConfig, src: Source, info: SourceInfo, shard: Shard) -> Any:
    """What a shard's bytes depend on; a sidecar with another key is not reused."""
    return _json_norm({"tezip": __version__, "codec": codec.to_dict(),
                       "model": codec.model_identity(), "source": src.path,
                       "dataset": info.dataset, "identity": info.identity,
                       "shape": info.shape, "dtype": info.dtype,
                       "source_frames": [shard.t0, shard.t1]})


def _reusable(out: Path, shard: Shard, key: Any) -> dict[str, Any] | None:
    """The sidecar of a complete shard written with the same key whose file still has the
    recorded size and sha256; None otherwise. The sidecar is written only after the shard
    was renamed into place, so a shard cut short by a kill is never trusted."""
    side = out / (shard.file + _SIDE)
    path = out / shard.file
    try:
        meta = json.loads(side.read_text())
        rec = meta["record"]
        if (meta.get("key") != key or not path.is_file()
                or path.stat().st_size != rec["bytes"]):
            return None
        if sha256_file(path) != rec["sha256"]:
            return None
        return meta
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ---------------------------------------------------------------------------------------
# the run


@dataclass
class RankStats:
    rank: int
    shards_written: int = 0
    shards_reused: int = 0
    raw_bytes: int = 0          # raw bytes this rank encoded
    compressed_bytes: int = 0
    seconds: float = 0.0        # time spent reading ranges and encoding
    phases: dict[str, float] = field(default_factory=dict)   # seconds per phase

    def lap(self, phase: str, since: float) -> float:
        now = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - since
        return now

    @property
    def mb_per_s(self) -> float:
        return self.raw_bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


@dataclass
class PrepareResult:
    manifest: dict[str, Any]
    out: Path
    ranks: int
    seconds: float
    sources: int
    per_rank: list[RankStats]

    @property
    def shards_written(self) -> int:
        return sum(r.shards_written for r in self.per_rank)

    @property
    def shards_reused(self) -> int:
        return sum(r.shards_reused for r in self.per_rank)

    @property
    def raw_encoded(self) -> int:
        return sum(r.raw_bytes for r in self.per_rank)

    def summary(self) -> dict[str, Any]:
        m = self.manifest
        return {"out": str(self.out), "manifest": str(self.out / MANIFEST),
                "ranks": self.ranks, "sources": self.sources, "shards": len(m["shards"]),
                "shards_written": self.shards_written, "shards_reused": self.shards_reused,
                "frames": m["total_frames"], "raw_bytes": m["total_raw_bytes"],
                "compressed_bytes": m["total_bytes"],
                "ratio": m["total_raw_bytes"] / m["total_bytes"] if m["total_bytes"] else None,
                "seconds": self.seconds,
                "mb_per_s": self.raw_encoded / 1e6 / self.seconds if self.seconds else None,
                "per_rank": [{**asdict(r), "mb_per_s": r.mb_per_s} for r in self.per_rank]}


Failure = tuple[str | None, str]   # (input, message)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TezipError):
        text = str(exc)
    elif isinstance(exc, OSError):
        text = (exc.strerror or str(exc)) + (f": {exc.filename}" if exc.filename else "")
    elif isinstance(exc, MemoryError):
        text = "out of memory; use a smaller --window or --shard-size"
    else:
        text = f"internal error: {type(exc).__name__}: {exc}"
    return " ".join(text.split())


def _check(comm: Comm, failures: list[Failure | None]) -> None:
    """Raise on every rank if any rank failed: the lowest rank's failure is the message."""
    bad = [(r, f) for r, f in enumerate(failures) if f is not None]
    if not bad:
        return
    r, (where, msg) = bad[0]
    text = f"rank {r} failed" + (f" on {where}" if where else "") + f": {msg}"
    if len(bad) > 1:
        text += f" (and {len(bad) - 1} more rank{'s' if len(bad) > 2 else ''} failed)"
    raise RankFailure(text, report=comm.rank == 0)


class _Progress:
    """The one aggregated progress line on rank 0: a carriage-return line on a terminal,
    a plain line every 15 s otherwise (batch logs), nothing when disabled."""

    def __init__(self, enabled: bool, total_frames: int, ranks: int) -> None:
        tty = sys.stderr.isatty() or bool(os.environ.get("TEZIP_PROGRESS"))
        self.mode = "off" if not enabled else ("tty" if tty else "log")
        self.interval = 0.5 if self.mode == "tty" else 15.0
        self.total = total_frames
        self.ranks = ranks
        self.t_start = time.perf_counter()
        self.last = self.t_start
        self.state: dict[int, tuple[int, int, int, int]] = {}
        self.width = 0

    def update(self, rank: int, counters: tuple[int, int, int, int], force: bool = False) -> None:
        self.state[rank] = counters
        now = time.perf_counter()
        if self.mode == "off" or (now - self.last < self.interval
                                  and not (force and self.mode == "tty")):
            return
        self.last = now
        frames = sum(c[0] for c in self.state.values())
        raw = sum(c[1] for c in self.state.values())
        done_raw = sum(c[2] for c in self.state.values())
        comp = sum(c[3] for c in self.state.values())
        ratio = f"{done_raw / comp:.2f}" if comp else "-"
        dt = max(1e-9, now - self.t_start)
        line = (f"prepare: {frames}/{self.total} frames, {raw / 1e6:.1f} MB in, "
                f"{comp / 1e6:.1f} MB out, ratio {ratio}, {raw / 1e6 / dt:.1f} MB/s "
                f"({self.ranks} rank{'s' if self.ranks > 1 else ''})")
        if self.mode == "tty":
            sys.stderr.write("\r" + line.ljust(self.width))
            self.width = len(line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.mode == "tty" and self.width:
            sys.stderr.write("\r" + " " * self.width + "\r")
            sys.stderr.flush()
            self.width = 0


def _setup(cfg: PrepareConfig) -> list[Source]:
    """Rank 0: inputs, output directory, leftovers of an earlier run."""
    sources = expand_inputs(cfg.inputs, cfg.dataset)
    out = cfg.out
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} exists and is not a directory; choose another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create {out}: {exc.strerror or exc}") from exc
    # the old manifest would describe shards this run may rewrite: it goes first, and a
    # new one appears only when the whole set is complete
    (out / MANIFEST).unlink(missing_ok=True)
    for e in os.scandir(out):  # temporary files of a killed run
        if e.name.endswith(".tmp") and e.name.startswith((".shard-", f".{MANIFEST}.")):
            with contextlib.suppress(OSError):
                os.unlink(e.path)
    return sources


def prepare(cfg: PrepareConfig, comm: Comm | None = None) -> PrepareResult:
    """Run ``tezip prepare`` on this rank; see the module docstring. Returns on every
    rank when every rank succeeded (the manifest is written by then); raises
    RankFailure on every rank otherwise."""
    comm = comm or get_comm()
    t_start = time.perf_counter()
    codec = cfg.codec
    options = codec.options()
    target = cfg.target_bytes
    root = comm.rank == 0
    stats = RankStats(comm.rank)
    t = t_start

    # setup ------------------------------------------------------------------------------
    sources: list[Source] = []
    failure: Failure | None = None
    if root:
        try:
            sources = _setup(cfg)
        except Exception as exc:
            failure = (None, _describe(exc))
    t = stats.lap("setup", t)
    sources, failure = comm.bcast((sources, failure))
    t = stats.lap("wait", t)
    if failure is not None:  # bad inputs or output directory: not one rank's failure
        raise RankFailure(failure[1], report=root)

    # scan -------------------------------------------------------------------------------
    scan_owner = assign([_safe_size(s.path) for s in sources], comm.size)
    local: dict[int, SourceInfo] = {}
    failure = None
    for i, src in enumerate(sources):
        if scan_owner[i] != comm.rank:
            continue
        try:
            local[i] = scan_source(src, codec, target)
        except Exception as exc:
            failure = (src.path, _describe(exc))
            break
    t = stats.lap("scan", t)
    gathered = comm.allgather((local, failure))
    t = stats.lap("wait", t)
    _check(comm, [g[1] for g in gathered])
    infos = [next(g[0][i] for g in gathered if i in g[0]) for i in range(len(sources))]

    # plan -------------------------------------------------------------------------------
    shards = plan_shards(infos, codec, target)
    owner = assign([s.raw_bytes for s in shards], comm.size)
    mine = [s for s in shards if owner[s.index] == comm.rank]
    keys = {s.index: _shard_key(codec, sources[s.source], infos[s.source], s) for s in mine}
    stacks: dict[int, Any] = {}

    def stack_of(s: int) -> Any:
        if s not in stacks:
            stacks[s] = io.open_input(sources[s].path, dataset=sources[s].dataset)
        return stacks[s]

    def view(sh: Shard) -> _FrameRange:
        st = stack_of(sh.source)
        meta = {**(st.metadata or {}), "source_frames": [sh.t0, sh.t1],
                "source_shape": list(infos[sh.source].shape)}
        return _FrameRange(st, sh.t0, sh.t1, meta)

    try:
        # resume check and value ranges ---------------------------------------------------
        t = t_work = stats.lap("plan", t)
        reuse: dict[int, dict[str, Any]] = {}
        parts: dict[int, list[float] | None] = {}
        failure = None
        for sh in mine:
            try:
                old = None if cfg.force else _reusable(cfg.out, sh, keys[sh.index])
                if old is not None:
                    reuse[sh.index] = old
                    parts[sh.index] = old.get("part_range")
                elif _needs_range(codec, infos[sh.source].dtype):
                    wlen = _effective_window(codec, infos[sh.source].shape)
                    parts[sh.index] = _part_range(view(sh), wlen)
            except Exception as exc:
                failure = (sources[sh.source].path, _describe(exc))
                break
        stats.seconds += time.perf_counter() - t_work
        t = stats.lap("range", t)
        gathered = comm.allgather((parts, failure))
        stats.lap("wait", t)
        _check(comm, [g[1] for g in gathered])
        vranges = _combine_ranges(shards, infos, codec, [g[0] for g in gathered])

        # encode ------------------------------------------------------------------------
        result = _encode(cfg, comm, sources, infos, shards, mine, keys, reuse, parts,
                         vranges, options, view, stats)
    finally:
        for st in stacks.values():
            with contextlib.suppress(Exception):
                st.close()
    result.seconds = time.perf_counter() - t_start
    return result


def _safe_size(path: str) -> int:
    try:
        return _disk_bytes(path)
    except OSError:
        return 0


def _combine_ranges(shards: list[Shard], infos: list[SourceInfo], codec: CodecConfig,
                    parts_by_rank: list[dict[int, list[float] | None]]
                    ) -> list[tuple[float, float] | None]:
    """Each source's (min, max) over its shards' parts; (0, 0) if it has no finite value;
    None where compress_stack would not use one."""
    parts: dict[int, list[float] | None] = {}
    for p in parts_by_rank:
        parts.update(p)
    by_source: dict[int, list[list[float]]] = {}
    for sh in shards:
        part = parts.get(sh.index)
        if part is not None:
            by_source.setdefault(sh.source, []).append(part)
    out: list[tuple[float, float] | None] = []
    for s, info in enumerate(infos):
        if not _needs_range(codec, info.dtype):
            out.append(None)
            continue
        vals = by_source.get(s, [])
        out.append((min(p[0] for p in vals), max(p[1] for p in vals)) if vals else (0.0, 0.0))
    return out


def _encode(cfg: PrepareConfig, comm: Comm, sources: list[Source], infos: list[SourceInfo],
            shards: list[Shard], mine: list[Shard], keys: dict[int, Any],
            reuse: dict[int, dict[str, Any]], parts: dict[int, list[float] | None],
            vranges: list[tuple[float, float] | None],
            options: Options, view: Callable[[Shard], _FrameRange],
            stats: RankStats) -> PrepareResult:
    root = comm.rank == 0
    total_frames = sum(s.t1 - s.t0 for s in shards)
    bar = _Progress(cfg.progress and root, total_frames, comm.size)
    done: dict[int, Any] = {}          # rank -> (records, failure, stats), on rank 0
    counters = [0, 0, 0, 0]            # frames, raw in, raw of finished shards, bytes out
    last_send = 0.0

    def absorb() -> None:
        for src, msg in comm.poll():
            if msg[0] == "p":
                bar.update(src, msg[1])
            else:
                done[src] = msg[1:]
                bar.update(src, msg[3])

    def report(force: bool = False) -> None:
        nonlocal last_send
        snap = (counters[0], counters[1], counters[2], counters[3])
        if root:
            bar.update(0, snap, force)
            absorb()
        elif force or time.perf_counter() - last_send > 0.5:
            last_send = time.perf_counter()
            comm.send_root(("p", snap))

    records: dict[int, dict[str, Any]] = {}
    hashes: dict[int, str | None] = {}
    failure: Failure | None = None
    t_work = time.perf_counter()
    for sh in mine:
        vr = vranges[sh.source]
        if sh.index in reuse and reuse[sh.index].get("vrange") == (
                list(vr) if vr is not None else None):
            records[sh.index] = reuse[sh.index]["record"]
            hashes[sh.index] = reuse[sh.index].get("model_hash")
            stats.shards_reused += 1
            counters[0] += sh.t1 - sh.t0
            continue
        try:
            def step(n: int) -> None:
                counters[0] += n
                counters[1] += n * infos[sh.source].frame_bytes  # noqa: B023
                report()

            path = cfg.out / sh.file
            (cfg.out / (sh.file + _SIDE)).unlink(missing_ok=True)
            st = compress_stack(view(sh), path, options, force=True, progress=step,
                                vrange=tuple(vr) if vr is not None else None)
            info, src = infos[sh.source], sources[sh.source]
            rec = {"file": sh.file, "bytes": path.stat().st_size, "sha256": sha256_file(path),
                   "frames": sh.t1 - sh.t0, "shape": [sh.t1 - sh.t0, *info.shape[1:]],
                   "dtype": info.dtype, "source": src.path, "dataset": info.dataset,
                   "source_frames": [sh.t0, sh.t1]}
            mh = _model_hash(path)
            _write_json(cfg.out / (sh.file + _SIDE),
                        {"key": keys[sh.index], "record": rec, "part_range": parts.get(sh.index),
                         "vrange": list(vr) if vr is not None else None, "model_hash": mh})
            records[sh.index] = rec
            hashes[sh.index] = mh
            stats.shards_written += 1
            stats.raw_bytes += st.raw_bytes
            stats.compressed_bytes += rec["bytes"]
            counters[2] += st.raw_bytes
            counters[3] += rec["bytes"]
        except Exception as exc:
            failure = (sources[sh.source].path, _describe(exc))
            break
        report()
    stats.seconds += time.perf_counter() - t_work
    t = stats.lap("encode", t_work)

    # collect on rank 0 ------------------------------------------------------------------
    snap = (counters[0], counters[1], counters[2], counters[3])
    if not root:
        comm.send_root(("d", records, failure, snap, stats, hashes))
        comm.flush()
    else:
        done[0] = (records, failure, snap, stats, hashes)
        delay = 1e-3
        while len(done) < comm.size:
            before = len(done)
            absorb()
            if len(done) == before:
                time.sleep(delay)
                delay = min(0.05, delay * 1.5)
        bar.update(0, snap, force=True)
        bar.close()
    t = stats.lap("wait", t)
    outcome: tuple[dict[str, Any] | None, list[Failure | None], list[RankStats]] = (
        None, [], [])
    if root:
        fails = [done[r][1] for r in range(comm.size)]
        per_rank = [done[r][3] for r in range(comm.size)]
        manifest = None
        if not any(fails):
            all_records: dict[int, dict[str, Any]] = {}
            all_hashes: dict[int, str | None] = {}
            for r in range(comm.size):
                all_records.update(done[r][0])
                all_hashes.update(done[r][4])
            try:
                manifest = _finish(cfg, shards, all_records, all_hashes)
            except Exception as exc:
                fails[0] = (None, f"cannot write the manifest: {_describe(exc)}")
        outcome = (manifest, fails, per_rank)
    outcome = comm.bcast(outcome)
    manifest, fails, per_rank = outcome
    _check(comm, fails)
    assert manifest is not None
    return PrepareResult(manifest, cfg.out, comm.size, 0.0, len(sources), per_rank)


def _finish(cfg: PrepareConfig, shards: list[Shard], records: dict[int, dict[str, Any]],
            model_hashes: dict[int, str | None]) -> dict[str, Any]:
    """Rank 0, every rank done: drop shards of an earlier, larger plan, write the
    manifest (temp + os.replace)."""
    n = len(shards)
    for e in os.scandir(cfg.out):
        name = e.name
        if name.startswith("shard-") and name.endswith((".tez", ".tez" + _SIDE)):
            stem = name[len("shard-"):].split(".", 1)[0]
            if stem.isdigit() and len(stem) == 6 and int(stem) >= n:
                with contextlib.suppress(OSError):
                    os.unlink(e.path)
    entries = []
    first = 0
    for sh in shards:
        rec = records[sh.index]
        entries.append({**rec, "first_frame": first})
        first += rec["frames"]
    hashes = {model_hashes.get(sh.index) for sh in shards}
    manifest = build_manifest(cfg.codec, entries, hashes.pop() if len(hashes) == 1 else None)
    _write_json(cfg.out / MANIFEST, manifest, manifest_text(manifest))
    return manifest


def build_manifest(codec: CodecConfig, entries: list[dict[str, Any]],
                   model_hash: str | None = None) -> dict[str, Any]:
    raw = sum(math.prod(e["shape"]) * np.dtype(e["dtype"]).itemsize for e in entries)
    return {"format": FORMAT, "version": VERSION, "created_by": f"tezip {__version__}",
            "codec": codec.to_dict(), "model_hash": model_hash,
            "total_frames": sum(e["frames"] for e in entries), "total_raw_bytes": raw,
            "total_bytes": sum(e["bytes"] for e in entries), "shards": entries}


# ---------------------------------------------------------------------------------------
# reading and checking a data set


def load_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a prepared data set, checked for its format and version."""
    path = Path(directory) / MANIFEST
    try:
        m = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path} does not exist; is {directory} a data set written by "
                         "`tezip prepare` (and did that run finish)?") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read {path}: {_describe(exc)}") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT or not isinstance(
            m.get("shards"), list):
        raise InputError(f"{path} is not a tezip data set manifest")
    if m.get("version") != VERSION:
        raise InputError(f"{path} has manifest version {m.get('version')}; this tezip "
                         f"reads version {VERSION}")
    return m


def is_dataset_dir(path: str | os.PathLike[str]) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, MANIFEST))


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


def verify_dataset(directory: str | os.PathLike[str],
                   progress: Callable[[int], None] | None = None) -> DatasetReport:
    """Check every shard of a data set against its manifest: present, size, sha256, and
    a .tez whose shape and dtype are the declared ones."""
    m = load_manifest(directory)
    rep = DatasetReport(str(directory), shards=len(m["shards"]))
    expect_first = 0
    for i, e in enumerate(m["shards"]):
        try:
            name = str(e["file"])
            size, digest = int(e["bytes"]), str(e["sha256"])
            shape, dtype = [int(v) for v in e["shape"]], np.dtype(e["dtype"]).name
            first = int(e["first_frame"])
        except (KeyError, TypeError, ValueError, OverflowError):
            rep.problems.append((f"shard #{i}", "manifest entry is incomplete"))
            continue
        problem = None
        path = Path(directory) / name
        if os.sep in name or name != os.path.basename(name):
            problem = "manifest names a file outside the data set"
        elif first != expect_first:
            problem = f"first_frame {first}, expected {expect_first}"
        elif not path.is_file():
            problem = "missing"
        elif path.stat().st_size != size:
            problem = f"size {path.stat().st_size} bytes, manifest says {size}"
        elif sha256_file(path) != digest:
            problem = "sha256 does not match the manifest (damaged)"
        else:
            try:
                with TezFile(path) as f:
                    if list(f.shape) != shape or f.dtype.name != dtype:
                        problem = (f"holds {tuple(f.shape)} {f.dtype.name}, manifest says "
                                   f"{tuple(shape)} {dtype}")
            except TezipError as exc:
                problem = f"not a readable .tez: {exc}"
        expect_first += shape[0]
        rep.frames += shape[0]
        rep.bytes += size
        if problem:
            rep.problems.append((name, problem))
        else:
            rep.ok += 1
        if progress:
            progress(1)
    if m.get("total_frames") != rep.frames:
        rep.problems.append((MANIFEST, f"total_frames {m.get('total_frames')} but the shards "
                                       f"hold {rep.frames}"))
    return rep
