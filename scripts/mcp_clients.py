"""Drive gae-mcp from three MCP clients written elsewhere: langchain-mcp-adapters, fastmcp and the MCP Inspector CLI.

Each client is installed in its own scratch environment under ``--work`` (their ``mcp`` pins
differ from gae's), reused by later runs, refreshed with ``--upgrade``:

- ``langchain``: ``langchain-mcp-adapters`` (PyPI) in a venv. Its driver opens a session with
  ``MultiServerMCPClient`` over stdio, loads the tools with ``load_mcp_tools`` and invokes each
  LangChain tool as an agent's tool call does.
- ``fastmcp``: ``fastmcp`` (PyPI) in another venv. Its driver's ``fastmcp.Client`` talks to the
  server over streamable HTTP (``gae-mcp --http PORT``), so the second transport is driven too.
- ``inspector``: the MCP Inspector CLI (npm), installed with npm's cache in the scratch folder and
  run as ``npx -y @modelcontextprotocol/inspector --cli ... --method tools/list`` (then
  ``tools/call``), one server process per call on the same store. When the newest Inspector wants
  a newer Node than the one on PATH, that Node comes from npm (the ``node`` package) into the
  same folder.

The server runs from this checkout's interpreter (``python -m gae.mcp --embedder hashing``), on
a fresh store per client. The Python drivers are small programs written into their venvs: they
print the client's versions and the tools it listed as one JSON line, then answer each call the
script sends them on stdin with one JSON line. Nothing here names the tools: each client's
listing is called tool by tool, the known tools in the order of :data:`PLAN` with the arguments it
builds (``verify`` and ``explain`` take the id ``decide`` answered, ``forget`` the id
``remember`` answered), any other tool with values built from its input schema's required
properties (:func:`example_value`).

Per client the record says which tools were listed, each call's status (ok, or error with its
message) and a short excerpt of its answer, whether every listed tool was called successfully,
and the versions installed. A client that cannot be installed (no network) is ``unavailable``.
The exit status is 1 when an installed client failed a call (with ``--strict``, also when one is
unavailable).

    python scripts/mcp_clients.py                                # all three; the record in docs/results/
    python scripts/mcp_clients.py --clients langchain,inspector  # a subset
    python scripts/mcp_clients.py --readme docs/mcp_clients.md   # also the page's table
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import IO, Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from training import cli  # noqa: E402
from training.readme import publish_section, write_record  # noqa: E402

SECTION = "mcp-clients"
RECORD = ROOT / "docs" / "results" / f"{SECTION}.json"
INSPECTOR = "@modelcontextprotocol/inspector"
INSTALL_TIMEOUT = 900  # seconds for one pip or npm install
CALL_TIMEOUT = 120  # seconds for the server to start and list, or for one call
EXCERPT = 80  # characters of an answer kept in the record
NPM_QUIET = ("--loglevel=error", "--no-fund", "--no-audit")  # no progress or notices; an error still says why


class Client(NamedTuple):
    title: str  # as the table names it
    package: str  # what is installed: its version is the client's
    transport: str


CLIENTS = {
    "langchain": Client("langchain-mcp-adapters", "langchain-mcp-adapters", "stdio"),
    "fastmcp": Client("fastmcp", "fastmcp", "streamable HTTP"),
    "inspector": Client("MCP Inspector CLI", INSPECTOR, "stdio"),
}


class Unavailable(Exception):
    """The client could not be installed: why, in one line."""


class DriverFailed(Exception):
    """An installed client could not connect or list the tools: why, in one line."""


# -- the plan: what each known tool is called with ------------------------------------------------

class Step(NamedTuple):
    arguments: Callable[[dict[str, Any]], dict[str, Any]]  # the state so far -> the call's arguments
    keeps: str | None = None  # the state key the answer's ``id`` is kept under, for the steps after


SCOPE = "alice"
TEXT = "the invoice was paid twice"
PLAN: dict[str, Step] = {  # in calling order
    "decide": Step(lambda state: {"category": "billing", "factors": {"amount": 120.0, "risk": 0.9},
                                  "actions": ["approve", "escalate"]}, keeps="decision_id"),
    "verify": Step(lambda state: {"decision_id": state["decision_id"], "action": "escalate"}),
    "explain": Step(lambda state: {"decision_id": state["decision_id"]}),
    "remember": Step(lambda state: {"text": TEXT, "scope": SCOPE}, keeps="memory_id"),
    "recall": Step(lambda state: {"query": "invoice paid twice", "scopes": [SCOPE]}),
    "memories": Step(lambda state: {}),
    "forget": Step(lambda state: {"ids": [state["memory_id"]]}),
}


def resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with a local ``$ref`` (``#/$defs/X``, ``#/definitions/X``) followed."""
    while isinstance(schema.get("$ref"), str) and schema["$ref"].startswith("#/"):
        schema = defs.get(schema["$ref"].rsplit("/", 1)[-1], {})
    return schema


