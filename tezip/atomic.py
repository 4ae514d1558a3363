"""The one way tezip writes an output (file or directory): every writer goes through
``AtomicOutput`` (or the ``atomic_output`` context manager built on it).

    with atomic_output("out.npy", force=False) as tmp:
        write_everything_to(tmp)          # renamed to out.npy only if this block succeeds

What it guarantees:

- Before anything is written, the target is checked: its directory exists; an existing
  target is refused without ``force``; an existing target that is not a regular file (a
  device such as ``/dev/null``, a FIFO, a socket, a directory where a file goes, a file
  where a directory goes) is refused even with ``force``; ``-`` (standard output) is
  refused; a name longer than the file system allows is refused with that reason.
- Data go to a hidden temporary name next to the target (``.NAME.<random>.tmp``,
  shortened so that it fits the file system's NAME_MAX even when NAME does), are fsynced,
  and only then renamed to the target; the directory is fsynced after the rename.
- Without ``force`` the rename never replaces a file that appeared meanwhile (another
  process writing the same name): ``renameat2(RENAME_NOREPLACE)`` where the kernel and
  file system have it, else link-then-unlink (files) or check-then-rename.
- On any failure, or ``abort()``, the temporary file or directory is removed.

Errors are ``OutputError`` / ``OutputExistsError`` with a message a user can act on. This
module imports only the standard library.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from typing import Self

from .errors import OutputError, OutputExistsError

_NAME_MAX = 255
_TEMP_SUFFIX_LEN = 1 + 12 + 4      # ".<12 hex>.tmp"


def reason(exc: BaseException) -> str:
    """What an exception says, on one line: for an OSError with an errno, the system's
    own words (h5py packs pages of driver detail around them)."""
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno)
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    if re.fullmatch(r"\d+ requested and \d+ written", text.strip()):
        return "short write: the disk is full or a file size limit (ulimit -f) was reached"
    return " ".join(text.split()) or type(exc).__name__


def _name_max(directory: str) -> int:
    try:
        return int(os.pathconf(directory or ".", "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return _NAME_MAX


def temp_name(path: str | os.PathLike[str]) -> str:
    """A hidden, random name next to ``path`` that fits the file system's NAME_MAX:
    ``.NAME.<12 hex>.tmp``, with NAME shortened (at a byte boundary) when needed."""
    head, name = os.path.split(os.path.normpath(os.fspath(path)))
    budget = max(1, _name_max(head) - 1 - _TEMP_SUFFIX_LEN)
    raw = os.fsencode(name)
    if len(raw) > budget:
        name = os.fsdecode(raw[:budget])
    return os.path.join(head, f".{name}.{secrets.token_hex(6)}.tmp")


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "a regular file" if stat.S_ISREG(mode) else "a special file"


def check_target(path: str | os.PathLike[str], *, force: bool = False,
                 directory: bool = False,
                 replaceable: Callable[[os.DirEntry], bool] | None = None) -> None:
    """Raise unless ``path`` may become the output: see the module docstring.
    ``directory``: the output is a directory; with ``force`` an existing one is replaced
    only if ``replaceable(entry)`` holds for each of its entries (default: none may
    exist)."""
    path = os.fspath(path)
    if path in ("-", ""):
        raise OutputError("tezip writes its output to a file, not to standard output; "
                          "give an output file name")
    head, name = os.path.split(os.path.normpath(path))
    parent = head or "."
    if not os.path.isdir(parent):
        raise OutputError(f"cannot write {path}: directory {parent} does not exist")
    limit = _name_max(parent)
    if len(os.fsencode(name)) > limit:
        raise OutputError(f"cannot write {path}: the name is {len(os.fsencode(name))} bytes "
                          f"long; the file system allows {limit}")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {reason(exc)}") from exc
    mode = st.st_mode
    if directory:
        if not stat.S_ISDIR(mode):
            raise OutputExistsError(f"{path} exists and is {_kind(mode)}, not a directory; tezip "
                              "will not replace it, even with --force; choose another output")
    elif not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise OutputExistsError(f"{path} is {_kind(mode)}, not a regular file; tezip will not "
                          "write over it, even with --force; choose another output")
    if not force:
        raise OutputExistsError(f"{path} already exists; use --force to overwrite it")
    if directory:
        others = [e.name for e in os.scandir(path) if replaceable is None or not replaceable(e)]
        if others:
            raise OutputExistsError(
                f"{path} holds files other than frame images (e.g. {others[0]}); "
                "tezip will not replace it, even with --force; remove it yourself")


def remove(path: str) -> None:
    """Delete a file or a directory tree if it exists."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            os.remove(path)


