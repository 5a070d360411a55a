"""Serve any treegym env with OpenEnv's server (openenv 0.10; openenv-core 0.3 too), plus fork, snapshot and restore.

OpenEnv's own routes speak its protocol unchanged: the WebSocket ``/ws`` (``reset``, ``step``,
``state`` messages; one session per connection), and its stateless HTTP ``POST /reset``,
``POST /step``, ``GET /state``, ``/schema``, ``/metadata``, ``/health``. Observations are typed
(``TreegymObservation``: the text, the reward, done, terminated/truncated, the env's info, and
the episode id). Episodes live in a bounded ``EpisodeStore`` under ids, so extension routes
can address them: ``POST /fork``, ``POST /snapshot``, ``POST /restore``, ``GET /tasks``,
``GET /episodes``, ``DELETE /episodes/ID``. A fork is a new episode id that starts in its
parent's state; a session drives it with ``reset(attach=ID, session=TOKEN)``. Ids are the
server's, and unguessable; an episode, its forks and its snapshots belong to the session that
made them (``episodes.py``), and a route that names one must say which session calls: the
session's secret token (its ``state``'s ``session_token``) in the ``X-Treegym-Session``
header. Labels never go on the wire (``treegym.envs.public_info``). MCP is off unless asked
for; request bodies are capped (413); a WebSocket client past ``--max-episodes`` gets the
capacity error, with its limit and a retry hint, and a 1013 close. Needs
``pip install 'treegym[openenv]'``.
"""

from __future__ import annotations

import functools
import os
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from treegym.envs import make
from treegym.errors import ConfigError, MissingPackageError, TreegymError
from treegym.hosts import is_loopback
from treegym.integrations.episodes import (
    EpisodeNotFoundError,
    EpisodeStore,
    Observed,
    SessionLimitError,
    jsonable,
)
from treegym.integrations.wire import CLOSE_TRY_AGAIN_LATER, CapacityReply, WireLimits

try:
    import httpx
    import uvicorn
    from fastapi import Depends, FastAPI, Header, HTTPException, Request, WebSocketDisconnect
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from openenv.core.client_types import StepResult
    from openenv.core.env_client import EnvClient
    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.serialization import serialize_observation
    from openenv.core.env_server.types import (
        Action,
        ConcurrencyConfig,
        EnvironmentMetadata,
        Observation,
        State,
    )
    from pydantic import BaseModel, Field
    from websockets.exceptions import ConnectionClosed
except ImportError:
    raise MissingPackageError("openenv", "treegym's OpenEnv server",
                              "pip install 'treegym[openenv]'") from None

SESSION_HEADER = "X-Treegym-Session"  # the caller's session token, on every route that names an episode
MAX_BODY_BYTES = 4 << 20  # an action of max_action_chars (1 Mi characters) fits, in any UTF-8


# ---- the typed messages -----------------------------------------------------------------------


class TreegymAction(Action):
    """One agent turn: the model's whole text (e.g. ``<search>q</search>``)."""

    text: str = Field(description="the agent's whole turn")


class TreegymObservation(Observation):
    """What the env appended after a turn (or the opening prompt after a reset).

    ``done`` is ``terminated or truncated``; ``info`` is the env's info dict (the terminal
    step's holds ``success``, QA envs also ``em``), made JSON-safe, without the task's labels
    (gold answers, supporting ids: ``treegym.envs.public_info``).
    """

    text: str = Field(description="the observation text")
    info: dict[str, Any] = Field(default_factory=dict, description="the env's info dict")
    episode_id: str = Field(description="the episode this observation belongs to")
    terminated: bool = False
    truncated: bool = False

    @classmethod
    def of(cls, last: Observed, episode_id: str) -> TreegymObservation:
        return cls(text=last.text, reward=last.reward, done=last.done, info=last.info, episode_id=episode_id,
                   terminated=last.terminated, truncated=last.truncated)


class TreegymState(State):
    """The session's episode: its id and step count, plus the env id, task and parent."""

    env_id: str = ""
    session_token: str = Field(default="", description=f"this session's secret: send it as {SESSION_HEADER} "
                               "to fork, snapshot, restore or delete its episodes, or as reset(session=...) "
                               "to drive one of its forks from another connection")
    task_id: str | None = None
    parent_id: str | None = Field(default=None, description="the episode this one was forked from")
    done: bool = False


# ---- the OpenEnv environment: one per session ---------------------------------------------------


