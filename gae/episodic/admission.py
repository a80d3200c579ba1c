"""AdmissionPolicy: what an episodic memory agrees to store, and why it refuses the rest."""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from gae import validation as check
from gae.validation import plain_ids

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

    Thread safety: a policy is read-only once built (``admit`` changes nothing), so any number
    of threads and memories may use one at once, with no lock.

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


def add_arguments(accepted: Sequence[Mapping[str, Any]], now: float, device: torch.device) -> dict[str, Any]:
    """The :meth:`~gae.EpisodicMemory.add` arguments of the accepted traces, one batch: what each
    trace gives, the defaults for what it does not (``created_at`` = ``now``)."""
    def numbers(name: str, default: float | None = None) -> Tensor:
        return torch.tensor([_trace_number(t, name, default) for t in accepted], dtype=torch.float64)

    return {"embeddings": _trace_embeddings(accepted, device), "importance": numbers("importance"),
            "scope": [t.get("scope", 0) for t in accepted], "confidence": numbers("confidence", 1.0),
            "source_ids": [t.get("source_ids", ()) for t in accepted],
            "memory_type": [t.get("memory_type", "episode") for t in accepted],
            "created_at": numbers("created_at", now), "valid_from": numbers("valid_from", -math.inf),
            "valid_until": numbers("valid_until", math.inf), "content": [t.get("content") for t in accepted]}

def _trace_number(trace: Mapping[str, Any], name: str, default: float | None) -> float:
    if name not in trace and default is not None:
        return default
    if name not in trace:
        raise ValueError(f"an accepted trace has no {name!r}: {_brief(trace)}")
    value = trace[name]
    if isinstance(value, Tensor) and value.numel() == 1 and not value.is_complex() and value.dtype != torch.bool:
        return float(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} of a trace must be a number, got {value!r}")
    return float(value)


def _trace_embeddings(traces: Sequence[Mapping[str, Any]], device: torch.device) -> Tensor:
    """The accepted traces' embeddings as one (B, D) batch; ``add`` checks its width and values."""
    rows = []
    for trace in traces:
        if "embedding" not in trace:
            raise ValueError(f"an accepted trace has no 'embedding': {_brief(trace)}")
        value = trace["embedding"]
        try:
            row = value.detach().to(device) if isinstance(value, Tensor) else \
                torch.as_tensor(np.asarray(value, dtype=np.float64), device=device)
        except (TypeError, ValueError, RuntimeError) as error:  # text, ragged lists, a meta tensor
            raise TypeError(f"embedding of a trace must be a vector of numbers, got {value!r}") from error
        if not row.is_floating_point():
            row = row.double()
        rows.append(row)
    shapes = {tuple(row.shape) for row in rows}
    if len(shapes) > 1:
        raise ValueError(f"embeddings of the accepted traces must share one shape, got {sorted(shapes)}")
    dtype = functools.reduce(torch.promote_types, (row.dtype for row in rows))
    return torch.stack([row.to(dtype) for row in rows])


def _brief(trace: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{key!r}: ..." for key in list(trace)[:6]) + "}"
