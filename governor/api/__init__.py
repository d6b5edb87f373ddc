"""Composition root: builds the objects each command needs from its arguments, one module per
group of commands (host.py: what they all start with). The CLI calls only these functions;
tests call them too, with fixture roots. Nothing is re-exported here."""
