"""`python -m keras_mha.heads`: see keras_mha.heads.cli."""

from keras_mha.heads.cli import main

raise SystemExit(main())
