"""Training for the methods that learn: retrieval-head scores, MuDAF (a LoRA delta), and their shared loop.

Above `generators` (it drives the model through `generators.context.method_context` and saves
`generators.artefacts` folders), below the shells (`midlens train ...`, `midlens heads ...`).
"""
