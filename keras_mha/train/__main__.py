"""`python -m keras_mha.train`: see keras_mha.train.cli."""

from keras_mha.train.cli import main

raise SystemExit(main())
