"""`python -m export RUN_DIR --out BUNDLE`: see export.cli."""

from .cli import main

raise SystemExit(main())
