"""The toolkit polyrl's training engines share (FSDP2, DeepSpeed, Megatron).

It registers no plugin: each engine package depends on it, so that no engine imports another
engine's package. Importing this package stays light (no torch); its modules import what they
need.
"""

__version__ = "0.1.0"
