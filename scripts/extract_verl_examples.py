"""Extract the Hydra overrides of every verl example script that launches verl.trainer.main_ppo,
and the keys verl's trainer config declares.

Usage (with a verl git directory, e.g. the one the ``fetch`` tool brings)::

    .venv/bin/python scripts/extract_verl_examples.py /path/to/verl/.git \\
        > core/tests/fixtures/verl_examples.json
    .venv/bin/python scripts/extract_verl_examples.py --keys /path/to/verl/.git \\
        > core/src/polyrl/config/verl_keys.json

The scripts are read, never run: a small reader of the shell forms they use (assignments with
``${VAR:-default}``, arrays and ``"${ARR[@]}"``, ``$((...))``, quoting, continuation lines)
expands the variables each script sets, in file order. A value the script cannot know without
running (``$HOME``, ``$(nproc)``) stays as written; ``$@`` is dropped. A lower-case variable the
script never sets is the script's own (environment variables are upper case, POSIX leaves lower
case to applications) and expands as bash expands it: to nothing, 0 in arithmetic, or, under
``set -u``, it stops the script. Where a script assigns a variable in both branches of an
``if``, the later text wins: the result is one plausible command line per script, which is what
the compatibility test needs.

Scripts that verl itself cannot run as written are listed under ``verl_fails`` with the reason:
bash stops before launching verl (an unbound variable under ``set -u``), or verl's Hydra cannot
parse an override.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

ENTRY = "verl.trainer.main_ppo"
SUFFIXES = (".sh", ".slurm")
COMMAND_ENDS = ("|", "||", "&&", ";", "&")
ASSIGNMENT = re.compile(
    r"^(?:export\s+|local\s+|declare\s+(?:-\w+\s+)?)?([A-Za-z_]\w*)(\+?)=(.*)$", re.DOTALL
)
PATH_KEYS = ("path", "_files", "_dir")
SET_OPTIONS = re.compile(r"^set((?:\s+[-+][A-Za-z]+)+)(?:\s+\w+)*$")
CONDITION = re.compile(r"^(if|elif)\s+\[\[?\s+(\S+)\s+(==?|!=)\s+(\S+)\s+\]\]?\s*;?\s*(?:then)?$")


def git(repo: str, *args: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", repo, *args], check=True, capture_output=True, text=True
    ).stdout


def scripts(repo: str) -> list[str]:
    files = git(repo, "grep", "-l", ENTRY, "HEAD", "--", "examples/").splitlines()
    return sorted(f.removeprefix("HEAD:") for f in files if f.endswith(SUFFIXES))


def logical_lines(text: str) -> list[str]:
    """Lines with continuations joined (a trailing comment after the backslash, which some
    scripts carry, is dropped) and array literals spread over lines joined."""
    joined: list[str] = []
    current = ""
    depth = 0
    for raw in text.splitlines():
        line = re.sub(r"\\\s+#.*$", r"\\", raw.rstrip())
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        depth += _open_parens(line)
        if depth > 0 or _open_quote(current):
            current += "\n"
            continue
        joined.append(current)
        current, depth = "", 0
    if current:
        joined.append(current)
    return joined


def _open_quote(text: str) -> bool:
    """Whether ``text`` ends inside a quoted string (a value that goes on over lines)."""
    quote = None
    escaped = False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#":
            break
    return quote is not None


def _open_parens(line: str) -> int:
    code = strip_comment(line)
    if re.match(r"^\s*(?:export\s+)?[A-Za-z_]\w*\+?=\(", code):
        return 0 if code.rstrip().endswith(")") else 1
    return -1 if code.strip() == ")" else 0


def strip_comment(line: str) -> str:
    out, quote = [], None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t\n"):
            end = line.find("\n", i)
            if end < 0:
                break
            return "".join(out) + strip_comment(line[end:])
        out.append(ch)
    return "".join(out)


class Shell:
    """Variables of one script, and word expansion with them."""

    def __init__(self) -> None:
        self.vars: dict[str, str] = {}
        self.arrays: dict[str, list[str]] = {}
        self.nounset = False  # set -u
        self.stopped: str | None = None  # why bash would stop the script, once it would

    def unset(self, name: str, written: str, arithmetic: bool = False) -> str:
        """The expansion of ``name`` that the script never set: ``written`` (as written) for an
        environment variable, else what bash gives its own unset variable."""
        if not name.islower():
            return written
        if self.nounset and self.stopped is None:
            self.stopped = f"bash stops the script: {name}: unbound variable (set -u)"
        return "0" if arithmetic else ""

    def assign(self, name: str, append: bool, value: str) -> None:
        value = value.strip()
        if value.startswith("(") and value.endswith(")"):
            words = self.words(value[1:-1])
            self.arrays[name] = (self.arrays.get(name, []) if append else []) + words
            return
        words = self.words(value)
        text = words[0] if words else ""
        self.vars[name] = self.vars.get(name, "") + text if append else text

    def words(self, text: str) -> list[str]:
        """Split ``text`` into words as the shell would, expanding variables outside single
        quotes; an unquoted ``${ARR[@]}`` or ``"${ARR[@]}"`` becomes the array's words."""
        words: list[str] = []
        current: list[str] = []
        started = False
        i, quote = 0, None
        text = strip_comment(text)
        while i < len(text):
            ch = text[i]
            if quote == "'":
                if ch == "'":
                    quote = None
                else:
                    current.append(ch)
                i += 1
                continue
            if ch == "\\" and i + 1 < len(text):
                current.append(text[i + 1])
                i += 2
                continue
            if ch in "'\"" and (quote is None or quote == ch):
                quote = None if quote else ch
                started = True
                i += 1
                continue
            if ch == "$":
                array = re.match(r"\$\{(\w+)\[@\]\}", text[i:])
                if array:
                    items = self.arrays.get(array.group(1), [])
                    if items:
                        current.append(items[0])
                        if len(items) > 1:
                            words.append("".join(current))
                            words.extend(items[1:-1])
                            current = [items[-1]]
                    started = True
                    i += array.end()
                    continue
                text_out, used = self.expand(text[i:])
                # an unquoted variable's value splits into words; a command left as written
                # ($(...), which the reader does not run) stays one
                split = quote is None and "$(" not in text_out
                pieces = text_out.split() if split else [text_out]
                if len(pieces) > 1:
                    words.append("".join(current) + pieces[0])
                    words.extend(pieces[1:-1])
                    current = [pieces[-1]]
                else:
                    current.append(text_out if not split else "".join(pieces))
                started = True
                i += used
                continue
            if quote is None and ch in " \t\n":
                if current or started:
                    words.append("".join(current))
                current, started = [], False
                i += 1
                continue
            current.append(ch)
            i += 1
        if current or started:
            words.append("".join(current))
        return words

    def expand(self, text: str) -> tuple[str, int]:
        """``text`` starts with ``$``: its expansion and how many characters it used."""
        arith = re.match(r"\$\(\(((?:[^()]|\([^()]*\))*)\)\)", text)
        if arith:
            expr = re.sub(r"\$?\{?([A-Za-z_]\w*)\}?", self._arithmetic_value, arith[1])
            value = arithmetic(expr)
            return (arith[0] if value is None else str(value)), arith.end()
        replace = re.match(r"\$\{([A-Za-z_]\w*)//([^/}]*)/([^}]*)\}", text)
        if replace:  # ${VAR//pattern/replacement}, a plain-text pattern
            value = self.vars.get(replace[1], "")
            return value.replace(replace[2], replace[3]), replace.end()
        braced = re.match(r"\$\{([A-Za-z_]\w*|\d)(?::?([-=+]))?", text)
        end = _closing_brace(text, braced.end()) if braced else -1
        if braced and end >= 0 and (braced[2] or end == braced.end()):
            name, op, default = braced[1], braced[2], text[braced.end() : end]
            if op == "+":  # ${VAR:+word}: word when VAR is set
                return (default if self.vars.get(name) else ""), end + 1
            if name in self.vars:
                return self.vars[name], end + 1
            if op:
                value = self.words(default)
                return (value[0] if value else ""), end + 1
            return self.unset(name, text[: end + 1]), end + 1
        plain = re.match(r"\$([A-Za-z_]\w*)", text)
        if plain:
            if plain[1] in self.vars:
                return self.vars[plain[1]], plain.end()
            return self.unset(plain[1], plain[0]), plain.end()
        if text.startswith(("$@", "$*")):
            return "", 2
        rest = re.match(r"\$\{@(:\d+)?\}", text)
        if rest:
            return "", rest.end()
        sub = re.match(r"\$\([^)]*\)", text)
        if sub:
            return sub[0], sub.end()
        return "$", 1

    def _arithmetic_value(self, match: re.Match[str]) -> str:
        name = match[1]
        if name in self.vars:
            return self.vars[name]
        return self.unset(name, name, arithmetic=True)


