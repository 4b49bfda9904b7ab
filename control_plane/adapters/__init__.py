"""Adapters: deployers, metrics sources and notifiers behind small Protocols."""
