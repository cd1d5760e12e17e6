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


def first_line(exc) -> str:
    """The message's first line; where it ends at a colon (a parser's message whose reason
    comes after a picture of the input, as llguidance's does), with its "error:" line's reason."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    reason = next((line for line in lines[1:] if line.startswith("error:")), None)
    if lines[0].endswith(":") and reason is not None:
        return f"{lines[0]} {reason.removeprefix('error:').strip()}"
    return lines[0]