def example_value(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> Any:
    """A value that ``schema`` accepts, for an argument no plan knows: its const, first enum
    value or default, else by type a plain value within its bounds: a string of its minimum
    length, 1 moved into its range, False, one item in an array, an object with its required
    properties (or one entry of its ``additionalProperties``)."""
    defs = defs or {}
    schema = resolve(schema, defs)
    for key in ("const", "default"):
        if key in schema:
            return schema[key]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        options = [resolve(option, defs) for option in schema.get(key, [])]
        typed = [option for option in options if option.get("type") != "null"]
        if typed or options:
            return example_value((typed or options)[0], defs)
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind in ("integer", "number"):
        number = 1
        if "exclusiveMinimum" in schema:
            number = max(number, schema["exclusiveMinimum"] + 1)
        number = max(number, schema.get("minimum", number))
        number = min(number, schema.get("maximum", number))
        return int(number) if kind == "integer" else float(number)
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    if kind == "array":
        item = example_value(schema.get("items", {}), defs)
        return [item] * max(1, schema.get("minItems", 1))
    if kind == "object":
        properties = schema.get("properties", {})
        value = {name: example_value(properties.get(name, {}), defs) for name in schema.get("required", [])}
        extra = schema.get("additionalProperties")
        if not properties and isinstance(extra, dict):
            value["example"] = example_value(extra, defs)
        return value
    return "example".ljust(schema.get("minLength", 0), "x")


def arguments_for(name: str, schema: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """The arguments to call tool ``name`` with: the plan's for a known tool, then for every
    required property the plan does not give (an unknown tool's, or one a known tool gained), a
    value built from ``schema``. Raises KeyError naming the state a planned step needs and no
    earlier answer gave."""
    arguments = PLAN[name].arguments(state) if name in PLAN else {}
    properties = schema.get("properties", {})
    for required in schema.get("required", []):
        if required not in arguments:
            arguments[required] = example_value(properties.get(required, {}), schema.get("$defs", {}))
    return arguments


def calling_order(names: Sequence[str]) -> list[str]:
    """The listed tools in the order they are called: the plan's first, in its order, then the
    others as listed."""
    return [name for name in PLAN if name in names] + [name for name in names if name not in PLAN]


def payload(result: dict[str, Any]) -> Any:
    """A call's answer as data: its structured content, else its text read as JSON, else None."""
    if result.get("structured") is not None:
        return result["structured"]
    try:
        return json.loads(result.get("text") or "")
    except ValueError:
        return None


def excerpt(result: dict[str, Any], limit: int = EXCERPT) -> str:
    """The first ``limit`` characters of a call's answer on one line (the data as compact JSON)."""
    data = payload(result)
    text = json.dumps(data, separators=(", ", ": ")) if data is not None else (result.get("text") or "")
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def exercise(tools: Sequence[dict[str, Any]], call: Callable[[str, dict[str, Any]], dict[str, Any]]) -> list[dict]:
    """Call every listed tool once (:func:`calling_order`) through ``call(name, arguments)``, which
    answers ``{"status": "ok" | "error", "text": ..., "structured": ...}``; one entry per call:
    ``tool``, ``arguments``, ``status``, ``message`` (an error's) and ``excerpt``."""
    schemas = {tool["name"]: tool.get("input_schema") or {} for tool in tools}
    state: dict[str, Any] = {}
    calls = []
    for name in calling_order(list(schemas)):
        try:
            arguments = arguments_for(name, schemas[name], state)
        except KeyError as missing:
            calls.append({"tool": name, "arguments": None, "status": "error", "excerpt": "",
                          "message": f"not called: it needs {missing.args[0]}, which no earlier call answered"})
            continue
        result = call(name, arguments)
        entry = {"tool": name, "arguments": arguments, "status": result["status"], "excerpt": excerpt(result)}
        if result["status"] != "ok":
            entry["message"] = " ".join((result.get("text") or "no message").split())
        else:
            keeps = PLAN[name].keeps if name in PLAN else None
            data = payload(result)
            if keeps is not None and isinstance(data, dict) and "id" in data:
                state[keeps] = data["id"]
        calls.append(entry)
    return calls


# -- the verdict and the table --------------------------------------------------------------------

def verdict(report: dict[str, Any]) -> str:
    """One line on a client's run: ``unavailable: why``, ``failed: why``, or how many tools it called."""
    if report["status"] == "unavailable":
        return f"unavailable: {report['reason']}"
    if report.get("reason"):
        return f"failed: {report['reason']}"
    failed = [call["tool"] for call in report["calls"] if call["status"] != "ok"]
    if failed:
        return f"failed: {', '.join(failed)}"
    return f"every listed tool called ({len(report['calls'])})"


def finished(client: str, versions: dict[str, str], tools: list[str], calls: list[dict], protocol: str | None = None,
             reason: str | None = None) -> dict[str, Any]:
    """The report of a client that was installed: ``all_called`` when it listed tools and every
    one was called successfully."""
    all_called = bool(tools) and reason is None and len(calls) == len(tools) and \
        all(call["status"] == "ok" for call in calls)
    return {"client": client, **CLIENTS[client]._asdict(), "status": "ok" if all_called else "failed",
            "reason": reason, "versions": versions, "protocol": protocol, "tools": tools, "calls": calls,
            "all_called": all_called}


def unavailable(client: str, reason: str) -> dict[str, Any]:
    return {"client": client, **CLIENTS[client]._asdict(), "status": "unavailable", "reason": reason,
            "versions": {}, "protocol": None, "tools": [], "calls": [], "all_called": False}


def exit_status(reports: Sequence[dict[str, Any]], strict: bool = False) -> int:
    """1 when an installed client failed (with ``strict``, also when one is unavailable), else 0."""
    if any(report["status"] == "failed" for report in reports):
        return 1
    return int(strict and any(report["status"] == "unavailable" for report in reports))


def cell(text: str) -> str:
    """``text`` as a Markdown table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def table(record: dict[str, Any]) -> str:
    """The Markdown tables of a record (what ``--readme`` writes): one row per client, then one
    row per tool with each client's status and the first successful answer."""
    server = record["server"]
    reports = record["clients"]
    lines = [f"gae-mcp (gae {server['gae']}, mcp {server['mcp']}, Python {server['python']}) on a fresh store per "
             f"client, `--embedder hashing`; run on {record['date']} in {record['seconds']:.0f} s.", "",
             "| client | version | its MCP SDK | transport (protocol) | tools listed | called ok | verdict |",
             "|---|---|---|---|---:|---:|---|"]
    for report in reports:
        versions = report["versions"]
        own = versions.get(report["package"], "—")
        if "node" in versions:
            own += f" (Node {versions['node']})"
        transport = report["transport"] + (f" ({report['protocol']})" if report.get("protocol") else "")
        listed = str(len(report["tools"])) if report["status"] != "unavailable" else "—"
        called = str(sum(call["status"] == "ok" for call in report["calls"])) if listed != "—" else "—"
        lines.append(f"| {report['title']} | {own} | {versions.get('mcp_sdk', '—')} | {transport} | {listed} | "
                     f"{called} | {cell(verdict(report))} |")
    tools = calling_order(list(dict.fromkeys(name for report in reports for name in report["tools"])))
    if not tools:
        return "\n".join(lines)
    lines += ["", "| tool | " + " | ".join(report["client"] for report in reports) + " | answer (first client's) |",
              "|---|" + "---|" * len(reports) + "---|"]
    for name in tools:
        statuses, answer = [], ""
        for report in reports:
            call = next((c for c in report["calls"] if c["tool"] == name), None)
            if call is None:
                statuses.append("not listed" if report["tools"] else "—")  # "—": it listed nothing
            elif call["status"] == "ok":
                statuses.append("ok")
                answer = answer or call["excerpt"]
            else:
                message = call.get("message", "")
                statuses.append(cell(f"error: {message[:60]}{'…' if len(message) > 60 else ''}"))
        shown = f"`{cell(answer)}`" if answer and "`" not in answer else cell(answer) or "—"
        lines.append(f"| `{name}` | " + " | ".join(statuses) + f" | {shown} |")
    return "\n".join(lines)


# -- installing the clients -----------------------------------------------------------------------

def progress(message: str) -> None:
    print(f"[mcp-clients] {message}", file=sys.stderr, flush=True)


def quiet_run(step: str, command: Sequence[str], log: Path, **kwargs: Any) -> None:
    """Run an install ``step``, its output appended to ``log``; Unavailable saying why (:func:`why`) if it fails."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, **kwargs)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise Unavailable(f"{step}: {error}") from error
    output = done.stdout + done.stderr
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n{output}")
    if done.returncode != 0:
        raise Unavailable(f"{step} failed: {why(output)} (log: {log})")


def why(output: str) -> str:
    """The line of a failed install's output that says why: the first error line with words in it
    (pip's ``ERROR: Could not find a version ...``, npm's ``FetchError: request to ... failed``,
    not npm's ``code ECONNREFUSED``), else the last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip() and not line.startswith("$ ")]
    errors = [line.removeprefix("npm error").strip() for line in lines if "error" in line.lower()]
    worded = [line for line in errors if len(line) > 40]
    return (worded or errors or lines or ["no output"])[0 if worded else -1][:200]


def venv_python(folder: Path) -> Path:
    return folder / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def install_python_client(work: Path, client: str, upgrade: bool) -> Path:
    """The venv under ``work/client`` with the client's package installed (made, or reused as it
    is unless ``upgrade``); its Python."""
    folder = work / client
    python, marker = venv_python(folder / "venv"), folder / "installed"
    if python.exists() and marker.exists() and not upgrade:
        return python
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "install.log"
    log.write_text("")
    if not python.exists():
        progress(f"making a venv in {folder / 'venv'}")
        quiet_run("python -m venv", [sys.executable, "-m", "venv", str(folder / "venv")], log)
    package = CLIENTS[client].package
    progress(f"installing {package} (pip, the newest release)")
    quiet_run(f"pip install {package}", [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                                         "--upgrade", package], log)
    marker.write_text(datetime.datetime.now(datetime.timezone.utc).isoformat() + "\n")
    return python


def node_version(environment: dict[str, str]) -> tuple[int, ...] | None:
    """The version of the ``node`` on ``environment``'s PATH, or None without one."""
    node = shutil.which("node", path=environment.get("PATH"))
    if node is None:
        return None
    done = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=60)
    try:
        return tuple(int(part) for part in done.stdout.strip().lstrip("v").split("."))
    except ValueError:
        return None


def minimum_node(engines: str | None) -> tuple[int, ...] | None:
    """The Node version an ``engines.node`` of the form ``>=A.B.C`` asks for at least; None for
    no requirement or another form (the Node on PATH is then used as it is)."""
    if not engines or not engines.strip().startswith(">=") or " " in engines.strip():
        return None
    try:
        return tuple(int(part) for part in engines.strip()[2:].split("."))
    except ValueError:
        return None


def npm_environment(folder: Path) -> dict[str, str]:
    """The environment npm and npx run in: the folder's own binaries (a Node installed there)
    first on PATH, npm's cache in the folder, and no banners, audits or update notices."""
    environment = dict(os.environ)
    environment["PATH"] = f"{folder / 'node_modules' / '.bin'}{os.pathsep}{environment.get('PATH', '')}"
    environment.update({"npm_config_cache": str(folder.parent / "npm-cache"), "npm_config_update_notifier": "false",
                        "npm_config_fund": "false", "npm_config_audit": "false",
                        "MCP_INSPECTOR_SECRET_STORE": "memory"})  # it keeps no secrets here: no keychain notice
    return environment


def package_json(folder: Path, package: str) -> dict[str, Any]:
    path = folder / "node_modules" / package / "package.json"
    return json.loads(path.read_text()) if path.exists() else {}


def install_inspector(work: Path, upgrade: bool) -> Path:
    """The folder ``work/inspector`` with the newest Inspector installed by npm (reused as it is
    unless ``upgrade``), and a Node from npm beside it when the one on PATH is older than the
    Inspector's ``engines.node``."""
    folder = work / "inspector"
    if package_json(folder, INSPECTOR) and (folder / "installed").exists() and not upgrade:
        return folder
    npm = shutil.which("npm")
    if npm is None:
        raise Unavailable("npm is not on PATH")
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "install.log"
    log.write_text("")
    environment = npm_environment(folder)
    progress(f"installing {INSPECTOR}@latest (npm) in {folder}")
    quiet_run(f"npm install {INSPECTOR}", [npm, "install", *NPM_QUIET, f"{INSPECTOR}@latest"], log, cwd=folder,
              env=environment)
    needs = minimum_node(package_json(folder, INSPECTOR).get("engines", {}).get("node"))
    have = node_version(environment)
    if needs is not None and (have is None or have < needs):
        wanted = "^" + ".".join(map(str, needs))
        progress(f"the Inspector needs Node >= {'.'.join(map(str, needs))}, PATH has "
                 f"{'.'.join(map(str, have)) if have else 'none'}: installing node@{wanted} (npm)")
        quiet_run("npm install node", [npm, "install", *NPM_QUIET, f"node@{wanted}"], log, cwd=folder,
                  env=environment)
    (folder / "installed").write_text(datetime.datetime.now(datetime.timezone.utc).isoformat() + "\n")
    return folder


# -- the drivers ----------------------------------------------------------------------------------

DRIVER_LOOP = r'''"""Written by gae's scripts/mcp_clients.py: one MCP client driving gae-mcp.

Prints one JSON line (the versions and the tools the client listed), then answers each call read
from stdin ({"tool": ..., "arguments": ...}, one JSON a line) with one JSON line."""
import asyncio
import json
import sys
from importlib.metadata import version


def send(message):
    sys.stdout.write(json.dumps(message, default=str) + "\n")
    sys.stdout.flush()


def text_of(content):
    if isinstance(content, str):
        return content
    blocks = [block if isinstance(block, dict) else block.model_dump(mode="json") for block in content]
    return "\n".join(block.get("text", json.dumps(block)) for block in blocks)


async def serve(hello, call):
    send(hello)
    while line := await asyncio.to_thread(sys.stdin.readline):
        request = json.loads(line)
        try:
            answer = await call(request["tool"], request["arguments"])
        except Exception as error:  # the client's own refusal or failure: reported, and the next call goes on
            answer = {"status": "error", "text": f"{type(error).__name__}: {error}"}
        send(answer)

'''

DRIVERS = {
    "langchain": DRIVER_LOOP + r'''
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.tools import load_mcp_tools


def schema_of(tool):
    schema = tool.args_schema
    return schema if isinstance(schema, dict) else schema.model_json_schema()


async def main():
    server = json.loads(sys.argv[1])
    client = MultiServerMCPClient({"gae": {"transport": "stdio", **server}})
    async with client.session("gae", auto_initialize=False) as session:
        initialized = await session.initialize()
        tools = {tool.name: tool for tool in await load_mcp_tools(session, server_name="gae")}

        async def call(name, arguments):  # as an agent's tool call: a ToolMessage, status "error" on an error result
            message = await tools[name].ainvoke({"type": "tool_call", "id": "call", "name": name, "args": arguments})
            structured = (message.artifact or {}).get("structured_content")
            return {"status": "error" if message.status == "error" else "ok", "text": text_of(message.content),
                    "structured": structured}

        versions = {"langchain-mcp-adapters": version("langchain-mcp-adapters"),
                    "langchain-core": version("langchain-core"), "mcp_sdk": f"mcp {version('mcp')}"}
        await serve({"versions": versions, "protocol": initialized.protocolVersion,
                     "tools": [{"name": name, "input_schema": schema_of(tool)} for name, tool in tools.items()]}, call)


asyncio.run(main())
''',
    "fastmcp": DRIVER_LOOP + r'''
from fastmcp import Client


async def main():
    async with Client(sys.argv[1]) as client:
        tools = await client.list_tools()

        async def call(name, arguments):
            result = await client.call_tool(name, arguments, raise_on_error=False)
            return {"status": "error" if result.is_error else "ok", "text": text_of(result.content),
                    "structured": result.structured_content}

        listed = [{"name": tool.name, "input_schema": getattr(tool, "input_schema", None)
                   or getattr(tool, "inputSchema", None)} for tool in tools]
        versions = {"fastmcp": version("fastmcp"), "mcp_sdk": f"mcp {version('mcp')}"}
        await serve({"versions": versions, "protocol": getattr(client, "protocol_version", None), "tools": listed},
                    call)


asyncio.run(main())
''',
}


def server_command(store: Path) -> list[str]:
    """gae-mcp from this checkout's interpreter, on ``store``, with the embedder that needs no model."""
    return [sys.executable, "-m", "gae.mcp", "--store", str(store), "--embedder", "hashing"]


class PythonDriver:
    """A driver program run by a client's venv Python: the hello it printed (``versions``,
    ``protocol``, ``tools``) and :meth:`call`. Its stderr (and the stdio server's) goes to ``log``."""

    def __init__(self, python: Path, script: Path, argument: str, log: IO[str]) -> None:
        self.process = subprocess.Popen([str(python), str(script), argument], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        hello = self._answer("to start and list the tools")
        self.versions, self.protocol, self.tools = hello["versions"], hello.get("protocol"), hello["tools"]

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put("")

    def _answer(self, what: str) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=CALL_TIMEOUT)
        except queue.Empty:
            raise DriverFailed(f"no answer in {CALL_TIMEOUT} s {what}") from None
        if not line:
            raise DriverFailed(f"the driver exited ({self.process.wait()}) before it answered {what}")
        return json.loads(line)

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"tool": name, "arguments": arguments}) + "\n")
        self.process.stdin.flush()
        try:
            return self._answer(f"the call of {name}")
        except DriverFailed as error:
            return {"status": "error", "text": str(error)}

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class InspectorDriver:
    """The Inspector CLI, one ``npx`` process (and one server) per method, on one config file
    naming the server."""

    def __init__(self, folder: Path, store: Path, log: IO[str]) -> None:
        command = server_command(store)
        config = folder / "gae-mcp.json"
        config.write_text(json.dumps({"mcpServers": {"gae": {"command": command[0], "args": command[1:]}}}, indent=1))
        self.folder, self.log, self.environment = folder, log, npm_environment(folder)
        self.base = [shutil.which("npx", path=self.environment["PATH"]) or "npx", "-y", INSPECTOR, "--cli",
                     "--config", str(config), "--server", "gae", "--cwd", str(ROOT)]
        have = node_version(self.environment)
        self.versions = {INSPECTOR: package_json(folder, INSPECTOR).get("version", "?"),
                         "node": ".".join(map(str, have)) if have else "?"}
        for sdk in ("@modelcontextprotocol/client", "@modelcontextprotocol/sdk"):
            found = package_json(folder, sdk) or package_json(folder / "node_modules" / INSPECTOR, sdk)
            if found:
                self.versions["mcp_sdk"] = f"{sdk} {found['version']}"
                break
        self.protocol = None
        listed = self._run(["--method", "tools/list"])
        if "tools" not in listed:
            raise DriverFailed(f"tools/list answered no tools: {listed.get('text', listed)}")
        self.tools = [{"name": tool["name"], "input_schema": tool.get("inputSchema")} for tool in listed["tools"]]

    def _run(self, arguments: list[str]) -> dict[str, Any]:
        """The JSON the CLI printed (``text`` holds its output when it printed none)."""
        try:
            done = subprocess.run(self.base + arguments, capture_output=True, text=True, cwd=self.folder,
                                  env=self.environment, timeout=CALL_TIMEOUT)
        except subprocess.TimeoutExpired:
            return {"isError": True, "text": f"no answer in {CALL_TIMEOUT} s"}
        self.log.write(f"$ {' '.join(self.base + arguments)}\n{done.stderr}")
        try:
            answer = json.loads(done.stdout)
        except ValueError:
            lines = (done.stdout + done.stderr).strip().splitlines()
            return {"isError": True, "text": f"exit {done.returncode}: {lines[-1] if lines else 'no output'}"}
        return answer if isinstance(answer, dict) else {"isError": True, "text": done.stdout}

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        # every value as JSON: the CLI reads a value as JSON first, so a text of digits stays a text
        pairs = [f"{key}={json.dumps(value)}" for key, value in arguments.items()]
        answer = self._run(["--method", "tools/call", "--tool-name", name, *(["--tool-arg", *pairs] if pairs else [])])
        text = answer.get("text") or "\n".join(block.get("text", "") for block in answer.get("content", []))
        return {"status": "error" if answer.get("isError") else "ok", "text": text,
                "structured": answer.get("structuredContent")}

    def close(self) -> None:
        pass


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class HttpServer:
    """gae-mcp serving streamable HTTP on a free port of 127.0.0.1, until :meth:`close`."""

    def __init__(self, store: Path, log: IO[str]) -> None:
        self.port = free_port()
        self.process = subprocess.Popen([*server_command(store), "--http", str(self.port)], stdout=log, stderr=log,
                                        cwd=ROOT)
        deadline = time.monotonic() + CALL_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise DriverFailed(f"gae-mcp --http exited ({self.process.returncode}) before it listened")
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.2)
        self.close()
        raise DriverFailed(f"gae-mcp --http did not listen on port {self.port} in {CALL_TIMEOUT} s")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def run_client(client: str, work: Path, scratch: Path, upgrade: bool) -> dict[str, Any]:
    """Install (or reuse) ``client``, drive a fresh server with it and report what it saw."""
    try:
        if client == "inspector":
            folder = install_inspector(work, upgrade)
        else:
            python = install_python_client(work, client, upgrade)
    except Unavailable as error:
        return unavailable(client, str(error))
    store = scratch / f"{client}.db"
    log_path = work / client / "last-run.log"
    versions: dict[str, str] = {}
    with log_path.open("w") as log:
        server: HttpServer | None = None
        driver: PythonDriver | InspectorDriver | None = None
        try:
            if client == "inspector":
                driver = InspectorDriver(folder, store, log)
            else:
                script = work / client / "driver.py"
                script.write_text(DRIVERS[client])
                if client == "fastmcp":
                    server = HttpServer(store, log)
                    argument = server.url
                else:
                    command = server_command(store)
                    argument = json.dumps({"command": command[0], "args": command[1:], "cwd": str(ROOT)})
                driver = PythonDriver(python, script, argument, log)
            versions = driver.versions
            progress(f"{client}: listed {', '.join(tool['name'] for tool in driver.tools)}")
            calls = exercise(driver.tools, driver.call)
            return finished(client, versions, [tool["name"] for tool in driver.tools], calls, driver.protocol)
        except (DriverFailed, ValueError, OSError) as error:
            log.flush()
            logged = [line.strip() for line in log_path.read_text().splitlines() if line.strip()]
            last = f"; the log ends: {logged[-1][:200]}" if logged else ""
            return finished(client, versions, [], [], reason=f"{error}{last} (log: {log_path})")
        finally:
            if driver is not None:
                driver.close()
            if server is not None:
                server.close()


