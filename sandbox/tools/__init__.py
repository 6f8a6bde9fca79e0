"""The agent-facing tools, one object each (:mod:`.base`): Bash (:mod:`.bash`) and the file tools
(:mod:`.files`), by name in :mod:`.builtin`; their parameter models (:mod:`.params`), a result and
the runner's round trip (:mod:`.run`), and the runner's reply as the host reads it (:mod:`.replies`)."""
