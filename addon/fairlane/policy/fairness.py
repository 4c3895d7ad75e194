"""Token-aware fairness between household members: the Virtual Token Counter (VTC).

"Fairness in Serving Large Language Models" (Sheng et al., OSDI 2024): each client has a counter
of the weighted tokens it was served; the next request of a class comes from the backlogged client
with the smallest counter. A client that becomes backlogged again is lifted to the smallest
counter among those already waiting, so idle time is not banked as credit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from fairlane.policy.request import Request


@dataclass
class FairQueue:
    """Waiting requests of one lane and class, one FIFO per client, served by least counter."""

    counters: dict[str, float] = field(default_factory=dict)
    by_client: dict[str, deque[Request]] = field(default_factory=dict)
    # The counter of the last client served: the floor for a client arriving to an empty queue.
    floor: float = 0.0
    size: int = 0

    def __len__(self) -> int:
        return self.size

    def push(self, request: Request) -> None:
        queue = self.by_client.get(request.client)
        if not queue:
            self._lift(request.client)
            queue = self.by_client.setdefault(request.client, deque())
        queue.append(request)
        self.size += 1

    def push_front(self, request: Request) -> None:
        """Return a preempted request to the head of its client's queue (no lift: it was busy)."""
        queue = self.by_client.setdefault(request.client, deque())
        queue.appendleft(request)
        self.counters.setdefault(request.client, self.floor)
        self.size += 1

    def _lift(self, client: str) -> None:
        backlogged = [self.counters[c] for c, q in self.by_client.items() if q]
        floor = min(backlogged) if backlogged else self.floor
        self.counters[client] = max(self.counters.get(client, floor), floor)

    def peek(self) -> Request | None:
        """The head request of the least-served backlogged client (ties: earliest arrival)."""
        best: Request | None = None
        best_key: tuple[float, float] | None = None
        for client, queue in self.by_client.items():
            if queue:
                key = (self.counters[client], queue[0].arrival)
                if best_key is None or key < best_key:
                    best, best_key = queue[0], key
        return best

    def pop(self) -> Request | None:
        request = self.peek()
        if request is not None:
            self.by_client[request.client].popleft()
            self.size -= 1
            self.floor = self.counters[request.client]
        return request

    def remove(self, request: Request) -> bool:
        queue = self.by_client.get(request.client)
        if queue is None or request not in queue:
            return False
        queue.remove(request)
        self.size -= 1
        return True

    def charge(self, client: str, tokens: float) -> None:
        self.counters[client] = self.counters.get(client, self.floor) + tokens

    def oldest_arrival(self) -> float | None:
        heads = [q[0].arrival for q in self.by_client.values() if q]
        return min(heads) if heads else None

    def __iter__(self) -> Iterator[Request]:
        for queue in self.by_client.values():
            yield from queue

    def in_service_order(self, limit: int) -> list[Request]:
        """Up to `limit` requests in the order `pop()` would return them, counters unchanged."""
        cursors = {c: 0 for c, q in self.by_client.items() if q}
        counters = {c: self.counters[c] for c in cursors}
        order: list[Request] = []
        while cursors and len(order) < limit:
            client = min(
                cursors, key=lambda c: (counters[c], self.by_client[c][cursors[c]].arrival)
            )
            request = self.by_client[client][cursors[client]]
            order.append(request)
            counters[client] += request.prompt_tokens
            cursors[client] += 1
            if cursors[client] == len(self.by_client[client]):
                del cursors[client]
        return order
