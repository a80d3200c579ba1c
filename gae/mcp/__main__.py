"""``python -m gae.mcp``: the ``gae-mcp`` server (see :mod:`gae.mcp.server`)."""

from gae.mcp.server import main

if __name__ == "__main__":
    main()
