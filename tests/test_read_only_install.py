"""gae installed read-only and run by a service user whose home is not writable (docs/deploy.md,
gae.kernel_cache): it imports, decides and learns, its compiled kernels cached in the folder the
rule names (GAE_CACHE_DIR, NUMBA_CACHE_DIR, the user's private temporary folder) or compiled in
memory when nothing is writable; and gae-mcp serves a Postgres store that way, as the Dockerfile's
image runs it.

Each case copies gae into a temporary folder, takes every write bit off it, and runs Python there
as user 65534 (``nobody``): the test process must be root to switch users, and skips otherwise.
That user runs the interpreter of this session where it can reach it, else the system's Python of
the same version (a venv made from a Python under /root, 0700, cannot be run by another user),
with the session's site-packages on ``PYTHONPATH``.

A fresh folder of kernels costs a JudgmentMemory about 25 s of compiling; the cases that decide
with one share a folder seeded with the working tree's own compiled kernels (what the image's
build step does for the image), so they load instead (numba checks each file against the source).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICE_USER = 65534  # nobody
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"  # the service user's PATH
TIMEOUT = 300.0  # seconds a run may take: a cold kernel folder compiles for about 30 s
# root turns into the service user, then becomes the command: os.execv keeps the environment given
AS_SERVICE_USER = [sys.executable, "-c", "import os, sys; os.setgroups([]); os.setgid(int(sys.argv[1])); "
                   "os.setuid(int(sys.argv[1])); os.execv(sys.argv[2], sys.argv[2:])", str(SERVICE_USER)]
needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                reason="running a process as another user (a service user) needs root")

# decides and learns with a JudgmentMemory and a k-NN memory, each on a SQLite ledger in argv[1];
# prints the actions and where two kernels are cached (None: in memory)
DECIDE = """
import json, sys
from gae import Decider, JudgmentMemory, KNNMemory
from gae.storage import SQLiteStore
memories = {"knn": KNNMemory(factors=3, actions=["approve", "escalate"], categories=["billing"], k=1)}
if sys.argv[2] == "both":
    memories["judgment"] = JudgmentMemory(["billing"], ["approve", "escalate"], 3)
actions = {}
for name, memory in memories.items():
    decider = Decider(memory, store=SQLiteStore(f"{sys.argv[1]}/{name}.db"))
    for _ in range(2):
        decision = decider.decide([0.9, 0.1, 0.4], "billing")
        decider.verify(decision.id, "escalate")
    actions[name] = decider.decide([0.9, 0.1, 0.4], "billing").action
from gae.models import knn_kernels
from gae.judgment.kernels import scoring
where = {name: getattr(kernel._cache, "cache_path", None) for name, kernel in
         (("knn", knn_kernels.knn_one), ("judgment", scoring.score_one_at))}
import gae
print(json.dumps({"actions": actions, "cached_in": where, "gae": gae.__file__}))
"""


@dataclass
class Install:
    """A read-only copy of gae and the folders its service user gets."""

    root: Path  # the temporary folder holding the rest (removed after the module)
    site: Path  # holds gae/, read-only
    home: Path  # the user's HOME: read-only
    kernels: Path  # the user's TMPDIR, its own: gae-kernels-65534 is made in it
    python: str  # an interpreter the user can run

    def folder(self, name: str, owner: int = SERVICE_USER) -> Path:
        path = self.root / name
        path.mkdir()
        os.chown(path, owner, owner)
        return path

    def env(self, **extra: str) -> dict[str, str]:
        """No NUMBA_* or GAE_* variable unless ``extra`` gives one."""
        paths = dict.fromkeys([str(self.site), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
        return {"PATH": SYSTEM_PATH, "HOME": str(self.home), "TMPDIR": str(self.kernels),
                "PYTHONPATH": os.pathsep.join(paths), **extra}

    def run(self, code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*AS_SERVICE_USER, self.python, "-c", code, *args], env=env or self.env(), text=True,
                              capture_output=True, timeout=TIMEOUT, cwd=self.home)


def read_only_copy(site: Path) -> None:
    """gae's sources copied into ``site``, then no write bit anywhere (files 0444, folders 0555)."""
    shutil.copytree(ROOT / "gae", site / "gae", ignore=shutil.ignore_patterns("__pycache__"))
    for path in [site, *site.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)


