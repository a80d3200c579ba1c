"""gae over the Model Context Protocol: ``gae-mcp`` serves decide / verify / explain on judgment
memories, each served by a :class:`~gae.Decider` on a durable ledger, remember / recall / forget
on scoped text memories, and memories, which lists both (``pip install 'gae-torch[mcp,text]'``;
docs/mcp.md).

``service.py`` holds what the tools do (:class:`MemoryService`, no protocol), ``server.py`` the
protocol and the command line, ``config.py`` the TOML file, ``explained.py`` an explanation as JSON.
"""

from gae.mcp.config import FixedMemory, ServerConfig
from gae.mcp.service import MemoryService, ToolInputError

__all__ = ["FixedMemory", "MemoryService", "ServerConfig", "ToolInputError"]
