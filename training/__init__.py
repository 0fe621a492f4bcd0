"""Training for the methods that learn: retrieval-head scores, MuDAF (a LoRA delta), and their shared loop.

Above `generators` (it drives the model through `generators.methods.install.method_context` and saves
`core.saved_parts` folders), below the shells (`midlens train ...`, `midlens heads ...`).
"""
