"""Read-only views of trainguard's state for other systems (``prometheus``: the /metrics text)."""