def _closing_brace(text: str, start: int) -> int:
    """The index of the ``}`` that closes a ``${`` whose word starts at ``start`` (a default
    may hold quotes and ``${...}`` of its own), or -1."""
    depth, quote = 0, None
    i = start
    while i < len(text):
        ch = text[i]
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif text.startswith("${", i):
            depth += 1
            i += 1
        elif ch == "}":
            if depth == 0:
                return i
            depth -= 1
        i += 1
    return -1


def arithmetic(expr: str) -> int | None:
    """The value of an integer expression of + - * / and parentheses, or None: the script's
    text is parsed, never evaluated as code."""
    import ast
    import operator

    ops = {
        ast.Add: operator.add,
        ast.Sub: operator.sub,
        ast.Mult: operator.mul,
        ast.Div: operator.floordiv,
    }

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](value(node.left), value(node.right))
        raise ValueError(node)

    try:
        return value(ast.parse(expr.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return None


def extract(text: str) -> list[str] | None:
    """The overrides the script passes to verl's trainer (None: it launches none)."""
    return read_launch(text)[0]


def read_launch(text: str) -> tuple[list[str] | None, str | None]:
    """The script's overrides, and why bash would stop before launching verl (None: it would
    not)."""
    shell = Shell()
    branches = Branches(shell)
    for line in logical_lines(text):
        code = strip_comment(line).strip()
        if branches.consume(code) or not branches.active():
            continue
        options = SET_OPTIONS.match(code)
        if options:
            for flags in options[1].split():
                if "u" in flags:
                    shell.nounset = flags.startswith("-")
        if ENTRY in code:
            words = shell.words(code)
            start = next(i for i, w in enumerate(words) if ENTRY in w)
            args = []
            for word in words[start + 1 :]:
                if word in COMMAND_ENDS or word.startswith((">", "2>")):
                    break
                if word.strip():
                    args.append(word)
            return args, shell.stopped
        match = ASSIGNMENT.match(code)
        if match:
            shell.assign(match[1], bool(match[2]), match[3])
    return None, None


def hydra_refusal(args: list[str]) -> str | None:
    """verl's Hydra's error for the first override it cannot parse. Left out: values that still
    hold a ``$`` (the machine's shell would have expanded them) and paths (``<path_to_...>``
    placeholders: a user writes their own paths anyway)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for arg in args:
        key = arg.partition("=")[0]
        if arg.startswith("--") or "$" in arg or key.endswith(PATH_KEYS):
            continue
        try:
            parser.parse_overrides([arg])
        except Exception as exc:  # noqa: BLE001 - Hydra's parse error, reported as verl's
            detail = (str(exc).splitlines()[1:2] or [str(exc)])[0].strip()
            return f"verl's Hydra cannot parse {arg!r}: {detail}"
    return None


class Branches:
    """``if [[ A == B ]]; then ... elif ... else ... fi`` with string tests the script's variables
    decide: only the taken branch runs. A condition of another form runs every branch (the
    later text wins), as a reader that cannot decide must."""

    def __init__(self, shell: Shell) -> None:
        self.shell = shell
        self.stack: list[list[bool | None]] = []  # per if: [running now, a branch was taken]

    def active(self) -> bool:
        return all(running is not False for running, _ in self.stack)

    def consume(self, code: str) -> bool:
        """Follow ``code`` if it is a line of an ``if``; whether it was."""
        match = CONDITION.match(code)
        word = code.split(maxsplit=1)[0].rstrip(";") if code else ""
        if match:
            value = self._test(match[2], match[3], match[4])
            if match[1] == "if":
                self.stack.append([value, value is True])
            elif self.stack:
                frame = self.stack[-1]
                frame[0] = None if value is None else (value and not frame[1])
                frame[1] = frame[1] or value is True
            return True
        if word in ("if", "elif") and code.rstrip().endswith(("then", "; then")):
            if word == "if":
                self.stack.append([None, False])
            return True
        if word == "else" and self.stack:
            frame = self.stack[-1]
            frame[0] = None if frame[0] is None and not frame[1] else not frame[1]
            return True
        if word == "fi" and self.stack:
            self.stack.pop()
            return True
        return False

    def _test(self, left: str, op: str, right: str) -> bool | None:
        a, b = (self.shell.words(side) for side in (left, right))
        if len(a) != 1 or len(b) != 1 or "$" in a[0] + b[0]:
            return None
        return (a[0] == b[0]) == (op != "!=")


CONFIGS = ("_generated_ppo_trainer.yaml", "_generated_ppo_megatron_trainer.yaml")


def declared_keys(repo: str) -> dict[str, object]:
    """Every leaf key of verl's two generated trainer configs with its default (an empty
    mapping stands for a free-form group); ``_target_`` entries are class paths, not keys."""
    import yaml

    keys: dict[str, object] = {}

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            if key == "_target_":
                continue
            if isinstance(value, dict) and value:
                walk(value, f"{prefix}{key}.")
            else:
                keys.setdefault(f"{prefix}{key}", value)

    for name in CONFIGS:
        walk(yaml.safe_load(git(repo, "show", f"HEAD:verl/trainer/config/{name}")), "")
    return dict(sorted(keys.items()))


def write_keys(repo: str) -> None:
    json.dump(
        {
            "source": "https://github.com/volcengine/verl (Apache-2.0): the keys of "
            "verl/trainer/config/_generated_ppo{,_megatron}_trainer.yaml with their defaults, "
            "extracted by scripts/extract_verl_examples.py --keys",
            "commit": git(repo, "rev-parse", "HEAD").strip(),
            "keys": declared_keys(repo),
        },
        sys.stdout,
        indent=0,
    )
    print()


def config_files(repo: str, lines: dict[str, list[str]]) -> dict[str, str]:
    """The yaml files that ``--config-path=$(pwd)/<folder>`` of a script names, and those that
    a ``*_config_path=$(pwd)/<file>`` override names (tool and interaction configs)."""
    folders, named = set(), set()
    for args in lines.values():
        for arg in args:
            key, _, value = arg.partition("=")
            if key == "--config-path" and value.startswith("$(pwd)/"):
                folders.add(value.removeprefix("$(pwd)/"))
            elif key.endswith("_config_path") and value.startswith("$(pwd)/"):
                named.add(value.removeprefix("$(pwd)/"))
    paths = {
        path
        for folder in folders
        for path in git(repo, "ls-tree", "--name-only", "HEAD", f"{folder}/").splitlines()
    }
    tracked = set(git(repo, "ls-tree", "-r", "--name-only", "HEAD").splitlines())
    paths |= named & tracked
    return {
        path: git(repo, "show", f"HEAD:{path}") for path in sorted(paths) if path.endswith(".yaml")
    }


def main(repo: str) -> None:
    commit = git(repo, "rev-parse", "HEAD").strip()
    lines, fails = {}, {}
    for path in scripts(repo):
        args, stopped = read_launch(git(repo, "show", f"HEAD:{path}"))
        if args is None:
            continue
        lines[path] = args
        reason = stopped or hydra_refusal(args)
        if reason:
            fails[path] = reason
    json.dump(
        {
            "source": "https://github.com/volcengine/verl (Apache-2.0): the command-line "
            "overrides of its examples/ scripts, extracted by scripts/extract_verl_examples.py",
            "commit": commit,
            "scripts": lines,
            "verl_fails": fails,
            "configs": config_files(repo, lines),
        },
        sys.stdout,
        indent=1,
    )
    print()


if __name__ == "__main__":
    if sys.argv[1] == "--keys":
        write_keys(sys.argv[2])
    else:
        main(sys.argv[1])
