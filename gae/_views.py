"""A decision memory's copies, and the single-decision views every change of its tensors drops.

The single-decision paths (``score_one``, ``learn_one``, ``decide``) work on NumPy views of a
memory's own buffers, kept between calls in ``_host``. :class:`ViewsMixin` builds them again
whenever a tensor may have been replaced or moved (an assignment, a registration, a load, a
torch conversion), so the views need not compare every tensor on every call; and it makes each
copy (pickle, ``copy.deepcopy``) a memory of its own: a lock of its own, views of its own.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from gae.refer import Referral

VIEWS = ("_host", "_judge_host")  # the attributes that hold single-decision views


class ViewsMixin(nn.Module):
    """Mixed into :class:`~gae.DecisionMemory` before ``nn.Module``, which gives it ``_lock`` (a
    ``threading.RLock``) and, through :class:`~gae.lifecycle.LifecycleMixin`, ``_init_pending``."""

    _lock: Any

    if TYPE_CHECKING:  # provided by LifecycleMixin, before this class in the method order
        def _init_pending(self) -> None: ...

    def __getstate__(self) -> dict[str, Any]:
        """The attributes without the lock (each copy gets its own) and the single-decision views
        (views of this instance's tensors: a copy builds its own)."""
        state = dict(super().__getstate__())
        state.pop("_lock", None)
        for name in VIEWS:
            if state.get(name) is not None:
                state[name] = _fresh(state[name])
        return state

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        """A deep copy made whole under the lock (deepcopy reads the attributes after
        ``__getstate__`` returns, when another thread may be learning). Pickling keeps torch's
        own path (``map_location``, shared memory, shared parameters), so it is not locked:
        pickle a memory while no other thread learns it, or pickle a deep copy."""
        with self._lock:
            twin = type(self).__new__(type(self))
            memo[id(self)] = twin
            twin.__setstate__(copy.deepcopy(self.__getstate__(), memo))
        return twin

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__["_lock"] = threading.RLock()
        self._drop_views()  # fresh views whoever pickled them (an older gae's hold other fields)
        if "_open" not in self.__dict__:  # pickled before decide / verify: nothing pending
            self._init_pending()
        if "referral" not in self.__dict__:  # pickled before act or refer: nothing observed
            self.__dict__["referral"] = self._fresh_referral()

    def _fresh_referral(self) -> Referral:
        """The :class:`~gae.refer.Referral` this memory starts with (a subclass with options has its own)."""
        return Referral()

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> Any:
        """torch's conversions (``to``, ``float``, ``share_memory``, ...): a conversion may move a
        tensor's data without replacing the tensor, so the single-decision views (``_host``,
        which every memory that has them keeps) are built again, as after any replacement of a
        buffer or parameter (assignment, ``register_buffer``, a load, a growth): the views then
        need not compare every tensor on every call."""
        result = super()._apply(fn, recurse)
        self._drop_views()
        return result

    def _drop_views(self) -> None:
        for name in VIEWS:
            views = self.__dict__.get(name)
            if views is not None:
                self.__dict__[name] = _fresh(views)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name in self.__dict__.get("_buffers", ()) or name in self.__dict__.get("_parameters", ()):
            self._drop_views()  # a tensor the views point into was replaced

    def __delattr__(self, name: str) -> None:
        super().__delattr__(name)
        self._drop_views()

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        super().register_buffer(name, tensor, persistent)
        self._drop_views()

    def register_parameter(self, name: str, param: nn.Parameter | None) -> None:
        super().register_parameter(name, param)
        self._drop_views()



def _fresh(views: Any) -> Any:
    """An empty holder of the same views: its ``fresh()`` where it needs arguments, else a new one."""
    return views.fresh() if hasattr(views, "fresh") else type(views)()
