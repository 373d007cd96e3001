"""The numpy float32 reference engine: the executable specification of every architecture (ops, layers, state)."""
