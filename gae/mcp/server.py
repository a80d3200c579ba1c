"""gae-mcp: the :class:`~gae.mcp.service.MemoryService` served over the Model Context Protocol.

``gae-mcp [--store PATH | --dsn DSN] [--scopes a,b] [--config FILE] [--http PORT] [--embedder NAME]``
(or ``python -m gae.mcp``): stdio by default, streamable HTTP on 127.0.0.1 with ``--http``.
Each tool's input schema comes from its signature (the official SDK's ``MCPServer``): every
argument described, with its bounds, and a typed output schema. A refused argument is an error
result of one line naming it (``factors.amount: must be finite, got nan``), after which the
server goes on serving and nothing has changed; the SDK's own checks of the schema's types are
answered in the same form. A store or config the server cannot use stops it before the
embedding model loads, with one line naming it and exit status 2.
"""

# (no ``from __future__ import annotations``: the tools' argument types name the config's limits, local
# names the SDK could not resolve from strings)
import argparse
import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, TypeVar

from pydantic import Field, Strict, ValidationError
from typing_extensions import TypedDict  # pydantic needs it for nested TypedDicts before Python 3.12

from gae.mcp.config import ServerConfig
from gae.mcp.explained import ExplanationJSON
from gae.mcp.service import MAX_ID, MAX_K, MemoryService

T = TypeVar("T")
# the arguments as sent: a number is a JSON number (an int is one), never a string or a bool made into one
Number = Annotated[float, Strict()]
Int = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]  # true or false: not "yes", "1" or 1
DEFAULT_STORE = "gae-mcp.db"
EMBEDDERS = ("minilm", "hashing")  # --embedder: all-MiniLM-L6-v2 (the text extra), or hashed n-grams (no model)
DESCRIPTION = """gae-mcp serves gae's decision memory and text memories to agents over the Model Context
Protocol: decide / verify / explain on judgment memories, remember / recall / forget on scoped
text memories, and memories, which lists what there is. stdio by default; streamable HTTP on
127.0.0.1 with --http. See docs/mcp.md."""
INSTRUCTIONS = """gae: decision memory for agents. decide(category, factors) recommends an action and says
whether to act on it or refer it to a person (refer, reasons); verify(decision_id, action) teaches
it the verified outcome; explain(decision_id) says why. remember / recall / forget keep text
memories in scopes; forget erases them from disk. memories lists the judgment memories (their
factor names, categories and actions) and the scopes: call it first to use the names there are."""
REASON_WORDS = {  # decide's reasons to refer, as its description explains them (gae.decider.refer.REASONS)
    "unseen_category": "the memory has no opinion in this category yet",
    "novel": "the case lies far outside what the category has met",
    "recent_change": "the category's judgment moved lately",
    "low_confidence": "the confidence is below the threshold calibrated so that the decisions taken alone err at "
                      "most the target error",
    "small_margin": "the best two actions' probabilities are close",
    "not_calibrated": "the act-or-refer threshold is not calibrated yet: verifications_needed more verified decisions",
}


class Decided(TypedDict):
    """The decision, pending until verify. action is None while the memory has no opinion; refer
    true means a person should look first, for the reasons listed; verifications_needed is the
    number of verified decisions act or refer still needs before it takes one alone (0: none)."""

    id: str
    action: str | None
    confidence: float
    probs: dict[str, float]
    refer: bool
    reasons: list[str]
    verifications_needed: int
    category: str
    factors: list[str]


class Verified(TypedDict):
    """The verification learned: confirmed is whether the action is the one recommended."""

    id: str
    action: str
    learned: bool
    confirmed: bool


class Explained(ExplanationJSON):
    """Why decision id was decided as it was, by the memory's state at the time, and whether it was
    referred: refer, its reasons and verifications_needed as decide answered them."""

    id: str
    refer: bool
    reasons: list[str]
    verifications_needed: int


class Remembered(TypedDict):
    """The text memory's id (the one it had already when the scope held the same text)."""

    id: int


class Recalled(TypedDict):
    """A text memory and its score, the weighted sum of similarity, recency and importance."""

    id: int
    text: str | None
    scope: str
    score: float
    similarity: float
    recency: float
    importance: float


class Recall(TypedDict):
    """The text memories found, best first."""

    memories: list[Recalled]


class Forgotten(TypedDict):
    """The ids erased."""

    forgotten: list[int]


class JudgmentListed(TypedDict):
    """A judgment memory: its factors (the names a decide on it sends), categories and actions;
    fixed is true when the config fixes its names (others are refused), false when it grows; its
    pending decisions (not verified yet) and learned ones (verified)."""

    factors: list[str]
    categories: list[str]
    actions: list[str]
    fixed: bool
    pending: int
    learned: int


