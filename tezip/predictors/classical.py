"""Classical predictors on the integer code grid. All arithmetic is int64 and exact
(wrapping on overflow the same way on both sides), so decoding reproduces encoding
bit for bit on any machine."""

from __future__ import annotations

import numpy as np

_SPACE = (0, 1, 2)  # predicted axes: time, y, x; a trailing channel axis rides along


def _diff(a: np.ndarray, axis: int) -> np.ndarray:
    return np.diff(a, axis=axis, prepend=np.zeros_like(a.take([0], axis=axis)))


def _lorenzo(q: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    r = q
    for ax in axes:
        r = _diff(r, ax)
    return r


def _unlorenzo(r: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    q = r
    for ax in axes:
        q = np.cumsum(q, axis=ax, dtype=np.int64)
    return q


class Zero:
    """No prediction: the codes themselves (useful for noise-like data)."""

    name = "zero"

    def residuals(self, q: np.ndarray) -> np.ndarray:
        return q.copy()

    def reconstruct(self, r: np.ndarray) -> np.ndarray:
        return r.copy()


class Lorenzo3D:
    """3-D Lorenzo over (t, y, x); on the keyframe it reduces to 2-D Lorenzo."""

    name = "lorenzo"

    def residuals(self, q: np.ndarray) -> np.ndarray:
        return _lorenzo(q, _SPACE)

    def reconstruct(self, r: np.ndarray) -> np.ndarray:
        return _unlorenzo(r, _SPACE)


class Lorenzo2D:
    """2-D Lorenzo within each frame (no use of time)."""

    name = "spatial"

    def residuals(self, q: np.ndarray) -> np.ndarray:
        return _lorenzo(q, (1, 2))

    def reconstruct(self, r: np.ndarray) -> np.ndarray:
        return _unlorenzo(r, (1, 2))


class Previous:
    """The previous reconstructed frame; the keyframe is coded with 2-D Lorenzo."""

    name = "previous"

    def residuals(self, q: np.ndarray) -> np.ndarray:
        r = _diff(q, 0)
        r[:1] = _lorenzo(q[:1], (1, 2))
        return r

    def reconstruct(self, r: np.ndarray) -> np.ndarray:
        q = r.copy()
        q[:1] = _unlorenzo(r[:1], (1, 2))
        return np.cumsum(q, axis=0, dtype=np.int64)


def _sl(ndim: int, axis: int, s: slice) -> tuple[slice, ...]:
    idx = [slice(None)] * ndim
    idx[axis] = s
    return tuple(idx)


class Interpolation:
    """Multilevel interpolation (the SZ3 default's family): a coarse-to-fine hierarchy over
    (t, y, x); each level predicts odd-indexed points along one axis from the already
    decoded even ones, cubic where four neighbours exist, linear where two, else the left
    neighbour. Each level and axis is one vectorized numpy step."""

    name = "interp"

    @staticmethod
    def _steps(shape: tuple[int, ...]):
        top = 1
        while top < max(shape[:3]):
            top *= 2
        s = top // 2
        while s >= 1:
            for d in _SPACE:
                sel = []
                for a in range(len(shape)):
                    if a > 2:
                        sel.append(slice(None))
                    elif a < d or a == d:
                        sel.append(slice(None, None, s))
                    else:
                        sel.append(slice(None, None, 2 * s))
                if shape[d] > s:
                    yield tuple(sel), d, s
            s //= 2

    @staticmethod
    def _predict(line: np.ndarray, d: int, s: int) -> np.ndarray:
        """line: the sub-lattice view (full along d at spacing s); predict its odd
        entries along d from its even entries."""
        nd = line.ndim
        even = line[_sl(nd, d, slice(0, None, 2))]
        n_odd = line.shape[d] // 2
        n_even = even.shape[d]
        left = even[_sl(nd, d, slice(0, n_odd))]
        pred = left.copy()
        n_lin = min(n_odd, n_even - 1)           # odd k with a right neighbour k+1
        if n_lin > 0:
            a = even[_sl(nd, d, slice(0, n_lin))]
            b = even[_sl(nd, d, slice(1, n_lin + 1))]
            pred[_sl(nd, d, slice(0, n_lin))] = (a + b + 1) >> 1
        # cubic for 1 <= k and k + 2 < n_even
        hi = min(n_odd, n_even - 2)
        if hi > 1:
            a = even[_sl(nd, d, slice(0, hi - 1))]
            b = even[_sl(nd, d, slice(1, hi))]
            c = even[_sl(nd, d, slice(2, hi + 1))]
            e = even[_sl(nd, d, slice(3, hi + 2))]
            pred[_sl(nd, d, slice(1, hi))] = (9 * (b + c) - a - e + 8) >> 4
        return pred

    def residuals(self, q: np.ndarray) -> np.ndarray:
        r = np.empty_like(q)
        r[(0, 0, 0)] = q[(0, 0, 0)]
        for sel, d, s in self._steps(q.shape):
            line = q[sel]
            odd = _sl(line.ndim, d, slice(1, None, 2))
            rv = r[sel]
            rv[odd] = line[odd] - self._predict(line, d, s)
        return r

    def reconstruct(self, r: np.ndarray) -> np.ndarray:
        q = np.empty_like(r)
        q[(0, 0, 0)] = r[(0, 0, 0)]
        for sel, d, s in self._steps(r.shape):
            line = q[sel]
            odd = _sl(line.ndim, d, slice(1, None, 2))
            line[odd] = self._predict(line, d, s) + r[sel][odd]
        return q
