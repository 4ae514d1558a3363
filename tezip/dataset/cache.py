"""Node-local staging of shards: a size-bounded directory of shard copies on local disk,
shared by every process of the node (file locks), least recently used evicted first.

A shard is copied on its first use in one sequential read from the data set directory
(shared storage), checked against the manifest's size and sha256 (a mismatch raises
``CorruptFileError`` and nothing is kept), written under a temporary name and renamed
(``tezip.io.atomic_output``). Entries are named by their sha256. No torch.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from ..errors import CorruptFileError, InputError, OptionError
from ..io import atomic_output
from .manifest import ShardInfo

Reader = Callable[[Path], BinaryIO]
_STALE_TEMP_SECONDS = 3600


def default_reader(path: Path) -> BinaryIO:
    return open(path, "rb")  # noqa: SIM115 - the caller closes it


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _touch(path: Path) -> None:
    """Mark as used now, with the clock's full resolution (file times set by the kernel
    are coarser, which would make the LRU order of quick successive uses arbitrary)."""
    now = time.time_ns()
    os.utime(path, ns=(now, now))


class ShardCache:
    """See the module docstring. ``reader`` replaces ``open(path, "rb")`` for the copies
    (e.g. to throttle them in a benchmark). Thread-safe; pickles without its lock."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int,
                 reader: Reader | None = None) -> None:
        if max_bytes <= 0:
            raise OptionError(f"cache_bytes must be positive, got {max_bytes}")
        self.dir = Path(directory)
        self.max_bytes = int(max_bytes)
        self.reader = reader or default_reader
        self._lock = threading.Lock()
        self._staged = 0               # bytes this process read from shared storage
        try:
            (self.dir / ".locks").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OptionError(f"cache_dir {self.dir}: cannot create it ({exc.strerror})") \
                from None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_lock"]
        state["_staged"] = 0
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def staged_bytes(self) -> int:
        """Bytes this process has read from shared storage."""
        with self._lock:
            return self._staged

    @staticmethod
    def entry_name(shard: ShardInfo, root: Path) -> str:
        if shard.sha256:
            return shard.sha256.lower() + Path(shard.file).suffix
        key = hashlib.sha256(f"{root.resolve()}/{shard.file}".encode()).hexdigest()[:32]
        return f"unverified-{key}{Path(shard.file).suffix}"

    def entries(self) -> list[Path]:
        return [p for p in self.dir.iterdir() if p.is_file() and not p.name.startswith(".")]

    def total_bytes(self) -> int:
        total = 0
        for p in self.entries():
            with contextlib.suppress(FileNotFoundError):
                total += p.stat().st_size
        return total

    def stage(self, root: Path, shard: ShardInfo) -> Path:
        """The local copy of ``shard`` (copied now if missing); marks it recently used."""
        return self.stage_counted(root, shard)[0]

    def stage_counted(self, root: Path, shard: ShardInfo) -> tuple[Path, int]:
        """``stage`` and the number of bytes this call read from shared storage."""
        name = self.entry_name(shard, root)
        dst = self.dir / name
        with _locked(self.dir / ".locks" / name):
            if dst.exists():
                with contextlib.suppress(FileNotFoundError):
                    _touch(dst)
                    return dst, 0
            n = self._copy(root / shard.file, dst, shard)
            _touch(dst)
        with self._lock:
            self._staged += n
        with _locked(self.dir / ".locks" / ".evict"):
            self._evict(keep=dst)
        return dst, n

    def _copy(self, src: Path, dst: Path, shard: ShardInfo) -> int:
        h = hashlib.sha256()
        n = 0
        with atomic_output(dst) as tmp, open(tmp, "wb") as out:
            try:
                f = self.reader(src)
            except FileNotFoundError:
                raise InputError(f"{src}: shard listed in the manifest is missing") from None
            except OSError as exc:
                raise InputError(f"{src}: cannot open ({exc.strerror})") from None
            with f:
                while block := f.read(1 << 22):
                    h.update(block)
                    out.write(block)
                    n += len(block)
            if shard.bytes is not None and n != shard.bytes:
                raise CorruptFileError(f"{src}: {n} bytes, the manifest says {shard.bytes}; the "
                                       "shard is truncated or was rewritten after the manifest")
            if shard.sha256 and h.hexdigest() != shard.sha256.lower():
                raise CorruptFileError(f"{src}: sha256 does not match the manifest; the shard "
                                       "on shared storage is damaged or was rewritten")
        return n

    def _evict(self, keep: Path | None = None) -> None:
        items = []
        for p in self.entries():
            with contextlib.suppress(FileNotFoundError):
                st = p.stat()
                items.append((st.st_mtime_ns, p.name, p, st.st_size))
        total = sum(i[3] for i in items)
        for _, _, p, size in sorted(items):
            if total <= self.max_bytes:
                break
            if p == keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                p.unlink()   # processes that have it open keep reading it (POSIX)
            total -= size
        # temporary files of copies that died with their process
        now = time.time()
        for p in self.dir.glob(".*.tmp-*"):
            with contextlib.suppress(FileNotFoundError):
                if now - p.stat().st_mtime > _STALE_TEMP_SECONDS:
                    p.unlink()
