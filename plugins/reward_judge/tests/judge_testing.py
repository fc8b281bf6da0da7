"""Helpers of the judge's tests: the ``reward_model`` node a run would pass (the installed
schema with ``reward_model.judge`` mounted), samples, the ``judge`` role built in this process
with a provider attached to it, and a loopback OpenAI-compatible judge server."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

from aiohttp import web
from omegaconf import OmegaConf

from polyrl.api import Batch, PluginKind, RewardContext, RewardSample, RoleContext
from polyrl.api.testing import ScriptedRoles, schema_config, worker_plan
from polyrl_reward_judge.provider import JudgeReward
from polyrl_reward_judge.role import JudgeRole


def judge_config(**judge):
    return OmegaConf.merge(schema_config(), {"reward_model": {"judge": judge}})


def judge_context(**judge) -> RewardContext:
    cfg = judge_config(**judge)
    return RewardContext(cfg.reward_model, cfg.custom_reward_function, seed=0)


def judge_role(**judge) -> JudgeRole:
    """The ``judge`` role of one worker (rank 0 of 1, CPU), its engine from the worker plan."""
    cfg = judge_config(**judge)
    return JudgeRole(
        RoleContext(
            role="judge",
            cfg=cfg,
            model_path=str(judge["model_path"]),
            rank=0,
            world_size=1,
            device="cpu",
            plan=worker_plan(cfg, kinds=(PluginKind.ROLLOUT_ENGINE,)),
        )
    )


def on_role(role: JudgeRole, *, dp_size: int = 1, **judge) -> tuple[JudgeReward, list[Batch]]:
    """A provider whose ``judge.judge`` calls are answered by ``role`` (as the gathered result of
    ``dp_size`` ranks), and the batches the role received."""
    received: list[Batch] = []

    def answer(batch: Batch) -> Batch:
        received.append(batch)
        return role.judge(batch)

    reward = JudgeReward(judge_context(**judge))
    reward.attach_workers(ScriptedRoles({"judge.judge": answer}, {"judge": dp_size}))
    return reward, received


def samples(responses: list[str]) -> list[RewardSample]:
    return [
        RewardSample(index=i, data_source="t", solution_str=r, ground_truth="42", prompt_str="q")
        for i, r in enumerate(responses)
    ]


@dataclass
class JudgeServer:
    """``/v1/chat/completions`` answering each request with its user message after ``say:``;
    a message starting ``slow:`` is answered only after ``slow_s``. Records the most requests
    it held at once."""

    delay_s: float = 0.05
    slow_s: float = 3.0
    in_flight: int = 0
    peak: int = 0
    requests: int = 0
    base_url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = body["messages"][-1]["content"]
        with self.lock:
            self.in_flight += 1
            self.requests += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.slow_s if prompt.startswith("slow:") else self.delay_s)
        finally:
            with self.lock:
                self.in_flight -= 1
        content = prompt.split("say:", 1)[-1]
        return web.json_response(
            {
                "id": "judge-1",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
            }
        )
