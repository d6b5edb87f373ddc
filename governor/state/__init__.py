"""What the board measured, kept across reboots (issue 45 item 3, issue 46 item 1): one store per
model file in the state directory (store.py), the peaks each plan of it took (peaks.py) and what
it costs to load (costs.py). Standard library only: the supervisor records at the engine's
exit and the router's thread at each load."""
