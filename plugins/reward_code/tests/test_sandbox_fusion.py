"""verl's SandboxFusion route: verl's code rows scored over HTTP against a local server that
speaks SandboxFusion's documented ``POST /run_code`` contract and really runs each program in
polyrl's own sandbox, so passing and failing programs, a timeout and a memory limit are real;
so are an HTTP 500, a redirect, a 400, an answer that is not JSON and a refused connection.
(No SandboxFusion deployment is reachable here: this is the documented API, not the service.)"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from polyrl.api import (
    ConfigError,
    RewardContext,
    RewardSample,
    SandboxLimits,
    load_config,
    run_program,
)
from polyrl.api.testing import schema_config
from polyrl.config.validate import validate_config
from polyrl.rewards.provider import NaiveRewardProvider
from polyrl_reward_code.checks import check_sandbox_fusion
from polyrl_reward_code.fusion_scorer import fusion_score, load_fusion_cases, score, verdict
from polyrl_reward_code.settings import SandboxFusionSettings

ADD = {"inputs": ["1 2\n", "3 4\n", "10 -2\n"], "outputs": ["3\n", "7", "8\n"]}
CORRECT = "Sure:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```\n"
PARTIAL = "```python\na, b = map(int, input().split())\nprint(a + b if a < 5 else 0)\n```"
SLEEPY = "```python\nimport time\ntime.sleep(0.4)\nprint(sum(map(int, input().split())))\n```"


class SandboxFusionLike(BaseHTTPRequestHandler):
    """``POST /run_code`` as SandboxFusion documents it, the program run by polyrl's sandbox;
    other paths fail the ways a service or a gateway fails."""

    server: FusionServer

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.hits[self.path] += 1
            self.server.requests.append(body)
            self.server.in_flight += 1
            self.server.most_in_flight = max(self.server.most_in_flight, self.server.in_flight)
        if self.path == "/run_code":
            try:
                answer = json.dumps(run_like_sandbox_fusion(body)).encode()
            finally:
                # counted out before the answer is sent: once the client has read it, it may
                # start its next request before this thread would get past the send
                self._leave()
            self._send(200, answer)
            return
        try:
            if self.path == "/broken":
                self._send(500, b"internal error")
            elif self.path == "/bad":
                self._send(400, b'{"detail": "bad request"}')
            elif self.path == "/not-json":
                self._send(200, b"<html>gateway page</html>")
            elif self.path == "/moved":
                self.send_response(302)
                self.send_header("Location", "/run_code")
                self.send_header("Content-Length", "0")
                self.end_headers()
        finally:
            self._leave()

    def _leave(self) -> None:
        with self.server.lock:
            self.server.in_flight -= 1

    def _send(self, code: int, payload: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


class FusionServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), SandboxFusionLike)
        self.lock = threading.Lock()
        self.hits: Counter[str] = Counter()
        self.requests: list[dict] = []
        self.in_flight = self.most_in_flight = 0

    def url(self, path: str = "/run_code") -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{path}"


def run_like_sandbox_fusion(body: dict) -> dict:
    """SandboxFusion's answer to a run_code request, the program run by polyrl's sandbox."""
    assert body["language"] == "python"
    memory = body["memory_limit_MB"]
    limits = SandboxLimits(memory_mb=memory if memory > 0 else None, cpu_s=body["run_timeout"])
    result = run_program(body["code"], body["stdin"], timeout_s=body["run_timeout"], limits=limits)
    run_status = "TimeLimitExceeded" if result.timed_out else "Finished"
    return {
        "status": "Success" if result.returncode == 0 and not result.timed_out else "Failed",
        "message": "",
        "compile_result": None,
        "run_result": {
            "status": run_status,
            "execution_time": result.elapsed_s,
            "return_code": None if result.timed_out else result.returncode,
            "stdout": result.stdout,
            "stderr": result.stderr,
        },
        "files": {},
    }


@pytest.fixture
def server() -> Iterator[FusionServer]:
    httpd = FusionServer()
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def settings(url: str, **kwargs: object) -> SandboxFusionSettings:
    return SandboxFusionSettings(url=url, **{"run_timeout_s": 5.0, **kwargs})


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/run_code"


# ---- scoring against the server -----------------------------------------------------------
def test_a_correct_program_scores_one_and_the_request_is_the_documented_one(server):
    result = score("codecontests", CORRECT, json.dumps(ADD), {}, {"url": server.url()})
    assert result["score"] == 1.0
    assert (result["passed"], result["total"], result["api_errors"]) == (3, 3, 0)
    sent = server.requests[0]
    assert sent["code"] == "a, b = map(int, input().split())\nprint(a + b)\n"
    assert sent["stdin"] in ADD["inputs"] and sent["language"] == "python"
    assert (sent["memory_limit_MB"], sent["run_timeout"], sent["compile_timeout"]) == (1024, 10, 10)


def test_wrong_answers_and_errors_score_their_share(server):
    partial = fusion_score(PARTIAL, ADD, settings(server.url()))
    assert partial["score"] == pytest.approx(2 / 3) and partial["wrong_answers"] == 1
    crash = fusion_score("```python\nraise ValueError\n```", ADD, settings(server.url()))
    assert (crash["score"], crash["runtime_errors"]) == (0.0, 3)


def test_a_response_without_a_code_block_scores_zero_and_sends_nothing(server):
    result = fusion_score("a, b = map(int, input().split())", ADD, settings(server.url()))
    assert (result["score"], result["no_code_block"], result["total"]) == (0.0, 1.0, 3)
    assert server.hits["/run_code"] == 0


def test_a_program_past_its_time_limit_is_a_timeout(server):
    spin = "```python\nwhile True:\n    pass\n```"
    result = fusion_score(
        spin, {"inputs": [""], "outputs": [""]}, settings(server.url(), run_timeout_s=1)
    )
    assert (result["score"], result["timeouts"]) == (0.0, 1)


def test_memory_limit_mb_reaches_the_service_as_memory_limit_MB(server):
    greedy = "```python\nx = bytearray(512 * 1024 * 1024)\nprint('ok')\n```"
    truth = {"inputs": [""], "outputs": ["ok"]}
    assert fusion_score(greedy, truth, settings(server.url(), memory_limit_mb=128))["score"] == 0.0
    assert server.requests[-1]["memory_limit_MB"] == 128
    assert fusion_score(greedy, truth, settings(server.url(), memory_limit_mb=2048))["score"] == 1.0


def test_fn_name_and_assert_cases_follow_verls_layout(server):
    leetcode = "```python\nclass Solution:\n    def add(self, a: List[int], b: int) -> int:\n"
    leetcode += "        return sum(a) + b\n```"
    truth = {"fn_name": "add", "inputs": ["[1, 2]\n3", "[5]\n-5"], "outputs": ["6", "1"]}
    result = fusion_score(leetcode, truth, settings(server.url()))
    assert (result["passed"], result["wrong_answers"]) == (1, 1)
    asserts = {"assert_case": ["assert add(1, 2) == 3", "assert add(2, 2) == 5"]}
    honest = "```python\ndef add(a, b):\n    return a + b\n```"
    assert fusion_score(honest, asserts, settings(server.url()))["score"] == 0.5


def test_only_the_ten_scored_cases_are_sent(server):
    many = {"inputs": [f"{i} 0" for i in range(14)], "outputs": [str(i) for i in range(14)]}
    many["outputs"][12] = "wrong, but never read"
    result = fusion_score(CORRECT, many, settings(server.url()))
    assert (result["score"], result["total"], server.hits["/run_code"]) == (1.0, 10, 10)


def test_max_concurrent_bounds_requests_across_the_threads_of_a_process(server):
    truth = {"inputs": ["1 1"] * 4, "outputs": ["2"] * 4}
    bound = settings(server.url(), max_concurrent=2)
    with ThreadPoolExecutor(3) as pool:  # three samples at once, as reward threads would
        results = list(pool.map(lambda _: fusion_score(SLEEPY, truth, bound), range(3)))
    assert [r["score"] for r in results] == [1.0, 1.0, 1.0]
    assert server.most_in_flight == 2


def test_an_http_500_is_retried_then_scores_zero_and_is_reported(server, capsys):
    result = fusion_score(CORRECT, ADD, settings(server.url("/broken")))
    assert (result["score"], result["api_errors"]) == (0.0, 3)
    assert server.hits["/broken"] == 3 * 3  # three attempts per case
    err = capsys.readouterr().err
    assert err.count("SandboxFusion request") == 1 and "HTTP 500" in err and "/broken" in err


@pytest.mark.parametrize("path", ["/bad", "/not-json", "/moved"])
def test_a_4xx_a_non_json_answer_and_a_redirect_are_not_retried(server, path):
    result = fusion_score(CORRECT, ADD, settings(server.url(path)))
    assert (result["score"], result["api_errors"]) == (0.0, 3)
    assert server.hits[path] == 3 and server.hits["/run_code"] == 0


def test_a_refused_connection_scores_zero_without_failing_the_step(capsys):
    url = closed_port_url()
    start = time.monotonic()
    result = fusion_score(CORRECT, ADD, settings(url))
    assert (result["score"], result["api_errors"]) == (0.0, 3)
    assert time.monotonic() - start < 10  # bounded retries
    assert "cannot connect" in capsys.readouterr().err


# ---- the verdict and the layout, without a server ------------------------------------------
def test_verdict_reads_the_documented_statuses():
    finished = {"status": "Finished", "stdout": "3\n\n", "return_code": 0}
    assert verdict({"status": "Success", "run_result": finished}, "3") == "passed"
    assert verdict({"status": "Success", "run_result": finished}, "3 ") == "wrong_answers"
    assert verdict({"status": "Success", "run_result": finished}, None) == "passed"
    tle = {"status": "Failed", "run_result": {"status": "TimeLimitExceeded"}}
    assert verdict(tle, "3") == "timeouts"
    assert verdict({"status": "Failed", "compile_result": {"status": "Error"}}, "3") == (
        "runtime_errors"
    )
    assert verdict({"status": "SandboxError", "message": "oops"}, "3") == "sandbox_errors"


@pytest.mark.parametrize(
    ("truth", "message"),
    [
        ("not json", "not JSON"),
        ([1, 2], "got list"),
        ({"inputs": ["1"]}, "got keys"),
        ({"inputs": ["1", "2"], "outputs": ["1"]}, "differ in length"),
        ({"inputs": ["1"], "outputs": ["1"], "fn_name": "a b"}, "Python name"),
    ],
)
def test_malformed_ground_truth_says_what_is_expected(truth, message):
    with pytest.raises(ValueError, match=message):
        load_fusion_cases("print(1)", truth)


def test_without_a_url_the_row_fails_in_one_line_naming_the_key():
    with pytest.raises(ValueError, match=r"reward_model\.sandbox_fusion\.url=http"):
        fusion_score(CORRECT, ADD, SandboxFusionSettings())


# ---- the config: verl's keys, declared by this plugin ---------------------------------------
VERL_KEYS = [
    "reward_model.sandbox_fusion.url=https://example.invalid/run_code",
    "reward_model.sandbox_fusion.max_concurrent=128",
    "reward_model.reward_manager=prime",
]


def test_verls_keys_validate_and_stand_for_plain_reward_workers(caplog):
    cfg = load_config(["recipe=tiny", "trainer.device=cpu", *VERL_KEYS])
    assert validate_config(cfg) == []
    assert "reward_model.timeout_s=10 is shorter than a SandboxFusion case" in caplog.text
    assert cfg.reward_model.sandbox_fusion.max_concurrent == 128
    assert cfg.reward_model.sandbox == "never"  # sandboxed workers have no network


def test_a_sandboxed_reward_beside_a_url_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"reward_model\.sandbox=always conflicts with"):
        load_config(["recipe=tiny", *VERL_KEYS, "reward_model.sandbox=always"])


def test_bad_sandbox_fusion_settings_are_one_line_each():
    cfg = schema_config()
    assert check_sandbox_fusion(cfg) == []
    cfg.reward_model.sandbox_fusion.url = "file:///etc/passwd"
    cfg.reward_model.sandbox_fusion.max_concurrent = 0
    problems = check_sandbox_fusion(cfg)
    assert len(problems) == 2
    assert "http:// or https://" in problems[0] and ">= 1" in problems[1]


# ---- end to end: the reward provider, its worker process and the plugin's scorer -----------
def test_the_naive_provider_scores_verl_code_rows_through_the_url(server):
    cfg = load_config(["recipe=tiny", f"reward_model.sandbox_fusion.url={server.url()}"])
    cfg.reward_model.num_workers = 1
    cfg.reward_model.timeout_s = 60
    provider = NaiveRewardProvider(RewardContext(cfg.reward_model, cfg.custom_reward_function))
    try:
        results = provider.score(
            [
                RewardSample(0, "codecontests", CORRECT, json.dumps(ADD)),
                RewardSample(1, "taco", PARTIAL, json.dumps(ADD)),
            ]
        )
    finally:
        provider.close()
    assert [r.error for r in results] == [None, None]
    assert results[0].score == 1.0 and results[1].score == pytest.approx(2 / 3)
    assert results[1].extra["wrong_answers"] == 1.0
    assert server.hits["/run_code"] == 6
