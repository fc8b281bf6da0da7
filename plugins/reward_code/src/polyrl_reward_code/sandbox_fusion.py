"""A client of SandboxFusion's ``POST /run_code`` (github.com/bytedance/SandboxFusion): send one
program with its stdin, get back how it ran. The program runs on the service, never here.

Why the standard library (``urllib``) rather than ``requests``: one JSON POST per case needs
nothing more, and the plugin then adds no dependency to every reward worker.

What a request may cost, and what it may not:

- at most ``max_concurrent`` requests are in flight at once from one process (one semaphore per
  endpoint and bound, shared by every thread of the process, as verl shares one across its
  scoring calls);
- each request has a deadline: the program's compile and run time limits plus a margin for the
  network and the service's queue;
- a connection that cannot be made or is dropped, and an HTTP 5xx (the service or a gateway in
  front of it failing), are retried a bounded number of times with a growing pause; any other
  failure (a 4xx, a deadline passed, an answer that is not the API's JSON) is not: the same
  request would fail the same way, or would cost the deadline again;
- redirects are not followed and only ``http``/``https`` URLs are taken, so a request goes to
  the endpoint the config names and nowhere else; the answer is read as JSON with a size cap.

A request that fails raises :class:`SandboxFusionError` with one line saying why; the caller
decides what a failed case scores.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

ATTEMPTS = 3  # tries of one request on a connection failure or an HTTP 5xx
RETRY_PAUSE_S = 0.5  # pause before try n+1: n times this
DEADLINE_MARGIN_S = 10.0  # added to the program's time limits for the network and the queue
MAX_ANSWER_BYTES = 16 * 1024 * 1024  # a longer answer is refused, not read into memory
HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}

_slots: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_slots_lock = threading.Lock()


class SandboxFusionError(Exception):
    """A request that did not give the API's answer; the message says why, in one line."""


class _Retryable(SandboxFusionError):
    """A failure that another try may not meet (no connection, an HTTP 5xx)."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # urllib then raises the 3xx as an HTTPError


_OPENER = urllib.request.build_opener(_NoRedirect)


def url_problem(url: Any) -> str | None:
    """Why ``url`` cannot be a SandboxFusion endpoint (one line), or None when it can."""
    if not isinstance(url, str):
        return f"must be a string URL, got {type(url).__name__}"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host, e.g. http://localhost:8080/run_code"
    return None


def shown_url(url: str) -> str:
    """``url`` without its credentials and query (a gateway's token may sit there), for logs."""
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}{parts.path}"


def request_deadline_s(run_timeout_s: float) -> float:
    """How long one request may take: the program's compile and run limits, and the margin."""
    return 2 * run_timeout_s + DEADLINE_MARGIN_S


def run_code(
    url: str,
    code: str,
    stdin: str,
    *,
    run_timeout_s: float,
    memory_limit_mb: int,
    max_concurrent: int,
) -> dict[str, Any]:
    """Run the Python ``code`` with ``stdin`` on the service at ``url``; its answer, a dict
    with ``status`` (``Success``, ``Failed``, ``SandboxError``) and ``run_result`` /
    ``compile_result``. Raises :class:`SandboxFusionError` when no such answer came."""
    problem = url_problem(url)
    if problem:
        raise ValueError(f"reward_model.sandbox_fusion.url={url!r} {problem}")
    payload = {
        "code": code,
        "language": "python",
        "stdin": stdin,
        "compile_timeout": run_timeout_s,
        "run_timeout": run_timeout_s,
        "memory_limit_MB": memory_limit_mb,
        "files": {},
        "fetch_files": [],
    }
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers=HEADERS, method="POST"
    )
    deadline_s = request_deadline_s(run_timeout_s)
    failure = ""
    with _slot(url, max_concurrent):
        for attempt in range(ATTEMPTS):
            if attempt:
                time.sleep(RETRY_PAUSE_S * attempt)
            try:
                return _answer(_post(request, deadline_s))
            except _Retryable as exc:
                failure = str(exc)
    raise SandboxFusionError(f"{failure} ({ATTEMPTS} attempts)")


def _slot(url: str, bound: int) -> threading.BoundedSemaphore:
    with _slots_lock:
        return _slots.setdefault((url, bound), threading.BoundedSemaphore(max(1, bound)))


def _post(request: urllib.request.Request, deadline_s: float) -> bytes:
    try:
        with _OPENER.open(request, timeout=deadline_s) as response:
            return response.read(MAX_ANSWER_BYTES + 1)
    except urllib.error.HTTPError as exc:
        exc.close()
        failure = f"HTTP {exc.code} {exc.reason}"
        raise (_Retryable if exc.code >= 500 else SandboxFusionError)(failure) from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise SandboxFusionError(f"no connection within {deadline_s:g} s") from None
        raise _Retryable(f"cannot connect: {exc.reason}") from None
    except TimeoutError:
        raise SandboxFusionError(f"no answer within {deadline_s:g} s") from None
    except (ConnectionError, http.client.HTTPException) as exc:
        raise _Retryable(f"connection lost: {type(exc).__name__}: {exc}") from None


def _answer(raw: bytes) -> dict[str, Any]:
    if len(raw) > MAX_ANSWER_BYTES:
        raise SandboxFusionError(f"the answer is longer than {MAX_ANSWER_BYTES} bytes")
    try:
        answer = json.loads(raw)
    except ValueError:
        raise SandboxFusionError(f"the answer is not JSON: {raw[:80]!r}") from None
    if not isinstance(answer, dict) or not isinstance(answer.get("status"), str):
        raise SandboxFusionError(f"the answer is not run_code's (no 'status'): {raw[:80]!r}")
    return answer
