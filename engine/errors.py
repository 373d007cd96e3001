"""Engine failures a user can read. Turned into messages only at the boundary (CLI, HTTP)."""


class EngineError(Exception):
    """Base class for every engine failure shown to a user."""


class ModelFileError(EngineError):
    """A model file that cannot be used: unreadable, truncated, corrupt or of the wrong shape."""

    def __init__(self, path: object, message: str, tensor: str | None = None):
        self.path, self.tensor = str(path), tensor
        where = f"{self.path}: tensor {tensor!r}" if tensor else self.path
        super().__init__(f"{where}: {message}")


class UnsupportedModelError(ModelFileError):
    """A well-formed file whose architecture or quant type the engine does not run."""


class ContextOverflowError(EngineError):
    """A request that needs more positions than the context window holds."""

    def __init__(self, num_tokens: int, context_size: int):
        self.num_tokens, self.context_size = num_tokens, context_size
        super().__init__(f"{num_tokens} tokens do not fit the context window of {context_size} tokens")