class TreegymEnvironment(Environment[TreegymAction, TreegymObservation, TreegymState]):
    """A session's handle on one episode of the store. OpenEnv makes one per WebSocket
    connection (and one per stateless HTTP call); the episode it drives dies with it."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # every session drives its own fork of the template

    def __init__(self, store: EpisodeStore) -> None:
        super().__init__()
        self.store = store
        self.episode_id: str | None = None
        self.token = store.open_session(self)

    def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: str | None = None,
              attach: str | None = None, session: str | None = None, options: dict[str, Any] | None = None,
              **kwargs: Any) -> TreegymObservation:
        """Start a new episode (``seed``, ``task_id``), or ``attach`` to a live one (a fork) and
        carry on from its state; a fork of another connection's session needs that session's
        token as ``session``. The server picks the episode id (unguessable), so an
        ``episode_id`` of the client's choice is refused. ``options`` is gymnasium's
        ``reset(options=...)``, passed to the env (``{"task_id": ...}`` is the same as ``task_id``)."""
        if kwargs:
            raise ConfigError(f"reset: unknown options {sorted(kwargs)}; it takes seed, task_id, attach, session, "
                              "options")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError(f"reset: seed must be an integer, got {seed!r}")
        if episode_id is not None:
            raise ConfigError("reset: the server picks episode ids (unguessable, so that no other client can "
                              "drive this episode); reset without episode_id and read it from the observation")
        if options is not None and not isinstance(options, dict):
            raise ConfigError(f"reset: options must be a JSON object, got {type(options).__name__}")
        if attach is not None:
            caller = self if session is None else self.store.session(str(session))
            ep = self.store.attach(str(attach), owner=self, caller=caller)
            self._leave(keep=str(attach))
            self.episode_id = str(attach)
            return TreegymObservation.of(ep.last, self.episode_id)
        self._leave()
        self.episode_id = self.store.create(self, seed=seed, task_id=None if task_id is None else str(task_id),
                                            options=options)
        return TreegymObservation.of(self.store.get(self.episode_id).last, self.episode_id)

    def step(self, action: TreegymAction, timeout_s: float | None = None, **kwargs: Any) -> TreegymObservation:
        if self.episode_id is None:
            raise ConfigError("step() before reset(): call reset() (or reset(attach=ID) to drive a fork)")
        return TreegymObservation.of(self.store.step(self.episode_id, action.text, self), self.episode_id)

    @property
    def state(self) -> TreegymState:
        if self.episode_id is None:
            return TreegymState(env_id=self.store.env_id, session_token=self.token)
        ep = self.store.get(self.episode_id, self)
        return TreegymState(episode_id=self.episode_id, step_count=ep.steps, env_id=self.store.env_id,
                            session_token=self.token, task_id=ep.task_id, parent_id=ep.parent_id,
                            done=ep.last.done)

    def get_metadata(self) -> EnvironmentMetadata:
        doc = (type(self.store.template.unwrapped).__doc__ or "").strip().splitlines()
        return EnvironmentMetadata(name=self.store.env_id, description=doc[0] if doc else self.store.env_id)

    def close(self) -> None:
        self._leave()
        self.store.end_session(self)  # its forks and snapshots are freed with it

    def _leave(self, keep: str | None = None) -> None:
        if self.episode_id is not None and self.episode_id != keep:
            self.store.release(self.episode_id, owner=self)
        self.episode_id = None


# ---- the app: OpenEnv's routes plus the extensions ----------------------------------------------


class EpisodeRequest(BaseModel):
    episode_id: str = Field(max_length=255)


class RestoreRequest(EpisodeRequest):
    snapshot_id: str = Field(max_length=255)


class QuietSessionEnd:
    """ASGI middleware: a WebSocket session whose client has already gone ends quietly.

    openenv-core 0.3's ``/ws`` handler closes the socket in a ``finally`` and catches only
    RuntimeError; Starlette 1.x raises WebSocketDisconnect there, so without this every
    session that ends with the client's ``close`` message logs a traceback.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            if scope.get("type") != "websocket":
                raise