def seed_kernels(site: Path, folder: Path) -> None:
    """The working tree's compiled kernels copied where the rule finds them for the copy in
    ``site`` (numba's subfolder per source folder), owned by the service user."""
    from gae.kernel_cache import FolderLocator

    folder.mkdir(mode=0o700)  # private, or the rule passes it over
    for cache in (ROOT / "gae").rglob("__pycache__"):
        compiled = [*cache.glob("*.nbi"), *cache.glob("*.nbc")]
        if compiled:
            source = site / "gae" / cache.parent.relative_to(ROOT / "gae") / "any.py"
            target = folder / FolderLocator.get_suitable_cache_subpath(str(source))
            target.mkdir(parents=True, exist_ok=True)
            for path in compiled:
                shutil.copy2(path, target)
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, SERVICE_USER, SERVICE_USER)


def interpreter(env: dict[str, str]) -> str | None:
    """This session's interpreter if the service user can run it with torch and numba, else the
    system's Python of the same version; None when neither can."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    folders = [*os.environ.get("PATH", "").split(os.pathsep), *SYSTEM_PATH.split(os.pathsep)]
    found = [os.path.join(folder, f"python{version}") for folder in folders if folder]
    for candidate in dict.fromkeys([sys.executable, *filter(os.path.isfile, found)]):
        probe = subprocess.run([*AS_SERVICE_USER, candidate, "-c", "import sys, torch, numba; "
                                "print('%d.%d' % sys.version_info[:2])"], env=env, capture_output=True, text=True,
                               timeout=TIMEOUT, cwd="/")
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    return None


@pytest.fixture(scope="module")
def install() -> Iterator[Install]:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("running a process as another user (a service user) needs root")
    root = Path(tempfile.mkdtemp(prefix="gae-read-only-"))  # (not pytest's tmp_path: 0700, closed to the user)
    try:
        root.chmod(0o755)
        site, home = root / "site", root / "home"
        site.mkdir()
        read_only_copy(site)
        home.mkdir(mode=0o555)
        built = Install(root, site, home, root / "kernels", "")
        built.kernels.mkdir(mode=0o700)
        seed_kernels(site, built.kernels / f"gae-kernels-{SERVICE_USER}")
        os.chown(built.kernels, SERVICE_USER, SERVICE_USER)
        python = interpreter(built.env())
        if python is None:
            pytest.skip(f"user {SERVICE_USER} can run no Python {sys.version_info[0]}.{sys.version_info[1]} "
                        f"that imports torch and numba from {sysconfig.get_paths()['purelib']}")
        built.python = python
        yield built
    finally:
        shutil.rmtree(root)


def decided(done: subprocess.CompletedProcess[str], install: Install) -> dict:
    """The answer of :data:`DECIDE`, which ran on the read-only copy."""
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.splitlines()[-1])
    assert Path(answer["gae"]).is_relative_to(install.site), answer["gae"]
    return answer


def files_in(folder: Path) -> list[Path]:
    return [path for path in folder.rglob("*") if path.is_file()]


@needs_root
def test_a_service_user_decides_and_learns_from_a_read_only_install(install):
    """HOME not writable, no NUMBA_CACHE_DIR, the install read-only: the kernels are cached in
    the user's own folder of the temporary folder, and nothing is written anywhere else."""
    work = install.folder("work")
    answer = decided(install.run(DECIDE, str(work), "both"), install)
    assert answer["actions"] == {"knn": "escalate", "judgment": "escalate"}
    private = install.kernels / f"gae-kernels-{SERVICE_USER}"
    assert all(Path(path).parent == private for path in answer["cached_in"].values()), answer["cached_in"]
    assert oct(private.stat().st_mode & 0o777) == "0o700"
    assert any(path.suffix == ".nbi" for path in files_in(private))
    assert files_in(install.home) == [] and not list(install.site.rglob("__pycache__"))


@needs_root
@pytest.mark.parametrize("variable", ["GAE_CACHE_DIR", "NUMBA_CACHE_DIR"])
def test_a_cache_folder_set_by_a_variable_holds_the_kernels(install, variable):
    """GAE_CACHE_DIR (gae's kernels alone) or NUMBA_CACHE_DIR (numba's own): the kernels compile
    into that folder, and the temporary folder gets none."""
    configured, temporary = install.folder(f"configured-{variable}"), install.folder(f"tmp-{variable}")
    work = install.folder(f"work-{variable}")
    answer = decided(install.run(DECIDE, str(work), "knn",
                                 env=install.env(TMPDIR=str(temporary), **{variable: str(configured)})), install)
    assert answer["actions"] == {"knn": "escalate"}
    assert Path(answer["cached_in"]["knn"]).parent == configured
    assert {path.name.split("-")[0] for path in files_in(configured)} >= {"knn_kernels.knn_one"}
    assert files_in(temporary) == []


