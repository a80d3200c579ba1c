"""All-or-nothing ``load_state_dict``: a state dict is checked against the whole module before
anything is copied, and a load that fails half-way is undone.

torch checks each tensor as it copies it, so a misfit in one buffer would leave the ones loaded
before it overwritten. :class:`gae.DecisionMemory` and :class:`gae.EpisodicMemory` load through
these two functions.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn


def _kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    return "float" if dtype.is_floating_point else "complex" if dtype.is_complex else "int"


def check_state_dict(module: nn.Module, state_dict: Mapping[str, Any], prefix: str = "",
                     strict: bool | None = None) -> None:
    """Refuse a ``state_dict`` that does not fit ``module`` and its submodules, before anything is copied.

    torch checks each tensor as it copies it, so a size mismatch in one buffer leaves the ones
    loaded before it overwritten. This looks at them all first: each submodule's own
    ``_check_state`` (names, modes), then every parameter and buffer, which must be a tensor of
    the same shape (the rows of those a submodule lists in ``_resizable_rows`` may differ) and
    the same kind (bool, int or float: float32 and float64 load into each other). With
    ``strict=True``, missing and unexpected keys are refused too (RuntimeError, as torch's);
    ``_load_from_state_dict`` cannot tell (torch always passes it ``strict=True``) and leaves
    the keys to torch.

    Raises:
        ValueError: naming every misfit, e.g. ``centroids: saved (4, 3, 8), this memory (4, 4, 8)``.
    """
    problems, missing, expected = [], [], set()
    metadata = getattr(state_dict, "_metadata", None) or {}  # torch's record of each module's _version
    state_dict = dict(state_dict)  # a memory's upgrade of an older layout replaces entries of this copy only
    for name, sub in module.named_modules():
        upgrade = getattr(sub, "_upgrade_state", None)
        if upgrade is not None:
            sub_prefix = prefix + (name + "." if name else "")
            upgrade(state_dict, sub_prefix, metadata.get(sub_prefix[:-1], {}).get("version"))
    for name, sub in module.named_modules():
        sub_prefix = prefix + (name + "." if name else "")
        own_check = getattr(sub, "_check_state", None)
        if own_check is not None:
            own_check(state_dict, sub_prefix)
        resizable = getattr(sub, "_resizable_rows", ())
        tensors = [*sub._parameters.items(),
                   *((n, b) for n, b in sub._buffers.items() if n not in sub._non_persistent_buffers_set)]
        for local, mine in tensors:
            if mine is None:
                continue
            key = sub_prefix + local
            expected.add(key)
            if key not in state_dict:
                missing.append(key)
                continue
            saved = state_dict[key]
            if not isinstance(saved, Tensor):
                problems.append(f"{key}: saved a {type(saved).__name__}, this memory a tensor {tuple(mine.shape)}")
                continue
            fits = (saved.dim() == mine.dim() and saved.shape[1:] == mine.shape[1:]) if local in resizable \
                else saved.shape == mine.shape
            if not fits:
                shape = ("N", *mine.shape[1:]) if local in resizable else tuple(mine.shape)
                problems.append(f"{key}: saved {tuple(saved.shape)}, this memory {shape}".replace("'N'", "N"))
            elif _kind(saved.dtype) != _kind(mine.dtype):
                problems.append(f"{key}: saved {saved.dtype}, this memory {mine.dtype}")
        if type(sub).get_extra_state is not nn.Module.get_extra_state:
            expected.add(sub_prefix + "_extra_state")
            if sub_prefix + "_extra_state" not in state_dict:
                missing.append(sub_prefix + "_extra_state")
    if problems:
        raise ValueError(f"state_dict does not fit this {type(module).__name__} (nothing was loaded): "
                         + "; ".join(problems))
    unexpected = [key for key in state_dict if key.startswith(prefix) and key not in expected]
    if strict is True and (missing or unexpected):
        raise RuntimeError(f"Error(s) in loading state_dict for {type(module).__name__} (nothing was loaded): "
                           f"Missing key(s) in state_dict: {missing}. Unexpected key(s) in state_dict: {unexpected}.")


def load_all_or_nothing(module: nn.Module, load: Callable[..., Any], state_dict: Mapping[str, Any], strict: bool,
                        assign: bool) -> Any:
    """``load(state_dict)``; if it fails half-way, ``module``'s state is loaded back before the error is raised."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping of names to tensors, got {type(state_dict).__name__}")
    check_state_dict(module, state_dict, strict=strict)
    before = {key: value.clone() if isinstance(value, Tensor) else copy.deepcopy(value)
              for key, value in module.state_dict().items()}
    try:
        return load(state_dict, strict=strict, assign=assign)
    except BaseException:
        load(before, strict=True, assign=assign)
        raise


def locked_deepcopy(obj: Any, lock: Any, memo: dict[int, Any]) -> Any:
    """``copy.deepcopy`` of an object that others change under ``lock``, made whole under it:
    deepcopy reads the attributes after ``__getstate__`` returns, when another thread may be
    changing them. The object's ``__getstate__`` / ``__setstate__`` say what a copy holds."""
    with lock:
        twin = object.__new__(type(obj))
        memo[id(obj)] = twin
        twin.__setstate__(copy.deepcopy(obj.__getstate__(), memo))
    return twin
