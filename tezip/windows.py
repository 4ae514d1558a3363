"""Window scheduling. SWP: fixed-length windows, each starting with a keyframe and
decodable on its own (random access, parallel decode)."""

from __future__ import annotations

# a window holds at most this many values, so a decoder never allocates more than a few
# GiB for one window whatever a header claims
MAX_WINDOW_VALUES = 1 << 27
DEFAULT_WINDOW = 33        # 2^5 + 1 frames: the last frame of a window lies on the
#                            interpolation's anchor grid (32 apart), so no frame is
#                            extrapolated in time (windows of 32 coded two smooth fields
#                            8-42% larger, the shared stacks up to 1% larger, a Gray-Scott
#                            run 1.1% smaller at 1e-2: benchmarks/results/edges.md)
AUTO_WINDOW_VALUES = 1 << 18   # an automatic window (no length asked for) of small frames
#                                is lengthened to hold at least this many values
#                                (``benchmarks/results/small_frames.md``: on stacks of
#                                16 x 16 to 64 x 64 frames, windows of 33 frames coded
#                                1.05-1.98x larger than windows of this many values, and
#                                encoded at 0.56-1.01x the speed; 1 x 1 frames made files
#                                larger than the data); frames of 7,944 values
#                                or more (90 x 90) keep DEFAULT_WINDOW
ANCHOR_FRAMES = 32             # (``predictors.classical.DEFAULT_ANCHOR``: a lengthened
#                                window is 1 more than a multiple of it, as DEFAULT_WINDOW)


def window_length(requested: int | None, frame_values: int) -> int:
    """Frames per window: ``requested`` (None: automatic, ``DEFAULT_WINDOW``, or for
    frames of fewer than AUTO_WINDOW_VALUES / DEFAULT_WINDOW values the fewest frames
    ``ANCHOR_FRAMES`` k + 1 that hold AUTO_WINDOW_VALUES), shortened for very large
    frames (a window holds at most MAX_WINDOW_VALUES values)."""
    fv = max(1, frame_values)
    n = requested
    if n is None:
        n = DEFAULT_WINDOW
        if n * fv < AUTO_WINDOW_VALUES:
            n = -(-(-(-AUTO_WINDOW_VALUES // fv) - 1) // ANCHOR_FRAMES) * ANCHOR_FRAMES + 1
    return max(1, min(n, MAX_WINDOW_VALUES // fv))


TRANSFORM_WINDOW_VALUES = 1 << 22   # a window coded by the transform (``predictors.
#                                     transform``) is lengthened while it holds at most
#                                     this many values (frames past the first)...
TRANSFORM_MAX_FRAMES = 4 * ANCHOR_FRAMES + 1   # ... up to this many frames: the wavelet's
#                                     levels along time grow with the window's length
#                                     (``benchmarks/results/transform.md``: Gray-Scott's
#                                     160 frames of 128 x 128 coded 1.7-2.1x smaller in
#                                     windows of 129 frames than of 33, the blobs' 1.5-1.9x)


def transform_window(length: int, frame_values: int) -> int:
    """An automatic window of ``length`` frames lengthened for the transform coder: doubled
    (2 (n - 1) + 1 frames, on the anchor grid still) while it stays within
    TRANSFORM_MAX_FRAMES frames and its frames past the first hold at most
    TRANSFORM_WINDOW_VALUES values (and within MAX_WINDOW_VALUES); never shortened."""
    fv = max(1, frame_values)
    n = length
    while (2 * (n - 1) + 1 <= TRANSFORM_MAX_FRAMES
           and 2 * (n - 1) * fv <= TRANSFORM_WINDOW_VALUES
           and (2 * (n - 1) + 1) * fv <= MAX_WINDOW_VALUES):
        n = 2 * (n - 1) + 1
    return n


def fixed_windows(n_frames: int, length: int) -> list[tuple[int, int]]:
    """[t0, t1) ranges of ``length`` frames (the last one may be shorter)."""
    return [(t0, min(n_frames, t0 + length)) for t0 in range(0, max(0, n_frames), length)]


def coded_windows(n_frames: int, length: int, frame_values: int = 1) -> list[tuple[int, int]]:
    """The fixed windows a stack of ``n_frames`` frames of ``frame_values`` values is coded
    in: ``fixed_windows``, except that a last window of fewer than half of ``length``
    frames joins the window before it (where the two hold at most ``MAX_WINDOW_VALUES``).
    A short window starts over from a keyframe coded on its own and extrapolates in time
    from it; joined, its frames follow on from the window before, as in a longer stack.
    With windows of 33 frames (``benchmarks/results/tails.md``), a tail of 2, 6 or 16
    frames joined made the shared stacks' files 0.2-4.5% smaller (iris's 72 frames:
    0.4-1.7%), and three smooth fields' 0-42%; one file was 2 bytes larger. Tails of half
    a window or more stay windows of their own, coded in parallel with the others."""
    plan = fixed_windows(n_frames, length)
    if len(plan) > 1:
        (a, _), (b0, b) = plan[-2], plan[-1]
        if 2 * (b - b0) < length and (b - a) * max(1, frame_values) <= MAX_WINDOW_VALUES:
            plan[-2:] = [(a, b)]
    return plan


def dynamic_windows(stack: object, max_length: int, threshold: float, scale: float,
                    chunk: int = 64) -> list[tuple[int, int]]:
    """DWP: [t0, t1) ranges of at most ``max_length`` frames; a new window (keyframe) starts
    at frame t when the forecast error of frame t, measured as the mean absolute change
    from frame t-1 over the values finite in both, exceeds ``threshold * scale`` (scale:
    the value range). A scene cut, a beam dump or a detector reset thus starts a window
    instead of costing a badly predicted frame. Reads the stack once, ``chunk`` frames at
    a time (``stack.read(t0, t1)``, ``stack.shape``)."""
    import numpy as np

    n = int(stack.shape[0])  # type: ignore[attr-defined]
    limit = threshold * (scale if scale > 0 else 1.0)
    cuts = [0]
    prev = None
    for c0 in range(0, n, chunk):
        block = np.asarray(stack.read(c0, min(n, c0 + chunk)), np.float64)  # type: ignore[attr-defined]
        for i, frame in enumerate(block):
            t = c0 + i
            if prev is not None:
                d = np.abs(frame - prev)
                d = d[np.isfinite(d)]
                change = float(d.mean()) if d.size else 0.0
                if change > limit or t - cuts[-1] >= max_length:
                    cuts.append(t)
            elif t - cuts[-1] >= max_length:
                cuts.append(t)
            prev = frame
    cuts.append(n)
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True) if b > a]
