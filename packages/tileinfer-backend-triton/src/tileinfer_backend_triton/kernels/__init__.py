"""Triton kernels, one op family per module; each module's ``launch_*`` functions pick tiles and
grids from shapes and host ints only (no host synchronization) and write into given outputs.
``linear_config`` holds the linear launchers' tiles and scratch, ``rng`` the sampler's random
stream, ``common`` what the kernels share."""
