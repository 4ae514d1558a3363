"""The ranks of a ``tezip prepare`` run: one rank without MPI, or mpi4py's COMM_WORLD.

Without an MPI launcher (no PMI_*/OMPI_*/PMIX_* variables) the run is a single rank and
mpi4py is not even imported. ``TEZIP_MPI=0`` forces a single rank, ``TEZIP_MPI=1`` forces
the import of mpi4py.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Protocol

import numpy as np

from .. import mpi_env
from ..errors import OptionError

_TAG = 4242
_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE",
                  "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS", "HYDI_CONTROL_FD")
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


class Comm(Protocol):
    """Collectives for the phases, and small point-to-point messages (progress, work
    requests and grants) that never block the sender."""

    rank: int
    size: int

    def allgather(self, obj: Any) -> list[Any]: ...
    def allreduce_sum(self, values: np.ndarray) -> None: ...
    def allreduce_max(self, value: float) -> float: ...
    def bcast(self, obj: Any) -> Any: ...
    def send(self, obj: Any, dest: int) -> None: ...
    def poll(self) -> list[tuple[int, Any]]: ...
    def flush(self) -> None: ...


class SerialComm:
    """The world of one rank."""

    rank = 0
    size = 1

    def allgather(self, obj: Any) -> list[Any]:
        return [obj]

    def allreduce_sum(self, values: np.ndarray) -> None:
        pass

    def allreduce_max(self, value: float) -> float:
        return value

    def bcast(self, obj: Any) -> Any:
        return obj

    def send(self, obj: Any, dest: int) -> None:
        raise RuntimeError("a world of one rank has no one to send to")

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

    def allreduce_sum(self, values: np.ndarray) -> None:
        """Sum a contiguous float array over the ranks, in place (gradients: every
        rank calls it once per training step, so no settling sleep)."""
        self._c.Allreduce(self._mpi.IN_PLACE, values, op=self._mpi.SUM)

    def allreduce_max(self, value: float) -> float:
        return float(self._c.allreduce(float(value), op=self._mpi.MAX))

    def send(self, obj: Any, dest: int) -> None:
        self._reqs = [r for r in self._reqs if not r.Test()]
        self._reqs.append(self._c.isend(obj, dest=dest, tag=_TAG))

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
