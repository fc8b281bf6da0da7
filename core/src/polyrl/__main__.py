"""``python -m polyrl`` is the ``polyrl`` command."""

from polyrl.cli import main

raise SystemExit(main())
