"""Triton kernels, one op family per module; each module's ``launch_*`` functions pick tiles and
grids from shapes and host ints only (no host synchronization) and write into given outputs."""
