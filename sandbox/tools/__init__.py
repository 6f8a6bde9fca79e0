"""The agent-facing tools: parameter models (``params``) and, later, their implementations."""
