"""gae-mcp: the :class:`~gae.mcp.service.MemoryService` served over the Model Context Protocol.

``gae-mcp [--store PATH | --dsn DSN] [--scopes a,b] [--config FILE] [--http PORT] [--embedder NAME]``
(or ``python -m gae.mcp``): stdio by default, streamable HTTP on 127.0.0.1 with ``--http``.
Each tool's input schema comes from its signature (the official SDK's ``MCPServer``); a refused
argument is an error result naming it (``factors.amount: must be finite, got nan``), after which
the server goes on serving and nothing has changed.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import Strict
from typing_extensions import TypedDict  # pydantic needs it for nested TypedDicts before Python 3.12

from gae.mcp.config import ServerConfig
from gae.mcp.service import MemoryService

T = TypeVar("T")
# the arguments as sent: a number is a JSON number (an int is one), never a string or a bool made into one
Number = Annotated[float, Strict()]
Int = Annotated[int, Strict()]
DEFAULT_STORE = "gae-mcp.db"
EMBEDDERS = ("minilm", "hashing")  # --embedder: all-MiniLM-L6-v2 (the text extra), or hashed n-grams (no model)

INSTRUCTIONS = """gae: decision memory for agents. decide(category, factors) recommends an action and says
whether to act on it or refer it to a person (refer, reasons); verify(decision_id, action) teaches
it the verified outcome; explain(decision_id) says why. remember / recall / forget keep text
memories in scopes; forget erases them from disk."""


class Decided(TypedDict):
    id: str
    action: str | None
    confidence: float
    probs: dict[str, float]
    refer: bool
    reasons: list[str]
    category: str
    factors: list[str]


class Verified(TypedDict):
    id: str
    action: str
    learned: bool
    confirmed: bool


class Remembered(TypedDict):
    id: int


class Recalled(TypedDict):
    id: int
    text: str | None
    scope: str
    score: float
    similarity: float
    recency: float
    importance: float


class Recall(TypedDict):
    memories: list[Recalled]


class Forgotten(TypedDict):
    forgotten: list[int]


def _answer(call: Callable[[], T]) -> T:
    """``call()``, with a refused argument (the service's and the library's ValueError, TypeError
    and KeyError, each naming what it refuses) as the tool's error result."""
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        return call()
    except (ValueError, TypeError, KeyError) as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
        raise ToolError(str(message)) from error


def build_server(service: MemoryService) -> Any:
    """The ``MCPServer`` with the six tools over ``service``."""
    from mcp.server.mcpserver import MCPServer

    import gae

    server = MCPServer("gae", instructions=INSTRUCTIONS, version=gae.__version__)
    # decide, verify and explain take a fraction of a millisecond: they run in the event loop, which
    # saves the hop to a worker thread and back (about a millisecond on 2 CPUs). The text tools run the
    # embedding model (milliseconds), so the SDK runs them in its worker threads.

    @server.tool()
    async def decide(category: str, factors: dict[str, Number], actions: list[str] | None = None) -> Decided:
        """Recommend an action for one decision and keep it pending until verify. factors: the
        decision's criteria, name -> number (one memory per set of names). actions: the actions
        it may recommend (needed the first time a set of factor names is seen; new ones are
        added). Answers refer=true when a person should look first, with reasons among
        unseen_category, novel, recent_change, low_confidence (below the confidence calibrated
        so that the decisions not referred err at most the target, 2% by default) and
        small_margin. Verify decisions taken alone too: the calibration learns from them."""
        return _answer(lambda: Decided(**service.decide(category, factors, actions)))  # type: ignore[typeddict-item]

    @server.tool()
    async def verify(decision_id: str, action: str) -> Verified:
        """Teach the memory the verified action of pending decision decision_id."""
        return _answer(lambda: Verified(**service.verify(decision_id, action)))  # type: ignore[typeddict-item]

    @server.tool()
    async def explain(decision_id: str) -> dict[str, Any]:
        """Why decision decision_id was decided as it was: each action's nearest prototype, each
        factor's share of the distance and weight, each judge's vote and trust."""
        return _answer(lambda: service.explain(decision_id))

    @server.tool()
    def remember(text: str, scope: str, importance: Number = 0.5,
                 memory_type: Literal["episode", "semantic"] = "episode") -> Remembered:
        """Store a text memory in scope; its id."""
        return _answer(lambda: Remembered(id=service.remember(text, scope, importance, memory_type)))

    @server.tool()
    def recall(query: str, scopes: list[str], k: Int = 5) -> Recall:
        """The k (1 to 100) text memories of scopes that best answer query, best first, with
        their scores (similarity, recency and importance, weighted)."""
        return _answer(lambda: Recall(memories=service.recall(query, scopes, k)))  # type: ignore[typeddict-item]

    @server.tool()
    def forget(ids: list[Int]) -> Forgotten:
        """Erase text memories by id: gone from the store's files, not only hidden."""
        return _answer(lambda: Forgotten(forgotten=service.forget(ids)))

    return server


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gae-mcp", description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--store", type=Path, help=f"the SQLite file (default: {DEFAULT_STORE})")
    where.add_argument("--dsn", help="a Postgres connection string (pip install 'gae-torch[store]')")
    parser.add_argument("--scopes", help="comma-separated scopes the text tools may name (default: any)")
    parser.add_argument("--config", type=Path, help="a TOML file (gae.mcp.config)")
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT, not stdio")
    parser.add_argument("--embedder", choices=EMBEDDERS, default="minilm",
                        help="minilm: all-MiniLM-L6-v2 (the text extra); hashing: hashed words, no model")
    args = parser.parse_args(argv)
    if args.scopes is not None:
        args.scopes = [s.strip() for s in args.scopes.split(",")]
        if not all(args.scopes):
            parser.error(f"--scopes must name scopes separated by commas, got {','.join(args.scopes)!r}")
    if args.http is not None and not 0 < args.http < 65536:
        parser.error(f"--http must be a port in 1..65535, got {args.http}")
    return args


def service_from_args(args: argparse.Namespace) -> MemoryService:
    """The service the command line asks for (the store opened and its memories loaded)."""
    from gae.episodic.embedders import MINILM_DIM, HashingEmbedder, SentenceEmbedder
    from gae.storage import PostgresStore, SQLiteStore

    config = ServerConfig.from_toml(args.config) if args.config is not None else ServerConfig()
    if args.dsn is not None:
        def open_store() -> Any:
            return PostgresStore(args.dsn)
    else:
        path = str(args.store or DEFAULT_STORE)

        def open_store() -> Any:
            return SQLiteStore(path)
    embedder: Any = HashingEmbedder(MINILM_DIM) if args.embedder == "hashing" else None
    if embedder is None:
        with contextlib.redirect_stdout(sys.stderr):  # stdout is the protocol's: a library's print must not reach it
            embedder = SentenceEmbedder()
    service = MemoryService(open_store, scopes=args.scopes, config=config, embedder=embedder)
    _ = service.text  # opened now: a store the config or the embedder cannot open stops the server at its start
    return service


def main(argv: Sequence[str] | None = None) -> None:
    """The console script ``gae-mcp``."""
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    try:
        service = service_from_args(args)
    except (ValueError, ImportError, OSError) as error:
        sys.exit(f"gae-mcp: {error}")
    server = build_server(service)
    if args.http is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