class Listed(TypedDict):
    """What a client may name: the text scopes (any_scope true: other names are taken too, and
    these are those the store holds) and the judgment memories."""

    scopes: list[str]
    any_scope: bool
    judgment: list[JudgmentListed]


def _described(description: str, **schema: Any) -> Any:
    """An argument's Field: its description and, in its JSON schema only, the bounds the service
    checks (``minimum``, ``maxItems``, ...); the service refuses past them in one line naming the
    argument (and the config key, where the config sets the bound)."""
    return Field(description=description, json_schema_extra=schema or None)


def _plain(text: str) -> str:
    """``text`` as one paragraph: no line breaks, no docstring indentation."""
    return " ".join(text.split())


def reasons_described(target_error: float | None) -> str:
    """decide's reasons to refer, each with what it means, in :data:`gae.decider.refer.REASONS` order."""
    from gae.decider.refer import REASONS

    target = "off" if target_error is None else f"{target_error:g}"
    words = {**REASON_WORDS, "low_confidence": REASON_WORDS["low_confidence"] + f" ({target} on this server)"}
    return "; ".join(f"{reason} ({words[reason]})" if reason in words else reason for reason in REASONS)


def _answer(call: Callable[[], T]) -> T:
    """``call()``, with a refused argument (the service's and the library's ValueError, TypeError
    and KeyError, each naming what it refuses) as the tool's error result."""
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        return call()
    except (ValueError, TypeError, KeyError) as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
        raise ToolError(str(message).replace("\n", " ")) from error  # one line, as every refusal


def refusal(error: ValidationError) -> str:
    """The SDK's check of a call against a tool's schema, failed, in one line naming the argument
    as the service names it (``ids[0]: must be a valid integer, got '0'``)."""
    first = error.errors()[0]
    field = ""
    for part in first["loc"]:
        if isinstance(part, int):
            field += f"[{part}]"
        elif part != "[key]":
            field += f".{part}" if field else str(part)
    message = first["msg"]
    if first["type"] == "missing":
        message = "is required"
    else:
        message = message.replace("Input should be", "must be", 1)
        message += f", got {first['input']!r}"[:200]
    more = error.error_count() - 1
    return f"{field}: {message}" + (f" (and {more} more {'error' if more == 1 else 'errors'})" if more else "")


