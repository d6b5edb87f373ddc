"""What perf/ shares with tests/: the loop-mounted ext4 disk, the llama-server client and the
engine cache's paths. perf/ never imports from tests/ (tests/unit/test_layout.py holds that);
tests/ imports these through its thin re-exports (tests/helpers/disk.py, tests/helpers/server.py,
tests/engine/paths.py)."""
