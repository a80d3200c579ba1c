"""Several hosts, one Postgres, one judgment: processes that each hold their own Decider, and
``gae-mcp`` servers, on the same ledger.

Each "host" is an OS process (``sys.executable -c``, no fork of a torch process) that opens
``Decider(JudgmentMemory(...), store=PostgresStore(dsn))`` and answers one JSON command a line
on its stdin (decide, verify, sync, pending, save its state). A decision made on one host is
verified on another; afterwards every host, and a Decider opened fresh on the ledger, holds the
same memory bit for bit (every tensor of its ``state_dict`` by ``torch.equal``, its version, its
referral and its pending decisions). A host killed with SIGKILL while deciding loses no decision
it acknowledged: another host verifies each. Two ``gae-mcp --dsn`` servers over stdio share
decisions, verifications and the list of memories the same way.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from gae import Decider, JudgmentMemory
from tests.test_ledger_concurrency import same  # equal, tensors by torch.equal and dtype

ROOT = Path(__file__).resolve().parents[1]
CATEGORIES, ACTIONS, FACTORS = ["billing", "refunds"], ["approve", "escalate"], 3
SNAPSHOT_EVERY = 3  # small, so a host that opens the ledger late starts from a snapshot and replays the rest
LINE_TIMEOUT = 120.0  # seconds to wait for a host's answer (its start imports torch and connects)


def new_memory() -> JudgmentMemory:
    return JudgmentMemory(CATEGORIES, ACTIONS, FACTORS)


def cases(n: int, seed: int = 0) -> list[tuple[list[float], str]]:
    """``n`` seeded decisions, (factors, category); the floats survive JSON exactly."""
    gen = torch.Generator().manual_seed(seed)
    factors = torch.rand(n, FACTORS, generator=gen, dtype=torch.float64).tolist()
    return [(row, CATEGORIES[i % len(CATEGORIES)]) for i, row in enumerate(factors)]


# -- the host process ----------------------------------------------------------------------------
def say(answer: dict[str, Any]) -> None:
    """One JSON line in one write (a kill cannot cut it in two)."""
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


def host_main(dsn: str) -> None:
    """Serve commands from stdin on a Decider of its own until stdin closes (or the host is killed)."""
    from gae.storage import PostgresStore

    torch.set_num_threads(1)
    decider = Decider(new_memory(), store=PostgresStore(dsn), snapshot_every=SNAPSHOT_EVERY)
    say({"ready": True})
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        try:
            if op == "decide":
                decision = decider.decide(command["factors"], command["category"], id=command["id"])
                say({"id": decision.id, "action": decision.action})
            elif op == "verify":
                decider.verify(command["id"], command["action"])
                say({"verified": command["id"]})
            elif op == "sync":
                decider.sync()
                say({"version": int(decider.version)})
            elif op == "pending":
                say({"pending": [d.id for d in decider.pending()]})
            elif op == "save":
                torch.save(decider.state_dict(), command["path"])
                say({"version": int(decider.version)})
            elif op == "decide_until_killed":  # one acknowledgement line after each decide returns
                for i, (factors, category) in enumerate(cases(100_000, seed=command["seed"])):
                    say({"ack": decider.decide(factors, category, id=f"k{i}").id})
            else:
                raise ValueError(f"no command {op!r}")
        except (KeyError, ValueError, RuntimeError) as error:
            say({"refused": f"{type(error).__name__}: {error}"})
    decider.close()


class Host:
    """A host process and the lines it answers (read by a thread, so a silent host fails the test, never hangs it)."""

    def __init__(self, dsn: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", "import sys; from tests.test_many_hosts import host_main; host_main(sys.argv[1])",
             dsn], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def answer(self) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=LINE_TIMEOUT)
        except queue.Empty:
            raise AssertionError(f"the host said nothing for {LINE_TIMEOUT:g} s") from None
        if line is None:
            self.process.wait(timeout=LINE_TIMEOUT)
            assert self.process.stderr is not None
            raise AssertionError(f"the host ended ({self.process.returncode}): {self.process.stderr.read()[-3000:]}")
        return json.loads(line)

    def send(self, op: str, **arguments: Any) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"op": op, **arguments}) + "\n")
        self.process.stdin.flush()

    def ask(self, op: str, **arguments: Any) -> dict[str, Any]:
        self.send(op, **arguments)
        answer = self.answer()
        assert "refused" not in answer, f"{op} {arguments}: {answer['refused']}"
        return answer

    def state(self, path: Path) -> dict[str, Any]:
        """The host's ``Decider.state_dict()`` after it applied what the other hosts committed."""
        self.ask("sync")
        self.ask("save", path=str(path))
        return torch.load(path, weights_only=True)

    def stop(self) -> None:
        """Close its stdin (it leaves the ledger and ends), or kill it when it does not end."""
        if self.process.poll() is None:
            try:
                assert self.process.stdin is not None
                self.process.stdin.close()
                self.process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()


