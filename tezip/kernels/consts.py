"""Constants shared by the kernels and the Python side (no numba import here: the
command line and the container reader start without compiling anything)."""

MODE_FLOAT = 0       # float data, absolute bound: step 2e, reconstruction checked exactly
MODE_INT = 1         # integer data: step 2e+1 around the rounded prediction (e=0: lossless)
MODE_LOG = 2         # point-wise relative: log2|x| on a grid, sign kept, checked exactly

OUT_F64 = 0          # the output array's type, for rounding reconstructions into it
OUT_F32 = 1
OUT_INT = 2

KMAX = 1 << 30       # |code| beyond this: the value is stored exactly (an outlier)
FLAG = KMAX + 1      # the code that marks an outlier in a code array

PREC = 12            # rANS probability precision (bits)
M = 1 << PREC
FC_SHIFT = 16        # the decoders' table entries: frequency << FC_SHIFT | cumulative (uint32;
#                      both at most M)
RANS_L = 1 << 16     # state in [2^16, 2^32), 16-bit renormalisation, 2 interleaved states
ALPHABET = 256
ESC = 254            # the high part does not fit: the rest follows in the escape stream
OUT = 255            # an outlier: its value follows, exactly, in the outlier stream

NB = 24              # activity buckets per context group (half octaves)

RUN_CHUNK = 4096     # the most points a fused decoder reads without bounding its stream
#                      positions again (``core.run_start``); streams are padded for
#                      min(frame width, RUN_CHUNK) points
