"""Runs one assert-style case in the sandbox: the program, then the test, in one namespace, and
reports through the sandbox's report channel only once the test has run to its end.

Not imported: :mod:`polyrl_reward_code.scorer` writes this file into the case's folder as its
``main.py``. It runs under ``python -I -S -B`` (the standard library only).
"""

import builtins
import os
import traceback


def _main() -> None:
    # Taken out of the environment before the program runs, so it cannot read them there.
    fd = int(os.environ.pop("POLYRL_REPORT_FD"))
    nonce = os.environ.pop("POLYRL_REPORT_NONCE").encode()
    # Held here before the program runs: replacing builtins.exec or os.write cannot fake a run.
    run, write, leave, print_exc = exec, os.write, os._exit, traceback.print_exc
    # Both compiled first: the program may rewrite the files in its folder.
    with open("program.py", encoding="utf-8") as fh:
        program = compile(fh.read(), "program.py", "exec")
    with open("tests.py", encoding="utf-8") as fh:
        tests = compile(fh.read(), "tests.py", "exec")
    namespace = {"__name__": "__main__", "__file__": "program.py", "__builtins__": builtins}
    try:
        run(program, namespace)
    except BaseException:  # noqa: BLE001 - a program ending early (sys.exit) decides nothing
        print_exc()
    run(tests, namespace)  # a failed assert (or an exit from the test's calls): no report
    write(fd, nonce)
    leave(0)  # at once: nothing the program registered (atexit, threads) runs after the report


_main()
