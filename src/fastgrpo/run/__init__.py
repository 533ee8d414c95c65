"""run/: set-up, trainer inputs, datasets and their order, checkpoints and resume, runs, interrupts, callbacks,
metrics, evaluation. Imports every floor below it (config/ … update/), never trainer.py or cli.py."""
