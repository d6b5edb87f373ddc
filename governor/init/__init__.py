"""`governor init` (compile time): a commented policy drafted for a GGUF model on this board.

draft.py sizes the engine (-c, headroom) and writes the policy; board.py, qos.py, server.py,
swap.py and router.py each draft their part (the board's other tenants, the QoS class,
llama-server's caps, swap, a router's models); sizing.py is the sizing they all read.
"""
