"""verl's Megatron CPU offload, its bookkeeping on CPU: which calls move the parameters and the
optimizer state, and that a move keeps the tensors the optimizer and the model hold. (On the GPU
the engine's steps with and without offload are compared bitwise: test_megatron_cuda.py.)"""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

from polyrl_engine_megatron.offload import HostOffload, OffloadSettings


def _offload(settings: OffloadSettings) -> tuple[HostOffload, list[str]]:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    offload = HostOffload(model, lambda: optimizer, torch.device("cpu"), settings)
    moves: list[str] = []
    move_params, move_state = offload._move_params, offload._move_optimizer_state

    def params(target: torch.device) -> None:
        moves.append("params->" + ("device" if target is offload.device else "host"))
        move_params(target)

    def state(target: torch.device) -> None:
        moves.append("optimizer->" + ("device" if target is offload.device else "host"))
        move_state(target)

    offload._move_params, offload._move_optimizer_state = params, state
    return offload, moves


def test_settings_are_verls_keys() -> None:
    node = OmegaConf.create({"param_offload": True, "grad_offload": False, "optimizer_offload": 1})
    assert OffloadSettings.from_node(node) == OffloadSettings(True, False, True)


def test_each_outermost_call_moves_the_parameters_once_each_way() -> None:
    offload, moves = _offload(OffloadSettings(params=True))
    offload.start()
    with offload.call(), offload.call():  # an export streams the weights inside a call
        pass
    assert list(offload.stream(iter([1, 2]))) == [1, 2]
    assert moves == ["params->host"] + ["params->device", "params->host"] * 2
    assert offload.depth == 0


def test_the_optimizer_state_comes_for_the_step_only() -> None:
    offload, moves = _offload(OffloadSettings(optimizer=True))
    offload.start()
    with offload.call(), offload.optimizer_step():
        pass
    offload.park_optimizer()
    assert moves == ["optimizer->device", "optimizer->host", "optimizer->host"]


def test_nothing_moves_without_offload() -> None:
    offload, moves = _offload(OffloadSettings(grads=True))
    offload.start()
    with offload.call(), offload.optimizer_step():
        pass
    assert moves == []


def test_a_move_keeps_the_parameters_and_the_state_the_optimizer_holds() -> None:
    torch.manual_seed(0)
    plain = torch.nn.Linear(3, 2)
    moved = torch.nn.Linear(3, 2)
    moved.load_state_dict(plain.state_dict())
    steps = {}
    runs = (
        ("plain", plain, OffloadSettings()),
        ("moved", moved, OffloadSettings(True, True, True)),
    )
    for name, model, settings in runs:
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        offload = HostOffload(model, lambda o=optimizer: o, torch.device("cpu"), settings)
        params = list(model.parameters())
        offload.start()
        for seed in range(3):
            with offload.call():
                x = torch.randn(4, 3, generator=torch.Generator().manual_seed(seed))
                model(x).square().sum().backward()
                with offload.optimizer_step():
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        assert [p is q for p, q in zip(params, model.parameters())] == [True, True]
        assert all(p in optimizer.state for p in params)
        steps[name] = [p.detach().clone() for p in model.parameters()]
    for a, b in zip(steps["plain"], steps["moved"]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
