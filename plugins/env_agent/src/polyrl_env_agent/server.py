"""The loopback HTTP server behind the agent environment's ``/v1/chat/completions``.

It runs on its own thread and event loop for the whole run, because the multi-turn rollout opens
a fresh event loop for every batch: each request is handed to its episode's coroutine on the
rollout's loop (``run_coroutine_threadsafe``) and the answer comes back the same way. Episodes
are told apart by the path (``/episodes/<token>/v1/...``), so one port serves them all. It binds
127.0.0.1 only: whatever reaches it drives the policy, so nothing beyond this host may.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

LOOPBACK = "127.0.0.1"
Handler = Callable[[dict[str, Any]], Awaitable[tuple[int, dict[str, Any]]]]


class LoopbackServer:
    """Serves ``POST /episodes/<token>/v1/chat/completions`` for the registered episodes."""

    def __init__(self) -> None:
        self._routes: dict[str, tuple[asyncio.AbstractEventLoop, Handler]] = {}
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0
        self._thread = threading.Thread(target=self._serve, name="polyrl-agent-http", daemon=True)
        self._thread.start()
        self._ready.wait()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/episodes/{token}/v1/chat/completions", self._completions)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, LOOPBACK, 0)
        self._loop.run_until_complete(site.start())
        self.port = int(self._runner.addresses[0][1])
        self._ready.set()
        self._loop.run_forever()

    def base_url(self, token: str) -> str:
        return f"http://{LOOPBACK}:{self.port}/episodes/{token}/v1"

    def register(self, token: str, loop: asyncio.AbstractEventLoop, handler: Handler) -> None:
        self._routes[token] = (loop, handler)

    def unregister(self, token: str) -> None:
        self._routes.pop(token, None)

    async def _completions(self, request: web.Request) -> web.Response:
        route = self._routes.get(request.match_info["token"])
        if route is None:
            return _error(404, "no live episode at this address (it has ended)")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the request body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object")
        loop, handler = route
        try:
            future = asyncio.run_coroutine_threadsafe(handler(body), loop)
            status, payload = await asyncio.wrap_future(future)
        except (RuntimeError, asyncio.CancelledError):  # the episode's loop is gone or ended it
            return _error(409, "the episode ended while this request waited")
        return web.json_response(payload, status=status)

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def _error(status: int, message: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": "invalid_request_error"}}, status=status
    )
