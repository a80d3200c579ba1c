"""scripts/mcp_clients.py: the plan and the arguments it builds, the verdicts and the table, directly;
then, marked slow, the real script driving gae-mcp from the three outside clients it installs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from scripts import mcp_clients
from scripts.mcp_clients import (
    PLAN,
    arguments_for,
    calling_order,
    example_value,
    excerpt,
    exercise,
    exit_status,
    finished,
    minimum_node,
    table,
    unavailable,
    verdict,
    why,
)
from training.readme import as_saved

ROOT = Path(__file__).resolve().parents[1]
SIX = {"decide", "verify", "explain", "remember", "recall", "forget"}  # the tools gae-mcp has had from the start


def test_example_values_follow_the_schema():
    defs = {"Kind": {"enum": ["fast", "slow"]}, "Box": {"type": "object", "required": ["size"],
                                                        "properties": {"size": {"type": "integer", "minimum": 3}}}}
    assert example_value({"$ref": "#/$defs/Kind"}, defs) == "fast"
    assert example_value({"$ref": "#/$defs/Box"}, defs) == {"size": 3}
    assert example_value({"anyOf": [{"type": "null"}, {"type": "number", "exclusiveMinimum": 5}]}) == 6.0
    assert example_value({"type": "integer", "maximum": 0}) == 0
    assert example_value({"type": ["null", "boolean"]}) is False
    assert example_value({"type": "string", "minLength": 10}) == "examplexxx"
    assert example_value({"type": "array", "items": {"type": "string"}, "minItems": 2}) == ["example", "example"]
    assert example_value({"type": "object", "additionalProperties": {"type": "number"}}) == {"example": 1.0}
    assert example_value({"const": "x"}) == "x" and example_value({"type": "number", "default": 0.5}) == 0.5
    assert example_value({}) == "example"


def test_an_unknown_tool_gets_its_required_properties_only():
    schema = {"type": "object", "required": ["topic", "limit", "box"],
              "properties": {"topic": {"type": "string"}, "limit": {"type": "integer", "minimum": 1},
                             "box": {"$ref": "#/$defs/Box"}, "optional": {"type": "string"}},
              "$defs": {"Box": {"type": "object", "required": ["tags"],
                                "properties": {"tags": {"type": "array", "items": {"type": "string"}}}}}}
    assert arguments_for("summarise", schema, {}) == {"topic": "example", "limit": 1, "box": {"tags": ["example"]}}
    assert arguments_for("ping", {"type": "object", "properties": {}}, {}) == {}


def test_a_known_tool_takes_the_plan_and_any_required_property_it_gained():
    schema = {"type": "object", "required": ["category", "factors", "tenant"],
              "properties": {"tenant": {"type": "string"}, "new_memory": {"type": "boolean"}}}
    arguments = arguments_for("decide", schema, {})
    assert arguments["category"] == "billing" and arguments["actions"] == ["approve", "escalate"]
    assert arguments["tenant"] == "example" and "new_memory" not in arguments
    assert arguments_for("verify", {}, {"decision_id": "d1"}) == {"decision_id": "d1", "action": "escalate"}
    with pytest.raises(KeyError, match="decision_id"):
        arguments_for("explain", {}, {})


def test_the_listed_tools_are_called_in_plan_order_then_as_listed():
    assert calling_order(["forget", "search", "decide", "verify", "alpha"]) == \
        ["decide", "verify", "forget", "search", "alpha"]
    assert list(PLAN)[:3] == ["decide", "verify", "explain"]  # verify and explain need what decide answered


def fake_server(fails: frozenset[str] = frozenset()) -> tuple[list[tuple[str, dict]], Any]:
    """A ``call`` that answers as gae-mcp does (decide and remember an ``id``), an error for ``fails``."""
    seen: list[tuple[str, dict]] = []

    def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        seen.append((name, arguments))
        if name in fails:
            return {"status": "error", "text": f"Error executing tool {name}: refused |\n here"}
        answers = {"decide": {"id": "d-7", "action": None}, "remember": {"id": 42}}
        structured = answers.get(name, {"ok": True})
        text_only = name == "remember"  # as a client that hands over the text alone
        return {"status": "ok", "text": json.dumps(structured), "structured": None if text_only else structured}

    return seen, call


def test_exercise_threads_the_ids_through_the_plan_and_calls_an_unknown_tool():
    seen, call = fake_server()
    tools = [{"name": name, "input_schema": {}} for name in ("forget", "remember", "recall", "explain", "verify",
                                                               "decide", "memories")]
    tools.append({"name": "ping", "input_schema": {"type": "object", "required": ["n"],
                                                    "properties": {"n": {"type": "integer"}}}})
    calls = exercise(tools, call)
    assert [name for name, _ in seen] == ["decide", "verify", "explain", "remember", "recall", "memories", "forget",
                                          "ping"]
    by_tool = dict(seen)
    assert by_tool["verify"]["decision_id"] == "d-7" and by_tool["explain"] == {"decision_id": "d-7"}
    assert by_tool["forget"] == {"ids": [42]}  # read from the answer's text: that client gave no structured content
    assert by_tool["ping"] == {"n": 1}
    assert all(entry["status"] == "ok" for entry in calls) and calls[3]["excerpt"] == '{"id": 42}'
    assert finished("fastmcp", {}, [tool["name"] for tool in tools], calls)["all_called"]


def test_a_failed_decide_leaves_verify_and_explain_uncalled_and_reported():
    seen, call = fake_server(fails=frozenset({"decide"}))
    calls = exercise([{"name": name, "input_schema": {}} for name in ("decide", "verify", "explain")], call)
    assert [name for name, _ in seen] == ["decide"]
    assert calls[0]["message"] == "Error executing tool decide: refused | here"
    assert [entry["message"] for entry in calls[1:]] == \
        ["not called: it needs decision_id, which no earlier call answered"] * 2


def test_excerpt_is_one_short_line():
    assert excerpt({"structured": {"text": "a\nb"}}) == '{"text": "a\\nb"}'
    assert excerpt({"text": "not json\n  at all"}) == "not json at all"
    long = excerpt({"text": "x" * 200})
    assert len(long) == mcp_clients.EXCERPT and long.endswith("…")


def reports() -> list[dict[str, Any]]:
    _, call = fake_server()
    listed = ["decide", "verify", "remember", "forget"]
    every = exercise([{"name": name, "input_schema": {}} for name in listed], call)
    _, failing = fake_server(fails=frozenset({"forget"}))
    some = exercise([{"name": name, "input_schema": {}} for name in listed], failing)
    return [finished("langchain", {"langchain-mcp-adapters": "0.3.2", "mcp_sdk": "mcp 1.30.0"}, listed, every,
                     "2025-11-25"),
            finished("fastmcp", {"fastmcp": "4.2.3", "mcp_sdk": "mcp 2.3.0"}, listed, some),
            unavailable("inspector", "npm install failed: ENOTFOUND registry.npmjs.org")]


def test_the_verdicts_and_the_exit_status():
    ok, failed, missing = reports()
    assert ok["status"] == "ok" and verdict(ok) == "every listed tool called (4)"
    assert failed["status"] == "failed" and not failed["all_called"] and verdict(failed) == "failed: forget"
    assert verdict(missing) == "unavailable: npm install failed: ENOTFOUND registry.npmjs.org"
    assert exit_status([ok, missing]) == 0 and exit_status([ok, missing], strict=True) == 1
    assert exit_status([ok, failed, missing]) == 1 and exit_status([ok], strict=True) == 0
    broken = finished("inspector", {}, [], [], reason="tools/list answered no tools")
    assert broken["status"] == "failed" and exit_status([broken]) == 1
    assert verdict(broken) == "failed: tools/list answered no tools"
    assert not finished("fastmcp", {}, [], [])["all_called"]  # a client that listed nothing called nothing


def test_the_table_has_a_row_per_client_and_per_tool():
    record = as_saved({"date": "2026-01-02", "seconds": 12.3, "clients": reports(),
                       "server": {"gae": "0.1.0", "mcp": "2.3.0", "python": "3.11.7"}})
    text = table(record)
    lines = text.splitlines()
    assert lines[0].startswith("gae-mcp (gae 0.1.0, mcp 2.3.0, Python 3.11.7)") and "in 12 s" in lines[0]
    assert "| langchain-mcp-adapters | 0.3.2 | mcp 1.30.0 | stdio (2025-11-25) | 4 | 4 | every listed tool called " \
           "(4) |" in lines
    assert "| fastmcp | 4.2.3 | mcp 2.3.0 | streamable HTTP | 4 | 3 | failed: forget |" in lines
    assert "| MCP Inspector CLI | — | — | stdio | — | — | unavailable: npm install failed: ENOTFOUND " \
           "registry.npmjs.org |" in lines
    assert "| tool | langchain | fastmcp | inspector | answer (first client's) |" in lines
    assert '| `decide` | ok | ok | — | `{"id": "d-7", "action": null}` |' in lines
    assert "| `forget` | ok | error: Error executing tool forget: refused \\| here | — | `{\"ok\": true}` |" in lines
    assert table(as_saved(record)) == text  # a function of the record as committed
    alone = table({**record, "clients": [reports()[2]]})
    assert "| tool |" not in alone  # no client listed a tool


def test_an_install_failure_is_said_in_its_worded_line():
    npm = ("npm error code ECONNREFUSED\nnpm error syscall connect\nnpm error FetchError: request to "
           "https://registry.npmjs.org/x failed, reason: getaddrinfo ENOTFOUND\nnpm error A complete log of this run "
           "can be found in: /tmp/x.log\n")
    assert why(npm) == "FetchError: request to https://registry.npmjs.org/x failed, reason: getaddrinfo ENOTFOUND"
    pip = ("WARNING: Retrying\nERROR: Could not find a version that satisfies the requirement fastmcp (from versions: "
           "none)\nERROR: No matching distribution found for fastmcp\n")
    assert why(pip).startswith("ERROR: Could not find a version")
    assert why("Killed\n") == "Killed" and why("") == "no output"


def test_minimum_node_reads_only_a_plain_lower_bound():
    assert minimum_node(">=22.19.0") == (22, 19, 0)
    assert minimum_node("^20 || >=22") is None and minimum_node(None) is None and minimum_node(">=x") is None


def test_the_command_line_refuses_an_unknown_client():
    refused = subprocess.run([sys.executable, "scripts/mcp_clients.py", "--clients", "langchain,claude"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "must name clients among langchain, fastmcp, inspector" in refused.stderr


def reachable(url: str) -> str | None:
    """None when ``url`` answers, else why not."""
    try:
        with urllib.request.urlopen(url, timeout=15):
            return None
    except OSError as error:
        return f"{url}: {error}"


@pytest.mark.slow  # installs three clients from PyPI and npm (about a minute, then reused from the cache)
def test_three_outside_clients_list_and_call_every_tool(tmp_path):
    if shutil.which("npm") is None:
        pytest.skip("npm is not on PATH")
    for url in ("https://pypi.org/simple/fastmcp/", "https://registry.npmjs.org/@modelcontextprotocol%2finspector"):
        if (why := reachable(url)) is not None:
            pytest.skip(f"a registry cannot be reached: {why}")
    out = tmp_path / "mcp-clients.json"
    run = subprocess.run([sys.executable, "scripts/mcp_clients.py", "--strict", "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    record = json.loads(out.read_text())
    assert [report["client"] for report in record["clients"]] == ["langchain", "fastmcp", "inspector"]
    listed = [set(report["tools"]) for report in record["clients"]]
    assert SIX <= listed[0] and listed[0] == listed[1] == listed[2]
    for report in record["clients"]:
        assert report["all_called"] and report["versions"]["mcp_sdk"], report
        assert [call["tool"] for call in report["calls"]] == calling_order(report["tools"])
        assert all(call["status"] == "ok" and call["excerpt"] for call in report["calls"]), report["calls"]
    assert run.stdout.count("every listed tool called") == 3
