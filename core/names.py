"""Names every layer shares that must not cost an import: `midlens --help` reads them while building its parser."""

# The packaged model everything defaults to (registry entry in generators.models, which loads torch).
DEFAULT_MODEL = "smollm2-135m"