@pytest.fixture
def hosts(dsn: str):
    """Start hosts on ``dsn`` (all of them importing torch at once); every one stopped at the end."""
    started: list[Host] = []

    def start(n: int) -> list[Host]:
        new = [Host(dsn) for _ in range(n)]
        started.extend(new)
        for host in new:
            assert host.answer() == {"ready": True}
        return new

    yield start
    for host in started:
        host.stop()


# -- comparing states ----------------------------------------------------------------------------
def assert_same_judgment(got: dict[str, Any], want: dict[str, Any], what: str) -> None:
    """Two ``Decider.state_dict()`` hold one judgment: every tensor of the memory bit for bit, its
    extra state but the in-RAM logs (a Decider opened from a snapshot starts its logs there, by
    design: docs/ledger.md), the referral and the pending decisions."""
    memory, wanted = got["memory"], want["memory"]
    assert memory.keys() == wanted.keys(), f"{what}: other state_dict keys"
    differ = [k for k, v in wanted.items() if isinstance(v, torch.Tensor) and not same(memory[k], v)]
    assert not differ, f"{what}: these tensors differ: {differ}"

    def extra(state: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in state["_extra_state"].items() if not k.endswith("_log")}

    assert same(extra(memory), extra(wanted)), f"{what}: the extra state differs"
    assert same(got["referral"], want["referral"]), f"{what}: the referral differs"
    assert got["pending"]["id"] == want["pending"]["id"], f"{what}: other pending decisions"


def opened_state(dsn: str) -> tuple[dict[str, Any], int]:
    """``Decider.state_dict()`` and version of a Decider opened now on the ledger, in this process (one more host)."""
    from gae.storage import PostgresStore

    store = PostgresStore(dsn)
    try:
        with Decider(new_memory(), store=store, snapshot_every=SNAPSHOT_EVERY) as decider:
            return decider.state_dict(), int(decider.version)
    finally:
        store.close()


# -- (a) processes, each with its own Decider ----------------------------------------------------
def test_a_decision_made_in_one_process_is_verified_in_another_and_all_hold_one_state_bit_for_bit(
        dsn, hosts, tmp_path):
    first, second = hosts(2)
    (f0, c0), *rest = cases(8, seed=1)

    made = first.ask("decide", factors=f0, category=c0, id="d0")
    assert made == {"id": "d0", "action": None}  # nothing learned yet: no opinion
    assert second.ask("pending")["pending"] == ["d0"]  # committed before the decide returned
    second.ask("verify", id="d0", action="escalate")
    assert first.ask("pending")["pending"] == []
    # the first host learned what the second verified: the same case now recommends the verified action
    assert first.ask("decide", factors=f0, category=c0, id="d1")["action"] == "escalate"
    second.ask("verify", id="d1", action="escalate")

    # both hosts decide and verify, each verifying decisions of the other
    for i, (factors, category) in enumerate(rest, start=2):
        maker, checker = (first, second) if i % 2 else (second, first)
        maker.ask("decide", factors=factors, category=category, id=f"d{i}")
        if i < len(rest) + 1:  # the last one stays pending
            checker.ask("verify", id=f"d{i}", action="escalate" if i % 3 == 0 else "approve")

    one, two = first.state(tmp_path / "first.pt"), second.state(tmp_path / "second.pt")
    last = f"d{len(rest) + 1}"
    assert one["pending"]["id"] == [last]
    assert int(one["memory"]["num_decisions"]) == len(rest) + 1  # d0 .. d7 learned, each once
    assert_same_judgment(one, two, "the first host against the second")
    versions = {first.ask("sync")["version"], second.ask("sync")["version"]}

    third, version = opened_state(dsn)  # from the latest snapshot plus the verifications after it
    assert_same_judgment(third, one, "a Decider opened afterwards against the hosts")
    assert versions == {version}
    first.ask("verify", id=last, action="approve")  # a pending decision the third Decider read back


