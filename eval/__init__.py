"""Offline evaluation and benchmarks of midlens' generators and evidence."""
