"""lm-evaluation-harness task definitions midlens ships (`midlens-lm-eval` puts this folder on --include_path)."""
