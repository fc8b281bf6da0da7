"""Old import paths of the code that moved to polyrl-engine-kit keep working: the same objects,
with a deprecation warning naming the new import; what stayed here imports without one."""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path

import pytest

KIT_SOURCES = Path(__file__).resolve().parents[2] / "engine_kit/src/polyrl_engine_kit"


def test_a_moved_module_imports_from_its_old_path_as_the_same_module() -> None:
    import polyrl_engine_fsdp
    import polyrl_engine_kit.microbatch

    name = "polyrl_engine_fsdp.microbatch"
    sys.modules.pop(name, None)
    with pytest.warns(DeprecationWarning, match=r"import it from there"):
        old = importlib.import_module(name)
    assert old is polyrl_engine_kit.microbatch
    assert polyrl_engine_fsdp.microbatch is old
    assert set(polyrl_engine_fsdp.MOVED_TO_ENGINE_KIT) <= {p.stem for p in KIT_SOURCES.glob("*.py")}


@pytest.mark.parametrize(
    ("old_module", "name"),
    [
        ("polyrl_engine_fsdp.checkpoint", "loop_state"),
        ("polyrl_engine_fsdp.modeling", "load_hf_model"),
        ("polyrl_engine_fsdp.checks", "positive_int"),
    ],
)
def test_a_moved_name_of_a_split_module_warns_and_is_the_same_object(
    old_module: str, name: str
) -> None:
    old = importlib.import_module(old_module)
    new = importlib.import_module(old_module.replace("polyrl_engine_fsdp", "polyrl_engine_kit"))
    with pytest.warns(DeprecationWarning, match=rf"polyrl_engine_kit\.\w+\.{name}"):
        assert getattr(old, name) is getattr(new, name)
    with pytest.raises(AttributeError, match="no_such_name"):
        old.no_such_name  # noqa: B018


def test_what_stayed_in_the_fsdp_engine_imports_without_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        from polyrl_engine_fsdp.checkpoint import load_sharded
        from polyrl_engine_fsdp.modeling import shard_model
    assert callable(load_sharded) and callable(shard_model)
