"""Exchanges with other processes (issue 43): what a peer wrote or answers is read with a
deadline and a size cap, never trusted to end or to be small.

- ``files``: the one bounded read of a file another process writes (states, manifests, the
  board file, presets): opened without following a symlink, a FIFO or a device, ``fstat``ed as
  a regular file, read to at most its cap;
- ``lock``: a lock another process may hold (the board lock), taken against the caller's
  deadline, naming its holder (the pid it wrote in the file) when time is up;
- ``http``: the one HTTP exchange with a peer (llama-server's /health and its router): one
  deadline for the whole request, a cap on the head and the body, chunks decoded linearly;

Standard library only: the run time (a cached launch's supervisor) imports it.
"""
