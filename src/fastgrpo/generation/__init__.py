"""generation/: the generation contract (contract.py) and its backends — fastgrpo's own sampler, transformers'
`generate` — their weight copies, processors, the cached multi-turn engine; `build.build_backend` chooses one.
Imports config/ and model/."""
