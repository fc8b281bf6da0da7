"""Checks on the weight stream of a sync: core's engine-neutral ones (safetensors headers only,
no vLLM), re-exported under this plugin's name.

Why vLLM needs them: its in-place reload first moves every layer to the meta device and rebuilds
each layer as its tensors arrive. A stream that stops early or carries a wrongly shaped tensor
leaves layers half-built, and generating from them would silently sample from garbage. So the
engine checks each tensor against the checkpoint it was started from, and after the stream that
nothing was left out, and refuses to generate until a complete sync succeeds.
"""

from polyrl.api import WeightStreamChecker, WeightSyncError, checkpoint_manifest

__all__ = ["WeightStreamChecker", "WeightSyncError", "checkpoint_manifest"]
