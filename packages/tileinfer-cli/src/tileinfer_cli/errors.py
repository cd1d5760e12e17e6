"""The exceptions that mean a user's mistake or a missing resource: printed as one line."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the command's arguments."""


def user_errors() -> tuple[type[BaseException], ...]:
    """Imported only when an exception is being matched (``except user_errors()``), so that
    ``--help`` does not import tileinfer (and torch)."""
    import tileinfer as ti
    from tileinfer.engine.generation.chat import ChatSessionBusyError
    from tileinfer.io.local_models import LocalModelError
    from tileinfer.model.loader import MemoryLimitError
    from tileinfer.engine.runtime.finite import NonFiniteLogitsError

    return (UserError, ti.BackendError, ti.ConfigError, ti.WeightsError, ti.HubError,
            ti.GGUFImportError, ti.ChatTemplateError, ti.OutOfPagesError, ti.ContextLengthError,
            ti.PromptTooLongError, ti.DefaultModelUnavailable, LocalModelError,
            MemoryLimitError, ChatSessionBusyError, NonFiniteLogitsError, ValueError,
            FileNotFoundError)