def client_names(text: str) -> list[str]:
    """An argparse ``type=`` for ``--clients``: names separated by commas, each one of :data:`CLIENTS`."""
    import argparse

    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in CLIENTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"must name clients among {', '.join(CLIENTS)}, got {text!r}")
    return list(dict.fromkeys(names))


def default_work() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gae-mcp-clients"


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=client_names, default=list(CLIENTS),
                        help=f"the clients to run, separated by commas (default: {','.join(CLIENTS)})")
    parser.add_argument("--work", type=Path, default=default_work(),
                        help="the scratch folder the clients are installed in, reused by later runs "
                             "(default: $XDG_CACHE_HOME or ~/.cache, /gae-mcp-clients)")
    parser.add_argument("--upgrade", action="store_true", help="install the newest releases again, not reuse")
    parser.add_argument("--strict", action="store_true", help="exit 1 also when a client is unavailable")
    parser.add_argument("--out", type=Path, default=RECORD,
                        help="the JSON record (default: docs/results/mcp-clients.json)")
    parser.add_argument("--readme", type=Path, default=None, help=f"the page with {SECTION} markers to update")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    reports = []
    with tempfile.TemporaryDirectory(prefix="gae-mcp-clients-") as scratch:
        for client in args.clients:
            progress(f"{client}: installing or reusing, then driving gae-mcp")
            reports.append(run_client(client, args.work, Path(scratch), args.upgrade))
            progress(f"{client}: {verdict(reports[-1])}")
    record = {"date": datetime.date.today().isoformat(), "seconds": time.perf_counter() - start,
              "server": {"gae": version("gae-torch"), "mcp": version("mcp"), "python": platform.python_version()},
              "clients": reports}
    print(table(record))
    write_record(args.out, record)
    if args.readme is not None and not publish_section(args.readme, SECTION, record, table):
        parser.error(f"--readme {args.readme}: no {SECTION} markers")
    return exit_status(reports, args.strict)


if __name__ == "__main__":
    sys.exit(main())
