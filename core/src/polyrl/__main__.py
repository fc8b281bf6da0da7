"""``python -m polyrl`` is the ``polyrl`` command."""

from polyrl.cli import exit_now, main

exit_now(main())
