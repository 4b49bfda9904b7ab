"""The engine core in its own process: process.py (the loop), client.py (the API server's side), messages.py."""
