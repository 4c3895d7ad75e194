"""Token-aware fairness between household members: the Virtual Token Counter (VTC).

"Fairness in Serving Large Language Models" (Sheng et al., OSDI 2024): each client has a counter
of the weighted tokens it was served; the next request of a class comes from the backlogged client
with the smallest counter. A client that becomes backlogged again is lifted to the smallest
counter among those already waiting (or, with nobody waiting, to the counter of the last client
served), so idle time is not banked as credit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from fairlane.policy.request import Request


class _Entry:
    """A queued request; a removed one stays in its deque, marked, until it reaches the head."""

    __slots__ = ("live", "request")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.live = True


@dataclass
class FairQueue:
    """Waiting requests of one lane and class, one FIFO per client, served by least counter.

    Every operation the scheduler runs per step is O(backlogged clients): removal is lazy (a
    removed entry is marked and dropped when it reaches its client's head), a client's deque
    goes when it empties, and counters at or below the floor are forgotten (a returning client
    would be lifted to the floor anyway), so free-text `user` names cannot pile up.
    """

    counters: dict[str, float] = field(default_factory=dict)
    # Backlogged clients only; each deque's head is a live entry.
    by_client: dict[str, deque[_Entry]] = field(default_factory=dict)
    # The counter of the last client served: the floor for a client arriving to an empty queue.
    floor: float = 0.0
    size: int = 0
    entries: dict[str, _Entry] = field(default_factory=dict)  # request id -> its live entry

    def __len__(self) -> int:
        return self.size

    def __contains__(self, request: Request) -> bool:
        entry = self.entries.get(request.id)
        return entry is not None and entry.request is request

    def push(self, request: Request) -> None:
        if request.client not in self.by_client:
            self._lift(request.client)
        self._queue_of(request.client).append(self._entry(request))

    def push_front(self, request: Request) -> None:
        """Return a preempted request to the head of its client's queue (no lift: it was busy)."""
        self.counters.setdefault(request.client, self.floor)
        self._queue_of(request.client).appendleft(self._entry(request))

    def _entry(self, request: Request) -> _Entry:
        entry = _Entry(request)
        self.entries[request.id] = entry
        self.size += 1
        return entry

    def _queue_of(self, client: str) -> deque[_Entry]:
        return self.by_client.setdefault(client, deque())

    def _lift(self, client: str) -> None:
        backlogged = [self.counters[c] for c in self.by_client]
        floor = min(backlogged) if backlogged else self.floor
        self.counters[client] = max(self.counters.get(client, floor), floor)

    def peek(self) -> Request | None:
        """The head request of the least-served backlogged client (ties: earliest arrival)."""
        best: Request | None = None
        best_key: tuple[float, float] | None = None
        for client, queue in self.by_client.items():
            key = (self.counters[client], queue[0].request.arrival)
            if best_key is None or key < best_key:
                best, best_key = queue[0].request, key
        return best

    def pop(self) -> Request | None:
        request = self.peek()
        if request is not None:
            self.take(request)
        return request

    def take(self, request: Request, charge: float = 0.0) -> bool:
        """Remove a request that is being served and charge its client `charge` (its input);
        the floor moves to that client's counter."""
        if not self.remove(request):
            return False
        self.charge(request.client, charge)
        self.floor = max(self.floor, self.counters[request.client])
        return True

    def remove(self, request: Request) -> bool:
        """Remove a queued request (served or cancelled) in O(1)."""
        entry = self.entries.get(request.id)
        if entry is None or entry.request is not request:
            return False
        del self.entries[request.id]
        entry.live = False
        self.size -= 1
        queue = self.by_client[request.client]
        while queue and not queue[0].live:
            queue.popleft()
        if not queue:
            del self.by_client[request.client]
        return True

    def charge(self, client: str, tokens: float) -> None:
        self.counters[client] = self.counters.get(client, self.floor) + tokens
        if len(self.counters) > 2 * len(self.by_client) + 64:
            self._forget_idle()

    def _forget_idle(self) -> None:
        """Drop counters of idle clients below the floor: a return lifts them to it anyway."""
        self.counters = {
            c: v for c, v in self.counters.items() if c in self.by_client or v >= self.floor
        }

    def oldest_arrival(self) -> float | None:
        heads = [q[0].request.arrival for q in self.by_client.values()]
        return min(heads) if heads else None

    def __iter__(self) -> Iterator[Request]:
        for queue in self.by_client.values():
            yield from (e.request for e in queue if e.live)

    def in_service_order(self, limit: int) -> list[Request]:
        """Up to `limit` requests in the order `pop()` would return them, counters unchanged."""
        lanes = {c: iter(q) for c, q in self.by_client.items()}
        heads: dict[str, Request] = {}
        for client, entries in lanes.items():
            if (head := _next_live(entries)) is not None:
                heads[client] = head
        counters = {c: self.counters[c] for c in heads}
        order: list[Request] = []
        while heads and len(order) < limit:
            client = min(heads, key=lambda c: (counters[c], heads[c].arrival))
            request = heads[client]
            order.append(request)
            counters[client] += request.prompt_tokens
            if (following := _next_live(lanes[client])) is None:
                del heads[client]
            else:
                heads[client] = following
        return order


def _next_live(entries: Iterator[_Entry]) -> Request | None:
    return next((e.request for e in entries if e.live), None)
