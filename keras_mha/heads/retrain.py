"""A little more training after pruning, the way the run was trained."""

from __future__ import annotations

from keras_mha.train.augment import shift_augment
from keras_mha.train.determinism import op_determinism


def finetune(model, dataset, metrics: dict, epochs: int, learning_rate: float = 5e-4) -> dict:
    """Train a pruned model a little more, the way its run was trained.

    Same training data (with the run's shifted copies when it used them),
    batch size and seed; Adam with cosine decay from `learning_rate`. The
    weights with the lowest validation loss are kept, the starting ones
    included: if no epoch beats the model as it came in, it is left as it
    was. Op determinism is on, so the same run and arguments give the same
    model on one machine. Like `keras.utils.set_random_seed`, it reseeds
    Python, NumPy and the backend for the whole process (with the run's seed).

    Returns `{"start_val_loss", "best_val_loss", "best_epoch", "improved"}`:
    `best_epoch` (from 1) is 0 and `improved` False when no epoch beat the
    starting weights, which are then what the model holds.
    """
    if epochs < 1 or learning_rate <= 0:
        raise ValueError(
            f"finetune needs epochs >= 1 and learning_rate > 0; "
            f"got epochs={epochs}, learning_rate={learning_rate}"
        )
    import keras

    training = metrics.get("training", {})
    x_train, y_train = dataset.x_train, dataset.y_train
    if training.get("shift_augment"):
        x_train, y_train = shift_augment(x_train, y_train)
    batch_size = int(training.get("batch_size", 32))
    steps = epochs * -(-len(x_train) // batch_size)
    model.compile(
        optimizer=keras.optimizers.Adam(
            keras.optimizers.schedules.CosineDecay(learning_rate, steps)
        ),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    # Never stops early (patience = epochs); used for its Keras 3 behaviour of
    # restoring the best epoch's weights at the end, and its record of it.
    stopper = keras.callbacks.EarlyStopping(
        monitor="val_loss", patience=epochs, restore_best_weights=True
    )
    keras.utils.set_random_seed(int(metrics.get("seed", 0)))
    with op_determinism(True):
        start_weights = model.get_weights()
        start_loss = float(
            model.evaluate(dataset.x_val, dataset.y_val, batch_size=batch_size, verbose=0)[0]
        )
        history = model.fit(
            x_train,
            y_train,
            validation_data=(dataset.x_val, dataset.y_val),
            epochs=epochs,
            batch_size=batch_size,
            verbose=0,
            callbacks=[stopper],
        )
    best_loss = float(history.history["val_loss"][stopper.best_epoch])
    improved = bool(best_loss < start_loss)  # False for NaN too
    if not improved:
        model.set_weights(start_weights)
    return {
        "start_val_loss": start_loss,
        "best_val_loss": best_loss if improved else start_loss,
        "best_epoch": stopper.best_epoch + 1 if improved else 0,
        "improved": improved,
    }
