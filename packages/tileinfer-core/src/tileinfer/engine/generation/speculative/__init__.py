"""Speculative decoding: proposers of draft tokens, and the loop in which the target checks them.

- ``NgramProposer``: prompt lookup over the sequence itself, on the host: pipelined, and drafting
  only while its guesses come true (``pipelined``), so it never costs much more than plain
  decoding and gains where the answer copies its context.
- ``DraftProposer``: a smaller model of the same vocabulary.
- ``DFlashProposer`` with ``load_dflash``: z-lab's block diffusion drafters, a block per pass.

Pass one as ``generate(..., speculative=proposer, spec_stats=SpecStats())`` (or to
``generate_into`` or ``ChatSession``).
"""

from .decode import generate_speculative
from .dflash import DFlashDrafter, DFlashProposer, load_dflash
from .draft import DraftProposer
from .ngram import NgramProposer
from .proposer import Draft, Proposer, SpecStats

__all__ = ["DFlashDrafter", "DFlashProposer", "Draft", "DraftProposer", "NgramProposer",
           "Proposer", "SpecStats", "generate_speculative", "load_dflash"]
