"""Under Slurm, tasks that srun started without wiring them into one MPI world (no PMI
variables) must not each run the whole job as "1 rank" (issue 14, item 14)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import smooth_stack

from tezip import mpi_env
from tezip.errors import OptionError

SRUN_TASK = {"SLURM_JOB_ID": "42", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0",
             "SLURM_STEP_NUM_TASKS": "2"}
BATCH_SCRIPT = {"SLURM_JOB_ID": "42", "SLURM_NTASKS": "4", "SLURM_PROCID": "0",
                "ENVIRONMENT": "BATCH"}


def test_slurm_tasks_from_the_environment():
    assert mpi_env.slurm_tasks({**SRUN_TASK, "SLURM_PROCID": "1"}) == (1, 2)
    assert mpi_env.slurm_tasks({**SRUN_TASK, "SLURM_PROCID": "0"}) == (0, 2)
    # only the rank variables (an srun that exports nothing else): rank 1 of 2 is sure
    assert mpi_env.slurm_tasks({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}) == (1, 2)
    assert mpi_env.slurm_tasks(BATCH_SCRIPT) is None        # the batch script: one process
    assert mpi_env.slurm_tasks({}) is None
    assert mpi_env.slurm_tasks({"SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}) is None
    with pytest.raises(OptionError, match="srun --mpi=pmi2"):
        mpi_env.check_world(1, {**SRUN_TASK, "SLURM_PROCID": "0"})
    mpi_env.check_world(2, {**SRUN_TASK, "SLURM_PROCID": "0"})
    mpi_env.check_world(1, BATCH_SCRIPT)


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "MPI_LOCAL", "HYDI_", "SLURM_"))}
    return {**env, "TEZIP_DEBUG": "", **extra}


def prepare(tmp_path, out, extra):
    return subprocess.Popen([sys.executable, "-m", "tezip", "prepare", str(tmp_path / "a.npy"),
                             "--out", str(tmp_path / out), "--bound", "1e-3", "--quiet"],
                            env=_env(extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_srun_without_pmi_is_refused_by_every_task(tmp_path):
    np.save(tmp_path / "a.npy", smooth_stack((8, 16, 16)))
    for env in ([{**SRUN_TASK, "SLURM_PROCID": str(r)} for r in range(2)],
                [{"SLURM_PROCID": str(r), "SLURM_NTASKS": "2"} for r in (1,)]):
        procs = [prepare(tmp_path, "ds", e) for e in env]
        for p in procs:
            _, err = p.communicate(timeout=120)
            lines = err.strip().splitlines()
            assert p.returncode == 1, err
            assert len(lines) == 1 and "srun --mpi=pmi2" in lines[0], err
        assert not (tmp_path / "ds" / "manifest.json").exists()


def test_batch_script_itself_runs_as_one_rank(tmp_path):
    np.save(tmp_path / "a.npy", smooth_stack((8, 16, 16)))
    p = prepare(tmp_path, "ds", BATCH_SCRIPT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert (tmp_path / "ds" / "manifest.json").exists()
