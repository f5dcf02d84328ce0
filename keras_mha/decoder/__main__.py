from keras_mha.decoder.cli import main

raise SystemExit(main())