def build_server(service: MemoryService) -> Any:
    """The ``MCPServer`` with the seven tools over ``service``."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp_types import ToolAnnotations

    import gae

    class Server(MCPServer):
        """The SDK's server, its schema checks answered in one line (:func:`refusal`)."""

        async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
            try:
                return await super().call_tool(name, arguments, context)
            except ToolError as error:
                if isinstance(error.__cause__, ValidationError):
                    raise ToolError(f"Error executing tool {name}: {refusal(error.__cause__)}") from error.__cause__
                raise

    config = service.config
    server = Server("gae", instructions=INSTRUCTIONS, version=gae.__version__)
    name_length, text_length = config.name_length, config.text_length
    scopes = "any scope name" if service.scopes is None else f"one of {list(service.scopes)}"

    def tool(title: str, description: str, *, read_only: bool = False, destructive: bool = False,
             idempotent: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        hints = {} if read_only else {"destructive_hint": destructive, "idempotent_hint": idempotent}
        return server.tool(title=title, description=_plain(description), annotations=ToolAnnotations(
            title=title, read_only_hint=read_only, open_world_hint=False, **hints))

    # decide, verify and explain take a fraction of a millisecond: they run in the event loop, which
    # saves the hop to a worker thread and back (about a millisecond on 2 CPUs). The text tools run the
    # embedding model (milliseconds), so the SDK runs them in its worker threads.

    @tool("Decide", f"""Recommend an action for one decision and keep it pending until verify. The
          set of factor names picks the judgment memory (one per set; the memories tool lists
          them). A first call on a new set of names needs actions, and opens a memory that grows
          its categories and actions as calls name them. A set that nearly is an existing memory's
          (a name left out or added, or spelt a little differently) is refused naming that memory,
          unless new_memory is true. Answers refer=true when a person should look first, with
          reasons among: {reasons_described(config.target_error)}. Verify decisions taken alone
          too: the calibration learns from them.""")
    async def decide(
        category: Annotated[str, _described(
            "The decision's domain, e.g. 'billing'. A category the memory has not met is added (a memory the "
            f"config fixes refuses it), up to {config.max_categories} a memory ([limits] categories), and has no "
            "opinion yet (reason unseen_category).",
            minLength=1, maxLength=name_length)],
        factors: Annotated[dict[str, Number], _described(
            f"The decision's criteria, name: number (finite, within +-1e15; any units: the memory learns their "
            f"spread). At most {config.max_factors} ([limits] factors); the set of names picks the memory.",
            minProperties=1, maxProperties=config.max_factors)],
        actions: Annotated[list[str] | None, _described(
            f"The actions the memory may recommend: needed the first time a set of factor names is seen; "
            f"names the memory lacks are added (a memory the config fixes refuses them), up to "
            f"{config.max_actions} a memory ([limits] actions). Omit it once the memory has them.",
            minItems=1, maxItems=config.max_actions)] = None,
        new_memory: Annotated[Bool, _described(
            "true: these factor names are meant as they are: open a memory for them even though an existing "
            "memory's names are close. No effect on names a memory has already.")] = False,
    ) -> Decided:
        decided = _answer(lambda: service.decide(category, factors, actions, new_memory))
        return Decided(**decided)  # type: ignore[typeddict-item]

    @tool("Verify", f"""Teach the memory the verified action of a pending decision: the decision is
          learned and no longer pending. On a memory that grows, an action it does not have yet is
          added (up to {config.max_actions}, [limits] actions); a memory the config fixes refuses
          it, naming its actions. Verifying a decision twice is refused.""", idempotent=True)
    async def verify(
        decision_id: Annotated[str, _described("The id decide answered.", minLength=1)],
        action: Annotated[str, _described("The action that was right for this decision (the recommended one "
                                          "or another).", minLength=1, maxLength=name_length)],
    ) -> Verified:
        return _answer(lambda: Verified(**service.verify(decision_id, action)))  # type: ignore[typeddict-item]

    @tool("Explain", """Why a decision was decided as it was, by the memory's state at the time:
          each action's distance to its nearest prototype and each factor's share of it
          (contributions), each factor's weight (attention x relevance), each judge's trust and
          votes, and the bins that decided the bins judge.""", read_only=True)
    async def explain(
        decision_id: Annotated[str, _described("The id decide answered (pending or verified).", minLength=1)],
    ) -> Explained:
        return _answer(lambda: Explained(**service.explain(decision_id)))  # type: ignore[typeddict-item]

    @tool("Remember", """Store a text memory in a scope and answer its id. The same text remembered
          again in the same scope is not stored twice: the call answers the id it has (its
          importance and type stay as first given).""", idempotent=True)
    def remember(
        text: Annotated[str, _described(f"The text to keep, 1 to {text_length:,} characters ([limits] "
                                        "text_length).", minLength=1, maxLength=text_length)],
        scope: Annotated[str, _described(f"Whose or which memory it is: {scopes}. A recall sees only the "
                                         "scopes it names.", minLength=1, maxLength=name_length)],
        importance: Annotated[Number, _described("How much it matters, 0 to 1: a part of every recall's score.",
                                                 minimum=0, maximum=1)] = 0.5,
        memory_type: Annotated[Literal["episode", "semantic"], _described(
            "episode: something that happened; semantic: a fact or rule that holds.")] = "episode",
    ) -> Remembered:
        return _answer(lambda: Remembered(id=service.remember(text, scope, importance, memory_type)))

    hours = config.recency_hours

    @tool("Recall", f"""The k text memories that best answer a query, best first, each with its score:
          0.60 x similarity + 0.25 x recency + 0.15 x importance, where recency is exp(-age / {hours:g}
          hours) ([text] recency_hours).""", read_only=True)
    def recall(
        query: Annotated[str, _described(f"What to look for, 1 to {text_length:,} characters.",
                                         minLength=1, maxLength=text_length)],
        scopes: Annotated[list[str] | None, _described(
            f"The scopes to look in ({scopes}); omitted: every scope this server serves "
            f"({'every scope the store holds' if service.scopes is None else list(service.scopes)}).",
            minItems=1)] = None,
        k: Annotated[Int, _described(f"How many memories to answer, 1 to {MAX_K}.", minimum=1, maximum=MAX_K)] = 5,
        memory_type: Annotated[Literal["episode", "semantic"] | None, _described(
            "Only memories of this type; omitted: both.")] = None,
    ) -> Recall:
        found = _answer(lambda: service.recall(query, scopes, k, memory_type))
        return Recall(memories=found)  # type: ignore[typeddict-item]

    @tool("Forget", """Erase text memories by id: gone from the store's files, not only hidden. An
          id that is not a memory of the scopes this server serves is refused, and then nothing is
          erased.""", destructive=True, idempotent=True)
    def forget(
        ids: Annotated[list[Annotated[Int, Field(json_schema_extra={"minimum": 0, "maximum": MAX_ID})]], _described(
            "The ids of the memories to erase (as remember and recall answered them), each once.", minItems=1)],
    ) -> Forgotten:
        return _answer(lambda: Forgotten(forgotten=service.forget(ids)))

    @tool("List memories", """What this server holds that a call may name: the text scopes, and each
          judgment memory's factor names, categories and actions, whether its names are fixed by
          the config or grow, and its pending and learned decisions.""", read_only=True)
    def memories() -> Listed:
        return _answer(lambda: Listed(**service.memories()))  # type: ignore[typeddict-item]

    return server


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gae-mcp", description=DESCRIPTION, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
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


def check_store(path: Path) -> None:
    """ValueError naming ``path`` unless it is a SQLite file the server can open and write, or a
    file it can create: checked before the embedding model loads, so a typo costs no wait."""
    shown = repr(str(path))
    if path.is_dir():
        raise ValueError(f"--store {shown} is a folder: name a SQLite file (in it: {str(path / DEFAULT_STORE)!r})")
    if not path.exists():
        folder = path.parent
        if not folder.is_dir():
            raise ValueError(f"--store {shown}: its folder {str(folder)!r} does not exist")
        try:  # (a file made and removed: permissions alone do not tell, for root or on a read-only mount)
            tempfile.TemporaryFile(dir=folder).close()
        except OSError as error:
            raise ValueError(f"--store {shown}: its folder {str(folder)!r} is not writable "
                             f"({error.strerror})") from None
        return
    if not os.access(path, os.R_OK | os.W_OK):
        raise ValueError(f"--store {shown} cannot be read and written by this user")
    try:
        with path.open("rb") as handle:
            header = handle.read(16)
    except OSError as error:
        raise ValueError(f"--store {shown} cannot be read: {error.strerror}") from error
    if header and header != b"SQLite format 3\x00":  # (an empty file is an empty database)
        raise ValueError(f"--store {shown} is not a SQLite database (another kind of file)")


def check_dsn(dsn: str) -> None:
    """ValueError unless the Postgres database ``dsn`` names can be connected to (psycopg's reason,
    which does not show the password): checked before the embedding model loads."""
    try:
        import psycopg

        from gae.storage import PostgresStore
    except ImportError:
        raise ValueError("--dsn needs psycopg 3: pip install 'gae-torch[store]'") from None
    try:
        PostgresStore(dsn).close()
    except (psycopg.Error, ValueError) as error:
        raise ValueError(f"--dsn cannot be connected to: {error}") from None


def read_config(args: argparse.Namespace) -> ServerConfig:
    """The config the command line names (ValueError naming the file and the key), the store checked
    (:func:`check_store`, :func:`check_dsn`): everything an argument can get wrong, before anything loads."""
    config = ServerConfig.from_toml(args.config) if args.config is not None else ServerConfig()
    if args.dsn is None:
        check_store(args.store or Path(DEFAULT_STORE))
    else:
        check_dsn(args.dsn)
    return config


def quiet_progress_bars() -> None:
    """No progress bar on the server's stderr, which agent hosts keep as the server's log: the
    bars of huggingface_hub, transformers (``Loading weights``) and any tqdm, in this process only."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # read by huggingface_hub, and transformers through it
    os.environ["TQDM_DISABLE"] = "1"
    if "huggingface_hub" in sys.modules:  # imported already: the switches the variables set at import
        sys.modules["huggingface_hub"].utils.disable_progress_bars()
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.disable_progress_bar()


def service_from_args(args: argparse.Namespace, config: ServerConfig | None = None) -> MemoryService:
    """The service the command line asks for (the store opened and its memories loaded)."""
    from gae.episodic.embedders import MINILM_DIM, HashingEmbedder, SentenceEmbedder
    from gae.storage import PostgresStore, SQLiteStore

    config = read_config(args) if config is None else config
    if args.dsn is not None:
        def open_store() -> Any:
            return PostgresStore(args.dsn)
    else:
        path = str(args.store or DEFAULT_STORE)

        def open_store() -> Any:
            return SQLiteStore(path)
    embedder: Any = HashingEmbedder(MINILM_DIM) if args.embedder == "hashing" else None
    if embedder is None:
        quiet_progress_bars()
        with contextlib.redirect_stdout(sys.stderr):  # stdout is the protocol's: a library's print must not reach it
            embedder = SentenceEmbedder()
    service = MemoryService(open_store, scopes=args.scopes, config=config, embedder=embedder)
    _ = service.text  # opened now: a store the config or the embedder cannot open stops the server at its start
    return service


def _stop(message: str, status: int) -> NoReturn:
    print(f"gae-mcp: {' '.join(message.split())}", file=sys.stderr)  # one line, whatever the error held
    sys.exit(status)


def main(argv: Sequence[str] | None = None) -> None:
    """The console script ``gae-mcp``."""
    args = parse_args(argv)
    try:
        config = read_config(args)
    except ValueError as error:  # a bad argument: the usage error's status
        _stop(str(error), 2)
    quiet_progress_bars()
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    try:
        service = service_from_args(args, config)
    except (ValueError, ImportError, OSError) as error:
        _stop(str(error), 1)
    server = build_server(service)
    if args.http is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
