"""KV-cache accounting in fixed-size blocks (vLLM's paged attention, counted, not stored)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class KvCache:
    num_blocks: int
    block_size: int
    held: dict[str, int] = field(default_factory=dict)  # request id -> blocks
    used_blocks: int = 0

    @property
    def free_blocks(self) -> int:
        return self.num_blocks - self.used_blocks

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def extra_blocks(self, request_id: str, tokens: int) -> int:
        """Blocks a sequence must add to hold `tokens` positions."""
        return max(0, self.blocks_for(tokens) - self.held.get(request_id, 0))

    def can_hold(self, request_id: str, tokens: int, reserve: int = 0) -> bool:
        return self.extra_blocks(request_id, tokens) <= self.free_blocks - reserve

    def grow(self, request_id: str, tokens: int) -> None:
        extra = self.extra_blocks(request_id, tokens)
        if extra > self.free_blocks:
            raise RuntimeError(f"KV cache overcommitted by {request_id}")
        if extra:
            self.held[request_id] = self.held.get(request_id, 0) + extra
            self.used_blocks += extra

    def release(self, request_id: str) -> None:
        self.used_blocks -= self.held.pop(request_id, 0)