def make_app(store: EpisodeStore, *, mcp: bool = False, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """OpenEnv's FastAPI app over ``store``, with the fork/snapshot/restore extensions; its
    MCP routes only with ``mcp``; request bodies and WebSocket messages up to ``max_body_bytes``."""
    factory = functools.partial(TreegymEnvironment, store)
    app = create_fastapi_app(factory, TreegymAction, TreegymObservation, concurrency_config=ConcurrencyConfig(
        max_concurrent_envs=store.max_episodes, session_timeout=store.idle_timeout_s))
    if not mcp:  # a treegym env has no MCP tools, and each MCP session would take a session slot
        app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) != "/mcp"]
    app.add_middleware(QuietSessionEnd)
    app.add_middleware(CapacityReply, retry_after_s=min(5.0, store.idle_timeout_s),
                       idle_timeout_s=store.idle_timeout_s)
    app.add_middleware(WireLimits, max_body_bytes=max_body_bytes, mcp=mcp)
    app.state.max_body_bytes = max_body_bytes  # the WebSocket frame limit, for EnvServer

    @app.exception_handler(TreegymError)
    async def _treegym_error(request: Request, exc: TreegymError) -> JSONResponse:
        code = 404 if isinstance(exc, EpisodeNotFoundError) else 503 if isinstance(exc, SessionLimitError) else 400
        return JSONResponse({"detail": str(exc)}, status_code=code)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own handler echoes the input, and a NaN in it is not JSON: a 500 instead of a 422.
        return JSONResponse({"detail": jsonable(exc.errors())}, status_code=422)

    def caller(token: str | None = Header(default=None, alias=SESSION_HEADER, max_length=255)) -> object | None:
        if token is None:
            raise HTTPException(401, f"name the calling session: send its session_token (from its state) in the "
                                     f"{SESSION_HEADER} header")  # fmt: skip
        return store.session(token)  # an unknown token calls as nobody: every episode is "not found"

    @app.post("/fork", tags=["treegym"], summary="Fork an episode: a new episode id in the same state")
    def fork_episode(request: EpisodeRequest, session: object | None = Depends(caller)) -> dict[str, Any]:
        child = store.fork(request.episode_id, session)
        obs = TreegymObservation.of(store.get(child).last, child)
        return {"episode_id": child, "parent_id": request.episode_id, **serialize_observation(obs)}

    @app.post("/snapshot", tags=["treegym"], summary="Save an episode's state under a snapshot id")
    def snapshot_episode(request: EpisodeRequest, session: object | None = Depends(caller)) -> dict[str, Any]:
        return {"snapshot_id": store.snapshot(request.episode_id, session), "episode_id": request.episode_id}

    @app.post("/restore", tags=["treegym"], summary="Put an episode back into a snapshot's state")
    def restore_episode(request: RestoreRequest, session: object | None = Depends(caller)) -> dict[str, Any]:
        last = store.restore(request.episode_id, request.snapshot_id, session)
        obs = TreegymObservation.of(last, request.episode_id)
        return {"episode_id": request.episode_id, "snapshot_id": request.snapshot_id, **serialize_observation(obs)}

    @app.get("/tasks", tags=["treegym"], summary="The env's task ids (each a valid reset task_id), or null")
    def tasks() -> dict[str, Any]:
        ids = store.template.unwrapped.task_ids()
        return {"env_id": store.env_id, "task_ids": None if ids is None else [str(t) for t in ids]}

    @app.get("/episodes", tags=["treegym"], summary="How many episodes and snapshots are live, and the limits")
    def episodes() -> dict[str, Any]:
        live, snaps = store.counts()
        return {"live_episodes": live, "max_episodes": store.max_episodes, "max_forks": store.max_forks,
                "snapshots": snaps, "max_snapshots": store.max_snapshots,
                "max_session_snapshots": store.max_session_snapshots, "idle_timeout_s": store.idle_timeout_s}

    @app.delete("/episodes/{episode_id}", tags=["treegym"], summary="Free an episode (a fork no longer needed)")
    def delete_episode(episode_id: str, session: object | None = Depends(caller)) -> dict[str, Any]:
        store.delete(episode_id, session)
        return {"deleted": episode_id}

    return app


def tcp_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket made with ``proto=IPPROTO_TCP``, not ``socket.create_server``'s 0.

    asyncio sets TCP_NODELAY on an accepted socket only when its ``proto`` says TCP; with 0,
    every small answer waits for the client's delayed ACK (about 40 ms on Linux loopback).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        if os.name == "posix":  # as socket.create_server: rebind a port in TIME_WAIT at once
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(256)
    except BaseException:
        sock.close()
        raise
    return sock


