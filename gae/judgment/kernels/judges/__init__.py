"""The compiled mirrors of the judges (:mod:`gae.judgment.judges`): one module per kind, of the
kind's name, with the reference's names (``log_scores``, ``learn``, ...) and two batch loops,
``score`` and ``prequential``, each taking the judge's buffers in ``BUFFERS`` order then its
``Options.params()`` (:func:`gae.judgment.judged.kernel_of` finds a kind's module by its name),
and ``bind``, ``bound_log_scores`` and ``bound_learn``, the same two calls on buffers given by
address, through which :mod:`~gae.judgment.kernels.judges.fused` runs every judge of a memory in
one call on the single-decision path."""
