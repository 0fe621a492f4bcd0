"""Shared vocabulary at the bottom of midlens: errors, `Passage`, devices and dtypes, files and hashes.

Everything else imports from here; nothing here imports from another midlens package.
"""
