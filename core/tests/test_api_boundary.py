"""The public API boundary: first-party plugins import core only through ``polyrl.api`` (and
``polyrl.api.testing``); every name ``polyrl.api`` lists resolves; importing it stays light
(no torch, Ray or transformers); the names it re-exports are the same objects as at their old
import paths, which keep working.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import polyrl.api
import polyrl.api.testing
from polyrl.api import names

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "plugins"
API_SOURCES = {
    "polyrl.api": REPO / "core/src/polyrl/api/__init__.py",
    "polyrl.api.testing": REPO / "core/src/polyrl/api/testing.py",
}
ALLOWED_MODULES = frozenset(API_SOURCES)
HEAVY_MODULES = ("torch", "ray", "transformers")
# An import string a spec resolves later ("package.module:attribute").
IMPORT_STRING = re.compile(r"^(polyrl(?:\.\w+)*):[\w.]+$")


def _is_core(module: str) -> bool:
    return module == "polyrl" or module.startswith("polyrl.")


def private_core_imports(source: str, filename: str = "<source>") -> list[str]:
    """``file:line: module`` for each import of core other than the public API, including
    ``"polyrl.x:attr"`` import strings (a spec's ``pipeline=``, ``fn=`` ...)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "polyrl":  # `from polyrl import api` is the API; anything else not
                modules = [f"polyrl.{alias.name}" for alias in node.names]
            else:
                modules = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = IMPORT_STRING.match(node.value)
            if match:
                modules = [match.group(1)]
        for module in modules:
            if _is_core(module) and module not in ALLOWED_MODULES:
                found.append(f"{filename}:{node.lineno}: {module}")
    return found


def _plugin_sources() -> list[Path]:
    return sorted(PLUGINS.glob("*/src/**/*.py"))


def test_the_boundary_check_sees_each_way_of_importing() -> None:
    source = "\n".join(
        [
            "import polyrl.api",
            "from polyrl import api",
            "from polyrl.api import Batch",
            "from polyrl.api.testing import build_tiny_model",
            "from polyrl_algo_ppo.gae import gae",
            "import polyrl_engine_fsdp",
            "from polyrl.batch import Batch",  # line 7
            "import polyrl.step.stages",  # line 8
            "from polyrl import hookimpl",  # line 9
            "def f():",
            "    from polyrl.workers.roles.actor import plain_node",  # line 11
            "STEP = 'polyrl.step.policy_gradient:policy_gradient_pipeline'",  # line 12
            "OK = 'polyrl.api:policy_gradient_pipeline'",
            "TEXT = 'see polyrl.batch: the batch'",
        ]
    )
    assert private_core_imports(source, "m.py") == [
        "m.py:7: polyrl.batch",
        "m.py:8: polyrl.step.stages",
        "m.py:9: polyrl.hookimpl",
        "m.py:11: polyrl.workers.roles.actor",
        "m.py:12: polyrl.step.policy_gradient",
    ]


def test_first_party_plugins_import_only_the_public_api() -> None:
    sources = _plugin_sources()
    assert len(sources) > 50, "the plugins' sources were not found"
    found = [
        problem
        for path in sources
        for problem in private_core_imports(path.read_text(), str(path.relative_to(REPO)))
    ]
    assert not found, (
        "plugins import core only through polyrl.api (or polyrl.api.testing); export what a "
        "plugin needs from core/src/polyrl/api/ instead:\n" + "\n".join(found)
    )


def test_api_version_is_major_minor() -> None:
    assert re.fullmatch(r"\d+\.\d+", polyrl.api.API_VERSION)
    assert polyrl.api.API_VERSION.split(".")[0] == "1"


@pytest.mark.parametrize("module", [polyrl.api, polyrl.api.testing], ids=lambda m: m.__name__)
def test_every_listed_name_resolves(module: object) -> None:
    all_names = module.__all__  # type: ignore[attr-defined]
    assert len(all_names) == len(set(all_names)), "a name is listed twice in __all__"
    for name in all_names:
        assert getattr(module, name) is not None, name
    assert sorted(dir(module)) == sorted(all_names)
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        module.not_a_name  # type: ignore[attr-defined]  # noqa: B018


def _declared(source_path: Path) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """From an API module's source: its eager imports, its lazy table and its ``TYPE_CHECKING``
    imports, each as ``name -> "module:attribute"`` (``"module"`` for a module)."""
    tree = ast.parse(source_path.read_text())

    def imports(body: list[ast.stmt]) -> dict[str, str]:
        out = {}
        for node in body:
            if isinstance(node, ast.ImportFrom) and node.module and _is_core(node.module):
                for alias in node.names:
                    if not (alias.asname or alias.name).startswith("_"):  # private helpers
                        out[alias.asname or alias.name] = f"{node.module}:{alias.name}"
        return out

    lazy: dict[str, str] = {}
    checking: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "_LAZY":
            lazy = ast.literal_eval(node.value)  # type: ignore[arg-type]
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            checking = imports(node.body)
    return imports(tree.body), lazy, checking


def _as_lazy_target(target: str) -> str:
    """``"polyrl.step:names"`` -> ``"polyrl.step.names"`` when it names a submodule."""
    module, attribute = target.split(":")
    try:
        importlib.import_module(f"{module}.{attribute}")
    except ModuleNotFoundError:
        return target
    return f"{module}.{attribute}"


@pytest.mark.parametrize("api", sorted(API_SOURCES))
def test_all_lists_exactly_the_declared_names(api: str) -> None:
    """``__all__`` = the eager re-exports + the lazy table (+ ``API_VERSION``), and the
    ``TYPE_CHECKING`` imports (what type checkers see) name the same objects as the lazy table."""
    eager, lazy, checking = _declared(API_SOURCES[api])
    assert lazy, "no _LAZY table found"
    assert {name: _as_lazy_target(t) for name, t in checking.items()} == lazy
    assert not set(eager) & set(lazy)
    module = importlib.import_module(api)
    own = {"API_VERSION"} & set(vars(module))
    assert set(module.__all__) == set(eager) | set(lazy) | own


@pytest.mark.parametrize("api", sorted(API_SOURCES))
def test_old_import_paths_still_work(api: str) -> None:
    """Nothing moved: each re-exported name is the very object at its home module."""
    eager, lazy, _ = _declared(API_SOURCES[api])
    module = importlib.import_module(api)
    for name, target in {**eager, **lazy}.items():
        home, _, attribute = target.partition(":")
        old = importlib.import_module(home)
        if attribute:
            old = getattr(old, attribute)
        assert getattr(module, name) is old, f"{api}.{name} is not {target}"


def _run_hidden(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter where torch, Ray and transformers cannot be imported;
    return the heavy modules it ended up with (none, or it raised)."""
    hide = "".join(f"sys.modules[{m!r}] = None\n" for m in HEAVY_MODULES)
    check = f"print(json.dumps([m for m in {HEAVY_MODULES!r} if sys.modules.get(m) is not None]))"
    script = f"import json, sys\n{hide}{code}\n{check}\n"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_api_imports_no_heavy_library() -> None:
    eager, _, _ = _declared(API_SOURCES["polyrl.api"])
    code = (
        "import polyrl.api, polyrl.api.testing\n"
        f"from polyrl.api import API_VERSION, {', '.join(sorted(eager))}\n"
    )
    assert _run_hidden(code) == []
    # and nothing heavy is pulled in by merely importing it (torch installed, not hidden)
    probe = f"import polyrl.api; print([m for m in {HEAVY_MODULES!r} if m in sys.modules])"
    out = subprocess.run(
        [sys.executable, "-c", f"import sys; {probe}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip() == "[]"


def test_lazy_names_resolve_on_first_access_only() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, polyrl.api\n"
            "before = 'polyrl.batch' in sys.modules\n"
            "from polyrl.api import Batch\n"
            "print(before, 'polyrl.batch' in sys.modules, Batch.__module__)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.split() == ["False", "True", "polyrl.batch"]


# ---- batch keys and stage names --------------------------------------------------------------
def _constants(prefix: str = "") -> dict[str, str]:
    return {
        k: v
        for k, v in vars(names).items()
        if k.isupper() and isinstance(v, str) and k.startswith(prefix)
    }


def test_names_are_unique_strings_per_kind() -> None:
    stages = _constants("STAGE_")
    keys = {k: v for k, v in _constants().items() if k not in stages}
    assert len(set(stages.values())) == len(stages)
    assert len(set(keys.values())) == len(keys)
    for name, value in keys.items():
        assert name == value.upper(), f"batch key constant {name} = {value!r}"
    for name, value in stages.items():
        assert name == "STAGE_" + value.upper(), f"stage constant {name} = {value!r}"


def test_batch_keys_cover_the_core_tuples() -> None:
    from polyrl.step.stages import GENERATED_KEYS

    keys = set(_constants().values())
    for group in (
        polyrl.api.PROMPT_BATCH_KEYS,
        polyrl.api.MODEL_INPUT_KEYS,
        GENERATED_KEYS,
        polyrl.api.ESTIMATOR_KEYS,
        polyrl.api.POLICY_LOSS_KEYS,
    ):
        assert set(group) <= keys, set(group) - keys


def test_batch_keys_cover_the_first_party_plugins_tuples() -> None:
    preference = pytest.importorskip("polyrl_algo_dpo.preference")
    assert set(preference.PREFERENCE_BATCH_KEYS) <= set(_constants().values())


def test_stage_names_match_the_core_stages() -> None:
    from polyrl.step import stages
    from polyrl.step.reward_model import RewardModelStage

    pairs = [
        (stages.GenerateStage, names.STAGE_GEN),
        (stages.RewardStage, names.STAGE_REWARD),
        (RewardModelStage, names.STAGE_REWARD_MODEL),
        (stages.OldLogProbStage, names.STAGE_OLD_LOG_PROB),
        (stages.RefLogProbStage, names.STAGE_REF),
        (stages.KLInRewardStage, names.STAGE_KL_IN_REWARD),
        (stages.AdvantageStage, names.STAGE_ADV),
        (stages.UpdateActorStage, names.STAGE_UPDATE_ACTOR),
        (stages.SyncWeightsStage, names.STAGE_UPDATE_WEIGHTS),
    ]
    assert [cls.name for cls, _ in pairs] == [name for _, name in pairs]


@pytest.mark.parametrize(
    ("module", "cls", "constant"),
    [
        ("polyrl_algo_ppo.stages", "ValuesStage", "STAGE_VALUES"),
        ("polyrl_algo_ppo.stages", "UpdateCriticStage", "STAGE_UPDATE_CRITIC"),
        ("polyrl_algo_reinforce.remax", "GreedyBaselineStage", "STAGE_GEN_MAX"),
        ("polyrl_algo_grpo.dynamic_sampling", "DynamicSamplingStage", "STAGE_DYNAMIC_SAMPLING"),
        ("polyrl_algo_grpo.overlong", "OverlongPenaltyStage", "STAGE_OVERLONG_PENALTY"),
    ],
)
def test_stage_names_match_the_first_party_plugins(module: str, cls: str, constant: str) -> None:
    plugin = pytest.importorskip(module)
    assert getattr(plugin, cls).name == getattr(names, constant)
