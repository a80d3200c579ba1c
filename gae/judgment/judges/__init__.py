r"""Judges: several geometries in one judgment memory, each trusted as far as it has judged well.

The prototypes of :mod:`gae.judgment.rule` are the first judge, ``prototypes``. A config's
``judges`` adds others, each a small state per category learned online from every verified
decision, scored as each action's log-likelihood: ``gauss`` (class means with a variance per
criterion, the Gaussian naive Bayes geometry, :mod:`~gae.judgment.judges.gauss`) and ``lda``
(class means under one shrunk covariance per category, :mod:`~gae.judgment.judges.lda`); either
with ``rate_floor > 0`` is a short memory for fast drift. The memory's answer is the mixture of
its judges' probabilities, weighted by their trust in the category (:mod:`gae.judgment.trust`).

A judge kind is one module here (its ``Options``, ``BUFFERS``, ``buffers``, ``log_scores`` and
``learn``, in plain torch), its compiled mirror in :mod:`gae.judgment.kernels.judges` (same
names) and one entry of :data:`KINDS`. Its buffers are the memory's, named
``judge_<name>_<buffer>`` (:func:`buffer_name`), so the state dict, growth, the decision log's
replays (``undo_``, ``forget_``) and DDP handle every judge alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import ModuleType
from typing import Any, NamedTuple

import torch
from torch import Tensor

from gae.judgment.judges import bins, gauss, lda

KINDS: dict[str, ModuleType] = {"gauss": gauss, "lda": lda, "bins": bins}  # a new judge kind: its module here
PROTOTYPES = "prototypes"  # the name of the first judge, the prototypes every memory has
PREFIX = "judge_"  # every judge buffer's name starts so (buffer_name)
_NAME_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")


class Judge(NamedTuple):
    """One judge of a config: its ``name`` (a buffer-name part), its ``kind`` (a key of
    :data:`KINDS`) and its ``options`` (the kind's ``Options``)."""

    name: str
    kind: str
    options: Any

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": ..., option: value, ...}``: what :func:`parse` reads back."""
        return {"kind": self.kind, **dataclasses.asdict(self.options)}


def parse(judges: Any) -> tuple[Judge, ...]:
    """The ``judges`` option as :class:`Judge` records: a mapping ``{name: {"kind": kind,
    option: value, ...}}`` (``kind`` defaults to the name, so ``{"gauss": {}}`` is a gauss
    judge with its defaults), the records themselves, or None (no judges). Errors name the judge and the option."""
    if judges is None:
        return ()
    if isinstance(judges, tuple) and all(isinstance(judge, Judge) for judge in judges):
        return judges
    if not isinstance(judges, Mapping):
        raise TypeError(f"judges must be a mapping of judge names to their options, got {judges!r}")
    parsed = []
    for name, spec in judges.items():
        if not isinstance(name, str) or not name or not set(name) <= _NAME_CHARACTERS or name == PROTOTYPES:
            raise ValueError(f"judges: a judge name must be lower-case letters, digits and '_', and not "
                             f"{PROTOTYPES!r}, got {name!r}")
        if not isinstance(spec, Mapping):
            raise TypeError(f"judges[{name!r}] must be a mapping of options, got {spec!r}")
        options = dict(spec)
        kind = options.pop("kind", name)
        if kind not in KINDS:
            raise ValueError(f"judges[{name!r}]: unknown kind {kind!r}; the kinds are {sorted(KINDS)}")
        fields = [field.name for field in dataclasses.fields(KINDS[kind].Options)]
        unknown = sorted(set(options) - set(fields))
        if unknown:
            raise TypeError(f"judges[{name!r}]: a {kind} judge has no option(s) {unknown}; its options are {fields}")
        try:
            parsed.append(Judge(name, kind, KINDS[kind].Options(**options)))
        except (TypeError, ValueError) as error:
            raise type(error)(f"judges[{name!r}]: {error}") from None
    return tuple(parsed)


def buffer_name(judge: Judge, buffer: str) -> str:
    """The memory's name of one of ``judge``'s buffers."""
    return f"{PREFIX}{judge.name}_{buffer}"


def layout(judges: tuple[Judge, ...], n_categories: int, n_actions: int, n_factors: int) -> dict[str, tuple]:
    """``name -> (shape, dtype)`` of every judge's buffers and of the trust (:mod:`gae.judgment.trust`):
    ``trust_weights`` (C, J) float32, J = 1 + the judges, (0, 0) without judges."""
    out: dict[str, tuple] = {}
    for judge in judges:
        for buffer, spec in KINDS[judge.kind].buffers(n_categories, n_actions, n_factors, judge.options).items():
            out[buffer_name(judge, buffer)] = spec
    out["trust_weights"] = ((n_categories, 1 + len(judges)) if judges else (0, 0), torch.float32)
    return out


def state_of(judge: Judge, buffers: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``buffer -> tensor`` of one judge, from the memory's buffers (the tensors themselves)."""
    return {buffer: buffers[buffer_name(judge, buffer)] for buffer in KINDS[judge.kind].BUFFERS}


def log_scores(judge: Judge, x: Tensor, category: Tensor, buffers: Mapping[str, Tensor]) -> Tensor:
    """(B, A) the judge's scores (its kind's ``log_scores``)."""
    return KINDS[judge.kind].log_scores(x, category, state_of(judge, buffers), judge.options)


def learn(judge: Judge, x: Tensor, c: int, a: int, buffers: Mapping[str, Tensor]) -> None:
    """Learn one verified decision into the judge (its kind's ``learn``), in place."""
    KINDS[judge.kind].learn(x, c, a, state_of(judge, buffers), judge.options)
