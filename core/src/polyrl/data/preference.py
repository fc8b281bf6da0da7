"""Moved: DPO's preference pairs (``PreferenceDataset``, ``PreferenceLoader``, ``collate_pairs``,
``PREFERENCE_BATCH_KEYS`` ...) are the DPO plugin's, :mod:`polyrl_algo_dpo.preference`.

Names imported from here still resolve, with a :class:`DeprecationWarning`, while the plugin
(``polyrl-algo-dpo``) is installed. Importing this module imports nothing of the plugin.
"""

from polyrl._moved import moved_to

__getattr__ = moved_to(__name__, "polyrl_algo_dpo.preference", "polyrl-algo-dpo")
