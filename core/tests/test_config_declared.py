"""Every config key the code reads is declared in the schema, and every declared key is read.

:mod:`polyrl.config.schema` declares core's keys and each plugin declares its own as config
sections (:mod:`polyrl.config.sections`); the installed plugins' sections are part of the schema
checked here, and their declared key aliases count as declared. Two static
scans of the sources of core (``core/src``) and of the first-party plugins (``plugins/*/src``)
keep it honest:

1. *Declared keys are read.* Each leaf key of the schema must appear in code outside
   ``polyrl/config/schema.py`` and ``polyrl/config/keys.py``, as an attribute (``.ppo_epochs``) or
   a string constant (``"ppo_epochs"``, or a dotted ``"actor_rollout_ref.actor.ppo_epochs"``), or
   be listed in :data:`polyrl.config.schema.VERL_COMPAT_KEYS` (accepted for verl command lines,
   ignored).
2. *Read keys are declared.* (a) Dotted config paths in string constants and f-string texts
   (``"actor_rollout_ref.rollout.n"``, messages included) name declared keys; (b) literal keys
   read with ``X.get("key")``, ``getattr(X, "key")``, ``X["key"]``, ``"key" in X`` or a getter
   helper (``cfg_get(X, "key")``) on a receiver named like a config node (``cfg``, ``config``,
   ``engine``, or a schema group such as ``rollout`` or ``optim``) are declared; (c) attribute
   chains from a config root (``cfg.trainer.seed``, ``self.cfg.actor_rollout_ref.actor.x``) are
   declared paths.

Limits: the scans are by name, not by data flow. (1) counts a leaf as read when its *name* is read
anywhere, so ``critic.ppo_epochs`` passes because ``actor_rollout_ref.actor.ppo_epochs`` is read;
(2b) knows receivers only by their variable name and checks key names, not full paths; attribute
reads on intermediate variables (``actor = cfg.actor_rollout_ref.actor; actor.x``) are not
scanned at all. Those reads are safe at run time anyway: config nodes are ``DictConfig`` objects
built from the schema, and attribute access to an undeclared key raises.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from polyrl.config.keys import FREE_FORM_PREFIXES, schema_keys
from polyrl.config.schema import VERL_COMPAT_KEYS
from polyrl.config.sections import key_aliases
from polyrl.config.verl_compat import verl_keys

ROOT = Path(__file__).resolve().parents[2]
CONFIG_PACKAGE = ROOT / "core" / "src" / "polyrl" / "config"
# Where keys are declared or listed, not read (verl_compat.py: the table of verl's keys).
NOT_READERS = (
    CONFIG_PACKAGE / "schema.py",
    CONFIG_PACKAGE / "keys.py",
    CONFIG_PACKAGE / "verl_compat.py",
)

# Keys that code adds to config nodes at run time (not user settings, so not in the schema).
RUNTIME_KEYS = {
    # the actor role adds the LR schedule's length to the engine node it builds
    "total_optimizer_steps": "polyrl.workers.roles.actor -> polyrl_engine_fsdp.config",
    # verl's group, mounted at verl's default by polyrl.config.verl_compat; the batch manager
    # passes it to the user's function as verl's does
    "reward_kwargs": "polyrl.config.verl_compat -> polyrl.rewards.batch",
}
#: Names of compat-only keys that the code uses for something else (the scan sees names only).
NAME_CLASHES = {
    # the FSDP engine's Ulysses group, not megatron.sequence_parallel (read by no engine)
    "sequence_parallel": "polyrl_engine_kit.ulysses",
}
# Dotted texts that look like config paths but name fields of verl-format data rows.
DATA_PATHS = {"reward_model.ground_truth", "reward_model.style"}
# Receivers whose literal-key reads are checked: config roots, the schema's group names, and the
# names polyrl's code gives config nodes.
CONFIG_ROOT_NAMES = {"cfg", "config", "conf"}
OTHER_RECEIVERS = {"engine", "node", "arr", "rm", "fsdp"}
# Names that also mean a torch model, a Hugging Face config or a data row: their reads are
# checked only when they hang off a config root (``cfg.actor_rollout_ref.model``, ``ctx.config``).
AMBIGUOUS_RECEIVERS = {"model", "config", "reward_model", "data"}
HELPER_GETTERS = {"cfg_get", "_get", "_config_value", "get", "select"}
DICT_METHODS = {"get", "items", "keys", "values", "pop", "copy", "setdefault", "update"}


# ---- the schema --------------------------------------------------------------------------------
# Core's schema and every installed plugin's config sections (polyrl.config.sections).
DECLARED = set(schema_keys())
GROUPS = {key for key in DECLARED if any(other.startswith(key + ".") for other in DECLARED)}
TOP_GROUPS = tuple(sorted(key for key in DECLARED if "." not in key))
PATH_IN_TEXT = re.compile(
    r"(?<![\w.{$])((?:" + "|".join(TOP_GROUPS) + r")(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?![\w(])"
)
# Keys (or groups) plugins accept as another name of a declared key: declared too.
ALIASES = tuple(key_aliases())
LEAVES = sorted(DECLARED - GROUPS)
VERL_KEYS = tuple(verl_keys())
NAMES = {key.rpartition(".")[2] for key in DECLARED}
GROUP_NAMES = {path.rpartition(".")[2] for path in GROUPS}


def _free_form(path: str) -> bool:
    return any(path == p or path.startswith(p + ".") for p in FREE_FORM_PREFIXES)


def _declared(path: str) -> bool:
    """``path`` is a declared key, or lies below a free-form key, or is a method of a leaf."""
    if path in DECLARED or _free_form(path):
        return True
    if any(path == alias or path.startswith(alias + ".") for alias in ALIASES):
        return True
    parent, _, _name = path.rpartition(".")
    return parent in DECLARED and parent not in GROUPS  # e.g. trainer.logger.append


def _verl_known(path: str) -> bool:
    """``path`` is (or groups) a key of verl's config: a message may name it (a refusal of verl's
    feature does), and :mod:`polyrl.config.verl_compat` mounts and judges it."""
    return any(key == path or key.startswith(path + ".") for key in VERL_KEYS)


def _compat(key: str) -> bool:
    return any(key == c or key.startswith(c + ".") for c in VERL_COMPAT_KEYS)


# ---- the sources -------------------------------------------------------------------------------
def _sources() -> list[Path]:
    files = sorted((ROOT / "core" / "src").rglob("*.py"))
    files += sorted(p for p in (ROOT / "plugins").glob("*/src/**/*.py"))
    return [p for p in files if "egg-info" not in str(p)]


SOURCES = _sources()


@functools.cache
def trees() -> dict[Path, ast.AST]:
    """Every source parsed, once, when a test first asks: at import, each test process would
    parse them while collecting, whether or not it runs these tests."""
    return {path: ast.parse(path.read_text(), filename=str(path)) for path in SOURCES}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _terminal_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _is_root(name: str) -> bool:
    return name in CONFIG_ROOT_NAMES or name.endswith("_cfg")


def _config_receiver(node: ast.AST) -> bool:
    name = _terminal_name(node)
    if not name:
        return False
    if name in AMBIGUOUS_RECEIVERS:
        above = _chain(node)[:-1] if isinstance(node, ast.Attribute) else []
        return any(_is_root(n) for n in above) or (name == "config" and above[-1:] == ["ctx"])
    return _is_root(name) or name in GROUP_NAMES or name in OTHER_RECEIVERS


def _chain(node: ast.Attribute) -> list[str]:
    names = []
    current: ast.AST = node
    while isinstance(current, ast.Attribute):
        names.append(current.attr)
        current = current.value
    if isinstance(current, ast.Name):
        names.append(current.id)
    return names[::-1]


def read_names() -> set[str]:
    """Every attribute name, and every identifier in whole string constants, read outside the
    schema (docstrings and message texts excepted)."""
    names: set[str] = set()
    for path, tree in trees().items():
        if path in NOT_READERS:
            continue
        skip = _docstrings(tree)
        in_fstring = {
            id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in skip
                and id(node) not in in_fstring
                and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", node.value)
            ):
                names.update(node.value.split("."))
    return names


def undeclared_reads() -> list[str]:
    """``file:line: what`` for every read of an undeclared key the scans find."""
    found = []
    for path, tree in trees().items():
        if path in (NOT_READERS[0], NOT_READERS[2]):
            continue
        where = path.relative_to(ROOT)

        def report(node: ast.AST, what: str, *, _where: Path = where) -> None:
            found.append(f"{_where}:{getattr(node, 'lineno', '?')}: {what}")

        for node in ast.walk(tree):
            # (a) dotted config paths in strings and messages
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for match in PATH_IN_TEXT.finditer(node.value):
                    named = match.group(1)
                    if not _declared(named) and not _verl_known(named) and named not in DATA_PATHS:
                        report(node, f"string names undeclared key {named!r}")
            # (b) literal keys read from config-like receivers
            key, receiver = None, None
            if isinstance(node, ast.Call) and node.args:
                first = node.args[0]
                func = node.func
                if (
                    isinstance(func, ast.Attribute)
                    and func.attr == "get"
                    and isinstance(first, ast.Constant)
                ):
                    key, receiver = first.value, func.value
                elif (
                    _terminal_name(func) in HELPER_GETTERS | {"getattr", "hasattr"}
                    and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant)
                ):
                    key, receiver = node.args[1].value, first
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                key, receiver = node.slice.value, node.value
            elif (
                isinstance(node, ast.Compare)
                and isinstance(node.left, ast.Constant)
                and len(node.ops) == 1
                and isinstance(node.ops[0], ast.In | ast.NotIn)
            ):
                key, receiver = node.left.value, node.comparators[0]
            if (
                isinstance(key, str)
                and receiver is not None
                and _config_receiver(receiver)
                and _terminal_name(receiver) != "plugins"
                and key not in {*RUNTIME_KEYS, *DICT_METHODS}
                and not (_declared(key) if "." in key else key in NAMES)
            ):
                report(node, f"reads undeclared key {key!r} from {ast.unparse(receiver)}")
            # (c) attribute chains from a config root
            if isinstance(node, ast.Attribute):
                names = _chain(node)
                for i in range(1, len(names)):
                    root = names[i - 1]
                    if names[i] in TOP_GROUPS and (
                        root in CONFIG_ROOT_NAMES or root.endswith("_cfg")
                    ):
                        dotted = ".".join(n for n in names[i:] if n not in DICT_METHODS)
                        if not _declared(dotted):
                            report(node, f"reads undeclared path {dotted!r}")
                        break
    return sorted(set(found))


# ---- the tests ---------------------------------------------------------------------------------
def test_the_scans_see_the_sources() -> None:
    assert len(SOURCES) > 50
    names = read_names()
    assert {"ppo_mini_batch_size", "kl_ctrl", "tensor_model_parallel_size"} <= names
    # keys accepted only for verl command lines are indeed read nowhere (the scan would flag them)
    assert not {key.rpartition(".")[2] for key in VERL_COMPAT_KEYS} - NAME_CLASHES.keys() & names


def test_compat_keys_are_declared() -> None:
    assert len(set(VERL_COMPAT_KEYS)) == len(VERL_COMPAT_KEYS)
    unknown = [key for key in VERL_COMPAT_KEYS if key not in DECLARED]
    assert unknown == [], f"VERL_COMPAT_KEYS lists keys the schema does not declare: {unknown}"


def test_every_declared_key_is_read() -> None:
    names = read_names()
    unread = [key for key in LEAVES if not _compat(key) and key.rpartition(".")[2] not in names]
    assert unread == [], (
        f"declared in polyrl/config/schema.py but read nowhere: {unread}. Honour them, remove "
        f"them, or (only to keep verl command lines parsing) list them in VERL_COMPAT_KEYS"
    )


def test_no_undeclared_key_is_read() -> None:
    found = undeclared_reads()
    assert found == [], "reads of keys the schema does not declare:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('cfg.get("lr_schedular")', "reads undeclared key 'lr_schedular' from cfg"),
        ('getattr(optim, "warmup")', "reads undeclared key 'warmup' from optim"),
        ("x = self.cfg.trainer.sed", "reads undeclared path 'trainer.sed'"),
        ('msg = f"set actor_rollout_ref.actor.ppo_epoch={n}"', "undeclared key"),
        ('"log_prob_foo" in engine', "reads undeclared key 'log_prob_foo' from engine"),
    ],
)
def test_the_scan_catches(source: str, expected: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = ROOT / "core" / "src" / "polyrl" / "_fake_reader.py"
    monkeypatch.setitem(trees(), fake, ast.parse(source))
    found = [f for f in undeclared_reads() if f.startswith("core/src/polyrl/_fake_reader.py")]
    assert len(found) == 1 and expected in found[0], found


def test_the_scan_leaves_declared_and_free_form_reads_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = "\n".join(
        [
            'cfg.get("plugins")',
            "cfg.trainer.logger.append(1)",
            "self.cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.x",
            'msg = "trainer.role_pools.actor=train"',
            'raw.get("vllm")',
            'engine.get("total_optimizer_steps")',
        ]
    )
    fake = ROOT / "core" / "src" / "polyrl" / "_fake_reader.py"
    monkeypatch.setitem(trees(), fake, ast.parse(source))
    assert [f for f in undeclared_reads() if "_fake_reader" in f] == []
