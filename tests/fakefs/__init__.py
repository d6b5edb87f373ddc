"""Tests on fake cgroup trees: tmp directories that behave enough like cgroupfs."""
