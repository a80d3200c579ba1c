"""The judgment memory's face for its judges (:mod:`gae.judgment.judges`): their names, the
trust in them, and the batched scoring through their mixture. Mixed into
:class:`~gae.JudgmentMemory`, which provides the attributes below."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from torch import Tensor

from gae.judgment import judged, judges, rule
from gae.judgment import trust as trust_rule
from gae.judgment.config import JudgmentConfig
from gae.judgment.explain import Explanation
from gae.types import MemoryOutput, StreamStep


class JudgesMixin:
    """:meth:`judge_names`, :meth:`trust` and the mixture's scoring of a memory with judges."""

    _config: JudgmentConfig
    _buffers: dict[str, Any]
    category_names: tuple[str, ...]
    centroids: Tensor
    trust_weights: Tensor
    _score_compiled: Any
    scoring_centroids: Any
    scoring_mask: Any
    backend: str

    def _score_judged(self, x: Tensor, category: Tensor, alpha: Tensor, compiled: bool) -> tuple[MemoryOutput, Tensor]:
        """The judges' mixture (:mod:`gae.judgment.judged`) and the (B, J, A) votes, the prototypes'
        own probabilities the first judge's."""
        own = (self._score_compiled(x, category, alpha) if compiled else
               rule.score(x, category, self.scoring_centroids(), self.scoring_mask(), alpha, self._config)[0])
        buffers = cast(dict, self._buffers)
        if compiled:
            result, vote = judged.score(buffers, self._config, x.detach().cpu(), category.cpu(), own.probs, True)
            return MemoryOutput(*(t.to(x.device) for t in result)), vote.to(x.device)
        return judged.score(buffers, self._config, x, category, own.probs, False)

    def _explain_judged(self, explained: Explanation, x: Tensor, category: Tensor) -> Explanation:
        """``explained`` (the prototypes') with the judges: the mixture as the recommendation, each
        judge's vote and the category's trust in it; as it is without judges."""
        if not self._config.judges:
            return explained
        mixed, vote = judged.score(cast(dict, self._buffers), self._config, x, category, explained.probs, False)
        return dataclasses.replace(explained, action=mixed.action, confidence=mixed.confidence, probs=mixed.probs,
                                   judge_names=self.judge_names(), votes=vote,
                                   trust=trust_rule.weights_of(self.trust_weights)[category])

    def judge_names(self) -> tuple[str, ...]:
        """The names of the memory's judges, in vote order: ``'prototypes'``, then ``config.judges``."""
        return (judges.PROTOTYPES, *(judge.name for judge in self._config.judged()))

    def trust(self) -> Tensor:
        """(C, J) each category's trust in each judge (:meth:`judge_names` order), rows summing
        to 1; a memory without judges trusts its prototypes alone (all ones, J = 1)."""
        if not self._config.judges:
            return self.centroids.new_ones(len(self.category_names), 1)
        return trust_rule.weights_of(self.trust_weights).clone()

    def _learn_judges(self, x: Tensor, category: Tensor, action: Tensor, skip: Tensor,
                      step: StreamStep) -> tuple[StreamStep, dict[str, Tensor]]:
        """The judges' and the trust's pass over a learning call the prototypes just made (``step``),
        on private copies for :meth:`_write_judges`: the step with the mixture as its output, the
        votes and the prototypes' own output. Without judges: ``step`` and nothing to write."""
        if not self._config.judges:
            return step, {}
        copies = judged.private_copy(self._buffers, self._config)
        mixed, vote = judged.prequential(copies, self._config, x, category, action, skip, step.output.probs,
                                         self.backend)
        return step._replace(output=mixed, votes=vote, own=step.output), copies

    def _write_judges(self, copies: dict[str, Tensor]) -> None:
        for name, tensor in copies.items():
            cast(Tensor, self._buffers[name]).copy_(tensor)

    def _check_judges_state(self, saved: dict[str, Any]) -> None:
        """Refuse a state saved with other judges (``saved``: the config it was saved with)."""
        value = {name: spec.get("kind", name) for name, spec in (saved.get("judges") or {}).items()}
        mine = {judge.name: judge.kind for judge in self._config.judged()}
        if value != mine:
            raise ValueError(f"state_dict was saved with the judges {value!r} but this memory has {mine!r}; "
                             f"build the memory with the config it was saved with to load it")