def _fsync_path(path: str, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if not directory or exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise        # some file systems cannot fsync a directory; data files must be
    finally:
        os.close(fd)


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100
_renameat2: Callable[..., int] | None | bool = False   # False: not looked up yet


def _libc_renameat2() -> Callable[..., int] | None:
    global _renameat2
    if _renameat2 is False:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fn = getattr(libc, "renameat2", None)
            if fn is not None:
                fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                               ctypes.c_uint]
                fn.restype = ctypes.c_int
            _renameat2 = fn
        except (OSError, AttributeError):
            _renameat2 = None
    return _renameat2  # type: ignore[return-value]


def rename_noreplace(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst``; FileExistsError if ``dst`` exists, whatever appeared
    there since it was last checked (atomic where the system allows)."""
    fn = _libc_renameat2()
    if fn is not None:
        import ctypes

        if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise FileExistsError(err, os.strerror(err), dst)
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), dst)
    if not os.path.isdir(src) or os.path.islink(src):
        try:
            os.link(src, dst, follow_symlinks=False)   # fails if dst exists: atomic
        except FileExistsError:
            raise
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK,
                                 errno.EXDEV):
                raise
        else:
            os.unlink(src)
            return
    if os.path.lexists(dst):      # last resort (no renameat2, no hard links): a tiny window
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
    os.rename(src, dst)


_FALLOC_FL_KEEP_SIZE = 1
_FALLOC_FL_PUNCH_HOLE = 2


def _fallocate(fd: int, mode: int, offset: int, length: int) -> int:
    """Linux fallocate(2); 0, or the errno (EOPNOTSUPP where it does not exist)."""
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return errno.EOPNOTSUPP
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return 0 if fn(fd, mode, offset, length) == 0 else ctypes.get_errno()


def reserve(path: str, nbytes: int) -> bool:
    """Allocate ``nbytes`` of disk beyond the end of file ``path`` without changing its
    size, so that a library that cannot recover from a full disk (HDF5) never meets one
    while it fills them. OSError (ENOSPC) if the disk cannot hold them; False where the
    file system cannot reserve (then the caller runs without a reservation)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        err = _fallocate(fd, _FALLOC_FL_KEEP_SIZE, os.fstat(fd).st_size, max(1, nbytes))
    finally:
        os.close(fd)
    if err in (0,):
        return True
    if err in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO):
        raise OSError(err, os.strerror(err), path)
    return False


