"""The judgment memory: learned prototypes per (category, action), moved by verified decisions.

``config.py`` holds every option, ``state.py`` the buffers, ``rule.py`` the rule as maths and
as the torch reference (``lvq.py`` its lvq step, ``primitives.py`` the distance, units and
slot operations both share), ``kernels/`` its compiled mirror, ``engine.py`` the dispatch
between them, ``memory.py`` the ``nn.Module`` (``online.py`` its single-decision path),
``decision_log.py`` the log of learned decisions, ``history.py`` the event logs and trace /
undo / forget, ``explain.py`` the explanations.
"""

from gae.judgment.config import DriftMode, JudgmentConfig
from gae.judgment.decision_log import DecisionLog, Trace
from gae.judgment.explain import Explanation
from gae.judgment.memory import JudgmentMemory
from gae.judgment.state import JudgmentState

__all__ = ["DecisionLog", "DriftMode", "Explanation", "JudgmentConfig", "JudgmentMemory", "JudgmentState", "Trace"]
