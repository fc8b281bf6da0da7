"""The plugin's own config section, ``plugins.mlflow.*`` (all optional)::

    plugins.mlflow.tracking_uri=http://mlflow.internal:5000 plugins.mlflow.tags={team: rl}

Light on purpose (no mlflow import): ``polyrl validate`` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class MlflowSettings:
    """``tracking_uri``: a server, a database or a folder (null: ``MLFLOW_TRACKING_URI``, else
    ``<trainer.default_local_dir>/mlruns``). ``experiment_name``: null is
    ``trainer.project_name``. ``tags``: set on the run."""

    tracking_uri: Any = None
    experiment_name: Any = None
    tags: dict[str, Any] = field(default_factory=dict)
