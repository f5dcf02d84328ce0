"""`python -m keras_mha_export RUN_DIR --out BUNDLE`: see keras_mha_export.cli."""

from .cli import main

raise SystemExit(main())
