"""``multi_turn.agent_max_concurrency``: how many agent functions run their own code at once.

An agent holds a slot while it computes and gives it up while it waits for a completion, so the
rollout, which samples a turn only once every live episode has asked for one, is never kept
waiting by the limit itself: each agent gets a slot in turn, does its work and asks. The
semaphore belongs to one event loop (the multi-turn rollout opens one per batch), so a fresh one
is made for each loop.
"""

from __future__ import annotations

import asyncio


class Slots:
    """A semaphore of ``limit`` slots per event loop; ``limit`` None: no limit."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._loop: asyncio.AbstractEventLoop | None = None
        self._semaphore: asyncio.Semaphore | None = None

    def holder(self) -> SlotHolder:
        """One episode's hold on a slot."""
        if self.limit is None:
            return SlotHolder(None)
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._semaphore = loop, asyncio.Semaphore(self.limit)
        return SlotHolder(self._semaphore)


class SlotHolder:
    """Takes and gives one slot, never more than one, and none after :meth:`close`: an episode
    that ends while it waits for a slot keeps none it would never give back."""

    def __init__(self, semaphore: asyncio.Semaphore | None) -> None:
        self._semaphore = semaphore
        self._held = self._closed = False

    async def take(self) -> None:
        if self._semaphore is None or self._held:
            return
        await self._semaphore.acquire()
        self._held = True
        if self._closed:
            self.give()

    def give(self) -> None:
        if self._semaphore is not None and self._held:
            self._held = False
            self._semaphore.release()

    def close(self) -> None:
        self._closed = True
        self.give()
