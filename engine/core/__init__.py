"""The engine loop behind the server: in a thread of the server (runner.py, which also defines the `Runner` surface
the server uses) or in a process of its own (process.py the loop, client.py the server's side, messages.py)."""
