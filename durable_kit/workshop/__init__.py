"""The workshop: what the notebooks run on top of the kit.

``agents`` (the agents the notebooks crash, on the public API only), ``lab``
(charts, widgets, every exercise check, learner copies), ``memory`` and
``evaluation`` (an agent's saved evidence, and checking its answers apart
from recovering them), ``setup_check``, ``peers`` and ``graduate`` (the same
experiments on DBOS Transact and LangGraph).
"""
