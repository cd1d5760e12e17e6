"""The error of a checkpoint that cannot be loaded."""


class WeightsError(ValueError):
    """A checkpoint that does not fit its config: missing tensor, wrong shape, unreadable file,
    NaN or infinite values."""
