"""Window scheduling. SWP: fixed-length windows, each starting with a keyframe and
decodable on its own (random access, parallel decode)."""

from __future__ import annotations

# a window holds at most this many values, so a decoder never allocates more than a few
# GiB for one window whatever a header claims
MAX_WINDOW_VALUES = 1 << 27


def window_length(requested: int, frame_values: int) -> int:
    """Frames per window: the requested length, shortened for very large frames."""
    return max(1, min(requested, MAX_WINDOW_VALUES // max(1, frame_values)))


def fixed_windows(n_frames: int, length: int) -> list[tuple[int, int]]:
    """[t0, t1) ranges of ``length`` frames (the last one may be shorter)."""
    return [(t0, min(n_frames, t0 + length)) for t0 in range(0, max(0, n_frames), length)]