@needs_root
def test_an_unwritable_gae_cache_dir_is_passed_over_with_a_warning(install):
    temporary, work = install.folder("tmp-unwritable"), install.folder("work-unwritable")
    done = install.run(DECIDE, str(work), "knn", env=install.env(TMPDIR=str(temporary), GAE_CACHE_DIR="/proc/gae"))
    answer = decided(done, install)
    assert answer["actions"] == {"knn": "escalate"}
    assert "GAE_CACHE_DIR='/proc/gae' is not a folder gae can write to" in done.stderr
    private = temporary / f"gae-kernels-{SERVICE_USER}"  # made by the rule this time, and compiled into
    assert Path(answer["cached_in"]["knn"]).parent == private and oct(private.stat().st_mode & 0o777) == "0o700"
    assert any(path.name.startswith("knn_kernels.knn_one") for path in files_in(private))


@needs_root
def test_with_no_writable_folder_the_kernels_compile_in_memory_with_a_warning(install):
    """No temporary folder either (Python's own ``tempfile.tempdir`` set to the read-only home,
    as on a host whose /tmp is read-only): numba's in-memory cache, the same answers, a warning
    that says what it costs, and no file written."""
    work = install.folder("work-in-memory")
    code = f"import tempfile; tempfile.tempdir = {str(install.home)!r}\n{DECIDE}"
    done = install.run(code, str(work), "knn", env=install.env(TMPDIR=str(install.home)))
    answer = decided(done, install)
    assert answer["actions"] == {"knn": "escalate"} and answer["cached_in"]["knn"] is None
    assert "they compile in memory, again in each process" in done.stderr
    assert files_in(install.home) == [] and all(path.name.startswith("knn.db") for path in files_in(work))


def test_a_writable_install_caches_its_kernels_in_tree_as_numba_does(monkeypatch):
    """The rule leaves a writable install as it was: each kernel's cache is the __pycache__
    beside its source (unless NUMBA_CACHE_DIR or GAE_CACHE_DIR names another)."""
    if os.environ.get("NUMBA_CACHE_DIR") or os.environ.get("GAE_CACHE_DIR"):
        pytest.skip("a cache folder variable is set in this session")
    if not os.access(ROOT / "gae" / "models", os.W_OK):
        pytest.skip("this working tree is not writable")
    from gae.models import knn_kernels

    assert knn_kernels.knn_one._cache.cache_path == str(Path(knn_kernels.__file__).parent / "__pycache__")


@needs_root
def test_a_temporary_folder_another_user_made_or_opened_is_not_used(tmp_path, monkeypatch):
    """numba's cache files are pickles: a kernel folder in a shared /tmp is used only when it
    is this user's own and closed to others (mode 0700)."""
    from gae.kernel_cache import private_temp_folder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = private_temp_folder()
    assert folder == str(tmp_path / f"gae-kernels-{os.getuid()}")
    assert oct(Path(folder).stat().st_mode & 0o777) == "0o700"
    os.chown(folder, SERVICE_USER, SERVICE_USER)
    assert private_temp_folder() is None  # another user's
    os.chown(folder, os.getuid(), os.getgid())
    Path(folder).chmod(0o777)
    assert private_temp_folder() is None  # open to others
    Path(folder).chmod(0o700)
    assert private_temp_folder() == folder


def test_every_cached_kernel_is_a_module_of_gae():
    """The rule reaches the kernels of modules named ``gae.*``: every ``cache=True`` is in gae/."""
    cached = [path for path in (ROOT / "gae").rglob("*.py") if re.search(r"njit\([^)]*cache=True", path.read_text())]
    assert cached and all(path.is_relative_to(ROOT / "gae") for path in cached)


# gae-mcp on Postgres, run as the image runs it

