"""The allocator settings (``tezip.allocator``): when they apply, and that they keep a
window's buffers between windows (page faults counted, not time)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tezip import allocator

GLIBC = (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc") if hasattr(
    os, "confstr") else False


@pytest.mark.parametrize("env, why", [
    ({"TEZIP_MALLOC": "system"}, "TEZIP_MALLOC=system"),
    ({"TEZIP_MALLOC": " System "}, "TEZIP_MALLOC=system"),
    ({"MALLOC_TRIM_THRESHOLD_": "1"}, "set in the environment (MALLOC_TRIM_THRESHOLD_)"),
    ({"MALLOC_MMAP_THRESHOLD_": "1", "MALLOC_TOP_PAD_": "0"},
     "set in the environment (MALLOC_MMAP_THRESHOLD_, MALLOC_TOP_PAD_)"),
    ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"},
     "set in the environment (GLIBC_TUNABLES)"),
])
def test_the_users_choice_leaves_the_allocator_alone(env, why):
    assert allocator._reason_not(env) == why


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_applies_on_glibc_without_settings_of_the_users():
    assert allocator._reason_not({"GLIBC_TUNABLES": "glibc.cpu.x86_foo=1"}) is None
    assert allocator._reason_not({"TEZIP_MALLOC": "tuned"}) is None


_CHILD = r"""
import json, resource
import numpy as np
import tezip
from tezip import allocator
rng = np.random.default_rng(0)
# 64 x 128 x 128 float32 (4 MiB, two windows), built frame by frame: a temporary of
# megabytes freed here would raise glibc's own thresholds before tezip runs (as loading
# a .npy file in a fresh process does not)
x = np.empty((64, 128, 128), np.float32)
yy, xx = np.mgrid[0:128, 0:128].astype(np.float32)
for t in range(64):
    x[t] = (np.sin(xx / 9 + t / 7) * np.cos(yy / 11 - t / 13)
            + 0.01 * rng.standard_normal((128, 128), dtype=np.float32))
tezip.decompress(tezip.compress(x, mode="rel", bound=1e-3, predictor="classical", threads=1))
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    tezip.compress(x, mode="rel", bound=1e-3, predictor="classical", threads=1)
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print(json.dumps([allocator.configure(), (f1 - f0) / 3]))
"""


def _faults(malloc: str) -> tuple[str, float]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    env["TEZIP_MALLOC"] = malloc
    p = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                       text=True, check=True, timeout=600)
    state, faults = json.loads(p.stdout.strip().splitlines()[-1])
    return state, faults


@pytest.mark.skipif(not GLIBC or not sys.platform.startswith("linux"),
                    reason="glibc on Linux only")
def test_windows_buffers_are_kept_between_windows():
    """With the settings, compressing a stack again touches few new pages; with glibc's
    own (``TEZIP_MALLOC=system``), its buffers are faulted in afresh (about 530 pages a
    compression of this stack, 300-860 of the shared stacks loaded from .npy files)."""
    tuned, tuned_faults = _faults("tuned")
    system, system_faults = _faults("system")
    assert (tuned, system) == ("tuned", "TEZIP_MALLOC=system")
    assert system_faults > 200           # the control: without, the buffers do fault in
    assert tuned_faults < system_faults / 10
