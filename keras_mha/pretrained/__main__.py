from keras_mha.pretrained.cli import main

raise SystemExit(main())
