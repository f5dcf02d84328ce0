"""`python -m edge_demo BUNDLE_DIR ...`: the same as `keras-mha-edge`."""

from .app.cli import main

raise SystemExit(main())