def release(path: str, nbytes: int) -> None:
    """Give back what ``reserve(path, nbytes)`` allocated and the file did not use."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY)
        try:
            _fallocate(fd, _FALLOC_FL_KEEP_SIZE | _FALLOC_FL_PUNCH_HOLE,
                       os.fstat(fd).st_size, max(1, nbytes))
        finally:
            os.close(fd)


def check_space(path: str | os.PathLike[str], nbytes: int,
                largest_file: int | None = None) -> None:
    """Refuse up front (OutputError) an output ``path`` of ``nbytes`` that the file
    system's free space cannot hold, or whose largest file (``largest_file``, default
    ``nbytes``) exceeds the process's file size limit (``ulimit -f``). Writers still
    handle a full disk when it comes (the free space may shrink meanwhile)."""
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    try:
        st = os.statvfs(parent)
        free = st.f_bavail * st.f_frsize
    except (OSError, AttributeError):
        free = None
    if free is not None and nbytes > free:
        raise OutputError(f"cannot write {path}: it needs {nbytes / 1e6:.1f} MB and "
                          f"{parent} has {free / 1e6:.1f} MB free")
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):
        return
    biggest = nbytes if largest_file is None else largest_file
    if soft != resource.RLIM_INFINITY and biggest > soft:
        raise OutputError(f"cannot write {path}: it needs files of {biggest / 1e6:.1f} MB "
                          f"but this process may write files of {soft / 1e6:.1f} MB at most "
                          "(ulimit -f)")


class AtomicOutput:
    """An output under construction at ``self.temp``; ``commit()`` publishes it under
    ``path``, ``abort()`` removes it. The checks run in the constructor, before any byte
    is written. ``directory``: the output is a directory (created by the writer at
    ``self.temp``). ``replaceable``: see ``check_target``."""

    def __init__(self, path: str | os.PathLike[str], *, force: bool = False,
                 directory: bool = False,
                 replaceable: Callable[[os.DirEntry], bool] | None = None) -> None:
        self.path = os.fspath(path)
        self.force = force
        self.directory = directory
        self.replaceable = replaceable
        check_target(self.path, force=force, directory=directory, replaceable=replaceable)
        self.temp = temp_name(self.path)
        self.state = "open"

    def need(self, nbytes: int, largest_file: int | None = None) -> None:
        """``check_space`` for this output."""
        check_space(self.path, nbytes, largest_file)

    def commit(self) -> None:
        """fsync the temporary output, rename it to ``path`` (without ``force``: never
        over a file that appeared meanwhile), fsync the directory. On failure the
        temporary output is removed and OutputError / OutputExistsError raised."""
        if self.state != "open":
            raise OutputError(f"output {self.path} is already {self.state}")
        try:
            if self.directory:
                for entry in os.scandir(self.temp):
                    if entry.is_file(follow_symlinks=False):
                        _fsync_path(entry.path)
                _fsync_path(self.temp, directory=True)
            else:
                _fsync_path(self.temp)
            self._publish()
            with contextlib.suppress(OSError):
                _fsync_path(os.path.dirname(os.path.abspath(self.path)), directory=True)
        except FileExistsError:
            self.abort()
            raise OutputExistsError(f"{self.path} appeared while tezip was writing it (another "
                                    "process?); it was left as it is; use --force to "
                                    "overwrite it") from None
        except OSError as exc:
            self.abort()
            raise OutputError(f"cannot write {self.path}: {reason(exc)}") from exc
        except BaseException:
            self.abort()
            raise
        self.state = "committed"

    def _publish(self) -> None:
        if not self.force:
            rename_noreplace(self.temp, self.path)
            return
        # --force: the target may be replaced, but only by the kind of thing it is
        check_target(self.path, force=True, directory=self.directory,
                     replaceable=self.replaceable)
        if not self.directory:
            os.replace(self.temp, self.path)
            return
        old = None
        if os.path.lexists(self.path):
            old = temp_name(self.path)
            os.rename(self.path, old)
        try:
            rename_noreplace(self.temp, self.path)
        except BaseException:
            if old is not None:
                with contextlib.suppress(OSError):
                    os.rename(old, self.path)
            raise
        if old is not None:
            remove(old)

    def abort(self) -> None:
        """Remove the temporary output; safe to call more than once."""
        if self.state == "committed":
            return
        remove(self.temp)
        self.state = "aborted"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            if self.state == "open":
                self.commit()
        else:
            self.abort()


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], *, force: bool = False,
                  directory: bool = False) -> Iterator[str]:
    """``with atomic_output(path, force=...) as tmp:`` write ``tmp``; it becomes ``path``
    when the block ends without an exception (see ``AtomicOutput``), else it is removed."""
    out = AtomicOutput(path, force=force, directory=directory)
    try:
        yield out.temp
    except BaseException:
        out.abort()
        raise
    out.commit()
