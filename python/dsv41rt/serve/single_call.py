"""Parallel tool calls switched off on the Responses and Messages routes (Responses'
`parallel_tool_calls: false`, Messages' `tool_choice.disable_parallel_tool_use: true`): at most one
call is returned, the first one the model wrote. Chat's `parallel_tool_calls: false` is the same
rule on chat chunks (`ToolSettings.chunk` / `.response`, tool_calls.py).

Nothing in the V4.1 encoding tells the model to stop after one call and no grammar limits it, so it
may still write several in its DSML block; the recipe writes each parsed call as an output item
(Responses: a `function_call` item; Messages: a `tool_use` content block) whose events carry the
item's position. `FirstCallOnly` drops every event of the second and later call items from a
stream (so no delta of a later call is ever sent), renumbers the positions (and Responses'
`sequence_number`) of what follows so that they stay contiguous, and trims the whole responses
(non-streamed, and those the stream's events embed) to their first call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CallItems:
    """Where a protocol's events put its output items: the key of an item's position in an event
    (`index`), the event that starts an item and the key of the item in it, the type of a call
    item, the key of the item list in a whole response, the key under which an event embeds a whole
    response (None: none does) and the key of the event counter (None: no counter)."""

    index: str
    start_event: str
    start_item: str
    call_type: str
    item_list: str
    embedded_response: str | None
    sequence: str | None


RESPONSES_ITEMS = CallItems(
    "output_index", "response.output_item.added", "item", "function_call", "output", "response", "sequence_number"
)
MESSAGES_ITEMS = CallItems("index", "content_block_start", "content_block", "tool_use", "content", "message", None)


@dataclass
class FirstCallOnly:
    """One response's filter: `keep` an event (False: drop it; kept events are rewritten in place)
    and `trim` a whole response."""

    items: CallItems
    calls: int = 0  # call items started so far
    dropped: list[int] = field(default_factory=list)  # the positions of the dropped call items
    dropped_events: int = 0

    def _is_call(self, item: Any) -> bool:
        return isinstance(item, dict) and item.get("type") == self.items.call_type

    def keep(self, event: dict) -> bool:
        items = self.items
        index = event.get(items.index)
        if event.get("type") == items.start_event and self._is_call(event.get(items.start_item)):
            self.calls += 1
            if self.calls > 1 and isinstance(index, int):
                self.dropped.append(index)
        if isinstance(index, int):
            if index in self.dropped:
                self.dropped_events += 1
                return False
            event[items.index] = index - sum(1 for i in self.dropped if i < index)
        if items.sequence and isinstance(event.get(items.sequence), int):
            event[items.sequence] -= self.dropped_events
        embedded = event.get(items.embedded_response) if items.embedded_response else None
        if isinstance(embedded, dict):
            self.trim(embedded)
        return True

    def trim(self, response: dict) -> None:
        """Keep (in place) the first call item of a whole response's item list."""
        output = response.get(self.items.item_list)
        if not isinstance(output, list):
            return
        first = next((i for i, x in enumerate(output) if self._is_call(x)), None)
        if first is not None:
            output[:] = [x for i, x in enumerate(output) if i <= first or not self._is_call(x)]
