"""verl's Megatron optimizer overrides (``optim.override_optimizer_config``) on the CPU: which
parameters megatron-core's rule steps on the host, a step through the host copies equal to a
plain AdamW step (bitwise, several steps, part or all of the parameters on the host), the copies
refreshed after a checkpoint load, their moments left on the host by ``optimizer_offload``, and
the one-line problems and notices ``polyrl validate`` gives for the keys verl's scripts set."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from polyrl.api import schema_node
from polyrl_engine_megatron.checks import optimizer_override_lines
from polyrl_engine_megatron.cpu_optimizer import CpuOffloadSettings, HostStep, host_stepped
from polyrl_engine_megatron.offload import HostOffload, OffloadSettings

# what verl's 96 GB Megatron scripts pass
SCRIPTS = {
    "optimizer_offload_fraction": 1.0,
    "overlap_cpu_optimizer_d2h_h2d": True,
    "use_precision_aware_optimizer": True,
    "optimizer_cpu_offload": True,
}


def _overrides(**given):
    node = schema_node({"optim": {"override_optimizer_config": given}}, "actor_rollout_ref.actor")
    return node.optim.override_optimizer_config


def _params(*sizes: int) -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(n)) for n in sizes]


def test_megatron_core_rule_takes_parameters_in_order_until_the_fraction() -> None:
    params = _params(4, 4, 2)  # 10 elements
    assert host_stepped(params, 0.0) == [False, False, False]
    assert host_stepped(params, 0.3) == [True, False, False]  # 0 < 3: taken; 4 >= 3: stop
    assert host_stepped(params, 0.5) == [True, True, False]  # 4 < 5 takes the second too
    assert host_stepped(params, 1.0) == [True, True, True]


def _model(seed: int) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))


def _steps(model: torch.nn.Module, settings: CpuOffloadSettings, steps: int = 3):
    host = HostStep(model.parameters(), settings)
    optimizer = torch.optim.AdamW(host.stepped, lr=1e-2, weight_decay=0.1)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        loss = model(torch.randn(4, 6, generator=generator)).square().mean()
        loss.backward()
        host.gradients_to_host()
        optimizer.step()
        host.weights_from_host()
        optimizer.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
    return host, optimizer


@pytest.mark.parametrize("fraction", [0.5, 1.0])
def test_a_step_through_host_copies_is_the_plain_step(fraction: float) -> None:
    plain, offloaded = _model(1), _model(1)
    _steps(plain, CpuOffloadSettings())
    host, optimizer = _steps(offloaded, CpuOffloadSettings(enabled=True, fraction=fraction))
    assert host.host_count == (4 if fraction == 1.0 else 1)
    for a, b in zip(plain.parameters(), offloaded.parameters()):
        assert torch.equal(a, b)
    # the host copies hold the parameters' values and the moments of their steps
    for param, copy in host.pairs:
        assert torch.equal(param, copy) and copy is not param
        assert optimizer.state[copy]["exp_avg"].device.type == "cpu"
        assert param not in optimizer.state


def test_host_copies_take_the_loaded_weights_and_keep_their_moments_on_the_host() -> None:
    model = _model(2)
    host, optimizer = _steps(model, CpuOffloadSettings(enabled=True, fraction=1.0), steps=1)
    loaded = _model(3).state_dict()
    model.load_state_dict(loaded)
    host.refresh()
    assert all(torch.equal(copy, param) for param, copy in host.pairs)
    # optimizer_offload moves the state of the parameters stepped on the device only: here
    # (a "meta" device stands for the GPU) the host copies' moments stay where they are
    offload = HostOffload(
        model, lambda: optimizer, torch.device("meta"), OffloadSettings(optimizer=True)
    )
    with offload.optimizer_step():
        assert all(s["exp_avg"].device.type == "cpu" for s in optimizer.state.values())


def test_verl_scripts_overrides_pass_with_notices() -> None:
    problems, notices = optimizer_override_lines(_overrides(**SCRIPTS))
    assert problems == []
    assert len(notices) == 2
    assert "use_precision_aware_optimizer=True (verl) has no effect in polyrl" in notices[0]
    assert "overlap_cpu_optimizer_d2h_h2d=True (verl) has no effect in polyrl" in notices[1]
    settings = CpuOffloadSettings.from_node(_overrides(**SCRIPTS))
    assert settings == CpuOffloadSettings(enabled=True, fraction=1.0, pin=True)
    assert CpuOffloadSettings.from_node(_overrides()) == CpuOffloadSettings()


def test_what_contradicts_the_engine_is_one_line_each() -> None:
    problems, notices = optimizer_override_lines(
        _overrides(optimizer_offload_fraction=1.5, exp_avg_dtype="bf16")
    )
    assert len(problems) == 2
    assert "optimizer_offload_fraction=1.5: give the share" in problems[0]
    assert "exp_avg_dtype=bf16 asks for lower-precision optimizer state" in problems[1]
    assert "without optimizer_cpu_offload=true" in notices[0]
    assert OmegaConf.is_config(_overrides())  # a typed node of the plugin's settings
