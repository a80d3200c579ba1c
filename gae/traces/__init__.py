"""Evaluation traces: a JSON line per scored decision, and their exact replay.

``writer.py`` holds :class:`TraceWriter`, the state hashes and the checkpoints a trace starts
from, ``lines.py`` the encoding of each call's decisions, ``replay.py`` the replay that checks
every answer again (``scripts/replay_trace.py``). See ``docs/trace.md``.
"""

from gae.traces.replay import ReplayReport, replay
from gae.traces.writer import TraceWriter, load_checkpoint, read_trace, save_checkpoint, state_hash

__all__ = ["ReplayReport", "TraceWriter", "load_checkpoint", "read_trace", "replay", "save_checkpoint", "state_hash"]
