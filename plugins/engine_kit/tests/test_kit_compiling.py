"""What :mod:`polyrl_engine_kit.compiling` decides before torch.compile runs: which layer calls
go through the compiled graph, and that floats are traced as constants (a symbolic float made
dynamo restart its trace of every decoder layer on CUDA)."""

from __future__ import annotations

from typing import Any

import torch

from polyrl_engine_kit import compiling


def test_small_no_grad_forwards_run_eagerly_and_the_rest_compiled() -> None:
    few = torch.zeros(1, compiling.EAGER_NO_GRAD_TOKENS - 1, 8)
    many = torch.zeros(1, compiling.EAGER_NO_GRAD_TOKENS, 8)
    with torch.no_grad():
        assert not compiling.worth_compiling(few)
        assert compiling.worth_compiling(many)
        assert compiling.worth_compiling(hidden_states=many, position_ids=None)
    assert compiling.worth_compiling(few)  # under autograd: always the compiled graph


class _Norm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.eps = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def test_a_float_attribute_is_traced_as_a_constant_under_dynamic_shapes() -> None:
    placeholders: list[Any] = []

    def recording_backend(graph: torch.fx.GraphModule, example_inputs: Any) -> Any:
        placeholders.extend(
            n.meta.get("example_value") for n in graph.graph.nodes if n.op == "placeholder"
        )
        return graph.forward

    torch._dynamo.reset()
    norm = _Norm()
    run = compiling.compile_or_eager(norm.forward, "norm", backend=recording_backend)
    x = torch.randn(3, 5)
    torch.testing.assert_close(run(x), norm.forward(x))
    assert placeholders, "nothing was compiled"
    # Traced as a symbol, the epsilon would be an input: a float, or a 0-d float64 tensor.
    scalars = [p for p in placeholders if isinstance(p, (float, torch.SymFloat))]
    scalars += [p for p in placeholders if isinstance(p, torch.Tensor) and p.dim() == 0]
    assert not scalars, placeholders
