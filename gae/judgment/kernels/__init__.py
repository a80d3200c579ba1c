"""The compiled mirror (numba) of :mod:`gae.judgment.rule`, function for function.

Each function has the same name as its torch counterpart in ``rule.py`` (or ``lvq.py``, or
``primitives.py``, the pieces both build on, which ``rule`` re-exports), whose docstring has
the maths (two work on one slot where the torch function works on all: ``scores`` is one entry
of ``rule.scoring_mask`` and ``logit`` one of ``rule.distances``, divided by ``-tau``); the
tests hold the two equal on seeded random streams in every mode. ``scoring.py``
holds the scoring (batched, one decision, and the online loop's), ``learning.py`` the online
loop and its sub-rules, ``slots.py`` the slot operations they share and ``lvq.py`` the
``learning='lvq'`` step (mirroring :mod:`gae.judgment.lvq`). The kernels trust their inputs (the
module validates). The batched entry (``prequential``) runs on private copies of the state; the
single-decision one (``learning.learn_one_at``) runs in place on the memory's buffers, so no kernel
may raise on an input the module accepts: every divisor in them is positive for every state the
rule can reach (``tau`` as float32 by the config's check, a spread by the variance floor, the
relevance step's square by its own guard), and tests/test_extreme_inputs.py feeds every mode the
extremes of the accepted range.

The entry points take their arguments packed: the state as one
:class:`~gae.judgment.state.JudgmentState` of arrays, the options as one :class:`Options`
record, the outputs as tuples of preallocated arrays; they unpack them once, and hand each
sub-rule the arrays and numbers it needs (tuples handed on to the inlined sub-rules made the
adaptive loop markedly slower).

Floating point: the online loop keeps every stored quantity in float32 and evaluates the
update ``c + eta * (x - c)`` in float32, like the reference, without fast-math, so that the
two agree bit for bit.
"""

from gae.judgment.kernels.learning import STALE, learn_one, prequential
from gae.judgment.kernels.scoring import NOT_FINITE, Options, novelty, score, score_one, score_one_at

__all__ = ["NOT_FINITE", "STALE", "Options", "learn_one", "novelty", "prequential", "score", "score_one",
           "score_one_at"]
