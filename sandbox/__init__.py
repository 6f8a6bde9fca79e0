"""An OS-level sandboxed executor for AI agents' tools."""

__version__ = "0.1.0"