@pytest.fixture
def relay(dsn: str) -> Iterator[str]:
    """``dsn`` reached through TCP on 127.0.0.1: pgserver listens only on a unix socket in its
    data folder, which is closed to other users (Postgres wants it 0700), so the service user
    connects to a relay that root runs to the socket, as a container reaches Postgres over TCP."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(dsn)
    path = f"{params['host']}/.s.PGSQL.{params.get('port') or 5432}"
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def pipe(source: socket.socket, sink: socket.socket) -> None:
        with source, sink:
            try:
                while data := source.recv(65536):
                    sink.sendall(data)
                sink.shutdown(socket.SHUT_WR)  # the end of one direction, passed on
            except OSError:
                pass

    def serve() -> None:
        while not done.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX)
            server.connect(path)
            threading.Thread(target=pipe, args=(client, server), daemon=True).start()
            threading.Thread(target=pipe, args=(server.dup(), client.dup()), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield make_conninfo(dsn, host="127.0.0.1", port=str(listener.getsockname()[1]))
    finally:
        done.set()
        listener.close()


@needs_root
def test_gae_mcp_serves_postgres_as_a_service_user_from_a_read_only_install(install, relay):
    """The image's command (``gae-mcp --dsn``) without Docker: user 65534, HOME not writable, gae
    read-only, the store on Postgres; every tool listed, and decide, verify, explain, remember,
    recall and memories answer (forget erases, which pgserver's settings refuse: tests/test_store_postgres.py)."""
    pytest.importorskip("mcp")
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    server = StdioServerParameters(command=AS_SERVICE_USER[0],
                                   args=[*AS_SERVICE_USER[1:], install.python, "-m", "gae.mcp", "--dsn", relay,
                                         "--embedder", "hashing"],
                                   env=install.env(), cwd=str(install.home))

    async def call(client: Client, tool: str, **arguments):
        result = await client.call_tool(tool, arguments)
        assert not result.is_error, result.content[0].text
        return result.structured_content

    async def go():
        async with Client(server) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert names == {"decide", "verify", "explain", "remember", "recall", "forget", "memories"}
            first = await call(client, "decide", category="billing", factors={"amount": 0.2, "risk": 0.9},
                               actions=["approve", "escalate"])
            assert first["refer"] and first["reasons"][0] == "unseen_category"
            assert (await call(client, "verify", decision_id=first["id"], action="escalate"))["learned"]
            second = await call(client, "decide", category="billing", factors={"amount": 0.2, "risk": 0.8})
            assert second["action"] == "escalate"
            assert (await call(client, "explain", decision_id=second["id"]))["action"] == "escalate"
            kept = (await call(client, "remember", text="the refund was approved", scope="support"))["id"]
            found = (await call(client, "recall", query="refund approved", scopes=["support"]))["memories"]
            assert found[0]["id"] == kept
            listed = await call(client, "memories")
            assert [(m["factors"], m["pending"], m["learned"]) for m in listed["judgment"]] == [
                (["amount", "risk"], 1, 1)]

    asyncio.run(asyncio.wait_for(go(), TIMEOUT))
    import psycopg

    with psycopg.connect(relay) as connection:  # the ledger is in Postgres, not in a file somewhere
        tables = connection.execute("SELECT tablename FROM pg_tables "
                                    "WHERE schemaname NOT IN ('pg_catalog', 'information_schema')").fetchall()
    assert tables, "gae-mcp wrote no table to the Postgres store"


# the Dockerfile, read (Docker is not needed)

def dockerfile_instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of each instruction of the Dockerfile, continued lines joined
    (a heredoc's body is skipped)."""
    instructions, lines = [], iter((ROOT / "Dockerfile").read_text().splitlines())
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.endswith("\\"):
            line = line[:-1] + " " + next(lines).strip()
        keyword, _, arguments = line.strip().partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
        heredoc = re.search(r"<<-?'?(\w+)'?", arguments)
        if heredoc:
            for body in lines:
                if body.strip() == heredoc.group(1):
                    break
    return instructions


def test_the_dockerfile_runs_gae_mcp_with_a_dsn_as_a_non_root_user_from_a_read_only_install():
    instructions = dockerfile_instructions()
    users = [arguments for keyword, arguments in instructions if keyword == "USER"]
    assert users, "the Dockerfile sets no USER: the image would run as root"
    last_user = users[-1].split(":")[0]
    assert last_user not in ("root", "0"), f"the image runs as {users[-1]!r}"
    entry = [json.loads(arguments) for keyword, arguments in instructions if keyword == "ENTRYPOINT"]
    assert entry, "the Dockerfile has no ENTRYPOINT"
    command = " ".join(entry[-1])
    assert re.search(r"\bgae-mcp --dsn \S*GAE_DSN", command), f"the ENTRYPOINT is not gae-mcp --dsn $GAE_DSN: {command}"
    assert "--http" in command and "GAE_HTTP_PORT" in command
    run = " ".join(arguments for keyword, arguments in instructions if keyword == "RUN")
    assert "chmod -R a-w" in run, "the install is not made read-only"
    assert "download.pytorch.org/whl/cpu" in " ".join(arguments for _, arguments in instructions), "not CPU torch"
    env = " ".join(arguments for keyword, arguments in instructions if keyword == "ENV")
    assert "GAE_CACHE_DIR=" in env
