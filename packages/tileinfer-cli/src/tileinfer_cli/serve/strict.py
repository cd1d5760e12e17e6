"""The base of the request schemas: a field this server does not know is refused by name
(``extra="forbid"``), and every field takes only its own JSON type, as OpenAI's API checks them:
``"max_tokens": "5"`` or ``"stream": "true"`` is a 400 naming the field, never coerced
(``validation.py`` writes OpenAI's "Invalid type for ..." message). A JSON integer is still a
number where a float is expected (``"temperature": 1``): pydantic's strict mode takes an int
for a float."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
