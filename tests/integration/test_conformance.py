"""The shipped conformance suite, run for every available backend (ref; triton under
TRITON_INTERPRET=1 on the CPU; all of them on a GPU)."""

from tileinfer.testing.conformance import *  # noqa: F401,F403
