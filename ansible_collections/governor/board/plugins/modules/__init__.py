"""Typed as a package so mypy tells the module and its action plugin apart (both are policy.py)."""
