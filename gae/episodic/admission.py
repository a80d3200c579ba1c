"""AdmissionPolicy: what an episodic memory agrees to store, and why it refuses the rest."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from gae import validation as check
from gae.episodic.columns import plain_ids

OUTCOMES = ("success", "corrected", "useful_failure", "failure", "uncertain")


class Admission(NamedTuple):
    """The policy's verdict on one trace: accepted, and the reason (empty when accepted)."""

    accepted: bool
    reason: str


class AdmissionPolicy:
    """Admit a trace only if its outcome, quality and scope are worth remembering.

    Args:
        allowed_outcomes: outcomes worth storing. Default: success, corrected, useful_failure.
        min_quality: lowest acceptable ``quality`` in [0, 1]. Default: 0.5.
        allowed_scopes: scopes that may be written (a list, or a 1-D integer tensor or numpy
            array), or None for any. Default: None.

    Examples::

        >>> policy = AdmissionPolicy()
        >>> policy.admit({"outcome": "success", "quality": 0.9})
        Admission(accepted=True, reason='')
        >>> policy.admit({"outcome": "failure", "quality": 0.9}).reason
        "outcome 'failure' not in ('success', 'corrected', 'useful_failure')"
    """

    def __init__(self, allowed_outcomes: Sequence[str] = ("success", "corrected", "useful_failure"),
                 min_quality: float = 0.5, allowed_scopes: Sequence[Any] | None = None) -> None:
        if isinstance(allowed_outcomes, str) or not allowed_outcomes:
            raise ValueError(f"allowed_outcomes must be a non-empty list of outcomes, got {allowed_outcomes!r}")
        self.allowed_outcomes = tuple(allowed_outcomes)
        self.min_quality = check.check_real("min_quality", min_quality, low=0.0, high=1.0)
        self.allowed_scopes = None if allowed_scopes is None else _scopes(allowed_scopes)

    def admit(self, trace: dict[str, Any]) -> Admission:
        """Judge one trace (a dict with ``outcome``, ``quality`` and optionally ``scope``)."""
        outcome = trace.get("outcome")
        if outcome not in self.allowed_outcomes:
            return Admission(False, f"outcome {outcome!r} not in {self.allowed_outcomes}")
        quality = trace.get("quality")
        if not isinstance(quality, (int, float)) or isinstance(quality, bool) or not quality >= self.min_quality:
            return Admission(False, f"quality {quality!r} below {self.min_quality}")
        if self.allowed_scopes is not None:
            scope = plain_ids("scope", trace.get("scope", 0), (0,), names=True)  # a 0-D tensor compares as its int
            if scope not in self.allowed_scopes:
                return Admission(False, f"scope {scope!r} not in {self.allowed_scopes}")
        return Admission(True, "")

    def __repr__(self) -> str:
        return (f"AdmissionPolicy(allowed_outcomes={self.allowed_outcomes}, min_quality={self.min_quality}, "
                f"allowed_scopes={self.allowed_scopes})")


def _scopes(allowed_scopes: Any) -> tuple[Any, ...]:
    """``allowed_scopes`` as a tuple of names and ints."""
    values = plain_ids("allowed_scopes", allowed_scopes, (1,), names=True)
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"allowed_scopes must be None or a list of scopes, got {allowed_scopes!r}")
    return tuple(plain_ids("allowed_scopes", s, (0,), names=True) for s in values)