class EnvServer:
    """A socket bound to ``host:port`` at once (so a taken port is an error here, before any
    env is built), then uvicorn serving ``app`` on it."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, app: FastAPI | None = None) -> None:
        if not 0 <= port <= 65535:
            raise ConfigError(f"--port must be in 0..65535 (0 picks a free one), got {port}")
        try:
            self.socket = tcp_listener(host, port)
        except (OSError, UnicodeError, TypeError, ValueError) as exc:  # a host that cannot even be encoded, too
            raise ConfigError(f"cannot bind {host[:60]}:{port} ({getattr(exc, 'strerror', None) or exc}); pick "
                              "another --port or --host") from None
        self.host, self.port = host, self.socket.getsockname()[1]
        self.app = app
        self.server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def serve_forever(self) -> None:
        """Serve until interrupted (Ctrl-C) or ``stop()``."""
        if self.app is None:
            raise TreegymError("EnvServer has no app to serve")
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="on",
                                                    ws_max_size=getattr(self.app.state, "max_body_bytes", MAX_BODY_BYTES)))
        try:
            self.server.run(sockets=[self.socket])
        finally:
            self.socket.close()

    def start(self, timeout_s: float = 30.0) -> EnvServer:
        """Serve from a background thread; returns once the server accepts connections."""
        self._thread = threading.Thread(target=self.serve_forever, name="treegym-openenv", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while self.server is None or not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise TreegymError(f"the OpenEnv server at {self.url} did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.socket.close()


# ---- the client: OpenEnv's EnvClient, typed, plus the extensions -------------------------------


class TreegymEnvClient(EnvClient[TreegymAction, TreegymObservation, TreegymState]):
    """OpenEnv's WebSocket client for a ``treegym serve-env`` server, with ``fork``, ``snapshot``
    and ``restore`` (over HTTP). ``.sync()`` gives the blocking version of every method."""

    def __init__(self, base_url: str, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        url = base_url.rstrip("/")
        for ws, http in (("ws://", "http://"), ("wss://", "https://")):
            if url.startswith(ws):
                url = http + url[len(ws):]
        self.http_url = url if "://" in url else "http://" + url

    def _step_payload(self, action: TreegymAction | str) -> dict[str, Any]:
        return (TreegymAction(text=action) if isinstance(action, str) else action).model_dump()

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[TreegymObservation]:
        obs = TreegymObservation(**payload.get("observation", {}), reward=payload.get("reward"),
                                 done=payload.get("done", False))
        return StepResult(observation=obs, reward=obs.reward, done=obs.done)

    def _parse_state(self, payload: dict[str, Any]) -> TreegymState:
        return TreegymState(**payload)

    async def fork(self) -> str:
        """Fork this session's episode; returns the new episode's id (drive it with
        ``reset(attach=id, session=this.session_token())`` from another client)."""
        return (await self._post("/fork", {"episode_id": await self._episode_id()}))["episode_id"]

    async def snapshot(self) -> str:
        """Save this session's episode; returns a snapshot id for ``restore``."""
        return (await self._post("/snapshot", {"episode_id": await self._episode_id()}))["snapshot_id"]

    async def restore(self, snapshot_id: str) -> StepResult[TreegymObservation]:
        """Put this session's episode back into the state saved as ``snapshot_id``."""
        body = await self._post("/restore", {"episode_id": await self._episode_id(), "snapshot_id": snapshot_id})
        return self._parse_result(body)

    async def session_token(self) -> str:
        """This session's secret: what another client passes as ``reset(attach=ID, session=...)``
        to drive one of its forks. Share it only with clients that may act for this session."""
        return (await self.state()).session_token

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            return await super()._send_and_receive(message)
        except ConnectionClosed as exc:  # a server at capacity says why in its close frame
            if exc.rcvd is not None and exc.rcvd.code == CLOSE_TRY_AGAIN_LATER:
                raise TreegymError(exc.rcvd.reason) from None
            raise

    async def _episode_id(self) -> str:
        episode_id = (await self.state()).episode_id
        if episode_id is None:
            raise TreegymError("this session has no episode yet: call reset() first")
        return episode_id

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        loopback = is_loopback(urlsplit(self.http_url).hostname or "")  # no proxy between us and a local server
        headers = {SESSION_HEADER: await self.session_token()}
        async with httpx.AsyncClient(base_url=self.http_url, trust_env=not loopback, timeout=60.0) as http:
            response = await http.post(path, json=body, headers=headers)
        if response.status_code != 200:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise TreegymError(f"{path}: {detail}")
        return response.json()


def serve(env_id: str, env_kwargs: dict[str, Any] | None = None, *, split: str | None = None,
          host: str = "127.0.0.1", port: int = 8002, max_episodes: int = 64, max_forks: int = 16,
          max_snapshots: int = 1024, max_session_snapshots: int = 128, idle_timeout_s: float = 600.0,
          mcp: bool = False, max_body_bytes: int = MAX_BODY_BYTES) -> EnvServer:
    """Bind ``host:port``, make ``env_id`` (``treegym.envs.make``) and set up its OpenEnv app; then
    call the returned server's ``serve_forever()`` (or ``start()`` for a background thread)."""
    if (max_episodes < 1 or max_snapshots < 1 or max_session_snapshots < 1 or max_forks < 0
            or not idle_timeout_s > 0 or max_body_bytes < 1024):
        raise ConfigError("--max-episodes, --max-snapshots and --max-session-snapshots must be at least 1, "
                          "--max-forks at least 0, --idle-timeout above 0, "
                          "--max-body-bytes at least 1024")
    server = EnvServer(host, port)  # a taken port fails before a big env is built
    try:
        template = make(env_id, split, **(env_kwargs or {}))
        store = EpisodeStore(template, env_id, max_episodes=max_episodes, max_forks=max_forks,
                             max_snapshots=max_snapshots, max_session_snapshots=max_session_snapshots,
                             idle_timeout_s=idle_timeout_s)
    except BaseException:
        server.socket.close()
        raise
    server.app = make_app(store, mcp=mcp, max_body_bytes=max_body_bytes)
    return server