def test_a_host_killed_while_deciding_loses_no_acknowledged_decision(dsn, hosts, tmp_path):
    killed, survivor = hosts(2)
    killed.send("decide_until_killed", seed=2)
    for _ in range(12):
        assert "ack" in killed.answer()
    os.kill(killed.process.pid, signal.SIGKILL)  # it decides without a pause: the kill mostly lands inside one
    killed.process.wait(timeout=30)
    assert killed.process.returncode == -signal.SIGKILL
    acknowledged = [f"k{i}" for i in range(12)]
    while (line := killed.lines.get(timeout=LINE_TIMEOUT)) is not None:  # the acknowledgements it wrote before
        acknowledged.append(json.loads(line)["ack"])
    assert acknowledged == [f"k{i}" for i in range(len(acknowledged))]

    pending = survivor.ask("pending")["pending"]
    assert pending[:len(acknowledged)] == acknowledged  # every acknowledged decision, in order
    assert len(pending) <= len(acknowledged) + 1  # and at most the one in flight (committed, not acknowledged)
    for i, decision_id in enumerate(pending):
        survivor.ask("verify", id=decision_id, action=ACTIONS[i % 2])
    assert survivor.ask("pending")["pending"] == []

    after = survivor.state(tmp_path / "survivor.pt")
    assert int(after["memory"]["num_decisions"]) == len(pending)
    reopened, _ = opened_state(dsn)
    assert_same_judgment(reopened, after, "a Decider opened after the kill against the survivor")


# -- (b) two gae-mcp servers ----------------------------------------------------------------------
def test_two_mcp_servers_on_one_postgres_share_decisions_verifications_and_memories(dsn):
    pytest.importorskip("mcp")
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    server = StdioServerParameters(command=sys.executable,
                                   args=["-m", "gae.mcp", "--dsn", dsn, "--embedder", "hashing"])

    async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
        result = await client.call_tool(tool, arguments)
        assert not result.is_error, result.content[0].text
        return result.structured_content

    async def refused(client: Client, tool: str, **arguments: Any) -> str:
        result = await client.call_tool(tool, arguments)
        assert result.is_error, result.structured_content
        return result.content[0].text

    case = {"amount": 0.2, "risk": 0.9}

    async def go() -> None:
        async with Client(server) as one, Client(server) as two:
            tools = [sorted(tool.name for tool in (await client.list_tools()).tools) for client in (one, two)]
            assert tools[0] == tools[1] == ["decide", "explain", "forget", "memories", "recall", "remember",
                                            "verify"]
            first = await call(one, "decide", category="billing", factors=case, actions=["approve", "escalate"])
            assert first["action"] is None and first["reasons"] == ["unseen_category"]

            listed = await call(two, "memories")  # the second server opens the memory the first made
            assert [(m["factors"], m["actions"], m["pending"], m["learned"]) for m in listed["judgment"]] == [
                (["amount", "risk"], ["approve", "escalate"], 1, 0)]
            verified = await call(two, "verify", decision_id=first["id"], action="escalate")
            assert verified["learned"] and not verified["confirmed"]
            assert "not pending" in await refused(one, "verify", decision_id=first["id"], action="approve")

            # the first server decides on what the second learned, and so does the second: one state
            again = await call(one, "decide", category="billing", factors=case)
            also = await call(two, "decide", category="billing", factors=case)
            assert again["action"] == also["action"] == "escalate"
            assert again["probs"] == also["probs"] and again["confidence"] == also["confidence"]
            explained = await call(one, "explain", decision_id=again["id"])
            assert explained["action"] == "escalate"
            across = await call(one, "explain", decision_id=also["id"])  # decided by the other server
            assert {k: v for k, v in across.items() if k != "id"} == {k: v for k, v in explained.items() if k != "id"}

            lists = [await call(client, "memories") for client in (one, two)]
            assert lists[0] == lists[1]
            assert [(m["pending"], m["learned"]) for m in lists[0]["judgment"]] == [(2, 1)]

    asyncio.run(asyncio.wait_for(go(), LINE_TIMEOUT))
