"""The exceptions that mean a user's mistake or a missing resource: printed as one line."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the command's arguments."""


def user_errors() -> tuple[type[BaseException], ...]:
    import tileinfer as ti

    return (UserError, ti.BackendError, ti.ConfigError, ti.WeightsError, ti.HubError,
            ti.GGUFImportError, ti.ChatTemplateError, ti.OutOfPagesError, ti.ContextLengthError,
            ti.PromptTooLongError, ti.DefaultModelUnavailable, ValueError, FileNotFoundError)
