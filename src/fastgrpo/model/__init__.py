"""model/: loading models and tokenizers, adapters, precision, FSDP sharding, optimizers, the launcher checks.
Imports config/ (and model/)."""
