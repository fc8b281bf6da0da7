"""The errors a training engine raises when it is misused, shared by every polyrl engine.

The DeepSpeed and Megatron engines build on this package's helpers, so one error type per
mistake lets a caller (or a test) catch it the same way whichever engine a run selected.
"""

from __future__ import annotations

from polyrl.api import PolyrlError


class EngineUsageError(PolyrlError):
    """The engine was called in a way its role does not allow, or with a malformed batch."""


class BatchLayoutError(EngineUsageError):
    """A batch does not have the ``[prompt | response]`` layout training engines read."""
