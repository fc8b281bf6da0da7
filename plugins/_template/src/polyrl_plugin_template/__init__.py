"""An example polyrl plugin (copy it to start your own).

- ``template_reinforce``: REINFORCE advantages against a batch-mean baseline
  (:mod:`polyrl_plugin_template.estimator`).
- ``template_keyword``: a reward of 1 when the response contains the ground-truth keyword, minus a
  penalty per character beyond a length budget (:mod:`polyrl_plugin_template.reward`).

The hooks live in :mod:`polyrl_plugin_template.plugin`; importing this package imports nothing
heavy.
"""

__version__ = "0.1.0"
