"""`governor bench`: run an engine under a policy N times, sample memory, parse llama.cpp's
timing lines, write CSV/JSON, gate CI on peak memory and decode speed."""
