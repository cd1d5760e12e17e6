"""The responses this server keeps, so that a request may go on from one (``previous_response_id``)
and a client may read (``GET /v1/responses/{id}``) or delete one, as OpenAI's Responses API
allows for responses made with ``store`` (OpenAI's default: true).

They are kept in the server's memory only, the newest ``capacity`` of them (``tileinfer serve
--responses-store N``; 0 keeps none, and ``store: true`` is then refused): a restart forgets
them, and the oldest go first. Each holds the response object and its conversation as input
items: the items it went on from, its own input, then its output; a request that names it as
``previous_response_id`` takes those items before its own input (its ``instructions`` are its
own: they do not carry over, as in OpenAI's API).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

RESPONSES_KEPT = 1000  # the default capacity


class ResponseStore:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._kept: OrderedDict[str, tuple[list[dict], dict]] = OrderedDict()
        self._lock = threading.Lock()  # requests are planned on worker threads

    def put(self, response: dict, conversation: list[dict]):
        """Keep a finished response and its conversation (input items, its output last)."""
        if self.capacity <= 0:
            return
        with self._lock:
            self._kept[response["id"]] = (conversation, response)
            self._kept.move_to_end(response["id"])
            while len(self._kept) > self.capacity:
                self._kept.popitem(last=False)

    def conversation(self, response_id: str) -> list[dict] | None:
        """The input items of the conversation up to and with that response's output."""
        with self._lock:
            found = self._kept.get(response_id)
        return None if found is None else list(found[0])

    def response(self, response_id: str) -> dict | None:
        with self._lock:
            found = self._kept.get(response_id)
        return None if found is None else found[1]

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._kept.pop(response_id, None) is not None
