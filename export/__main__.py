"""`python -m export RUN_DIR --out BUNDLE`: see export.cli."""

from export.cli import main

raise SystemExit(main())
