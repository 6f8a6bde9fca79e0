"""The agent-facing tools: their parameter models (``params``), how a call runs in a jail
(``run``) and the file-tool runner's reply as the host reads it (``replies``)."""
