"""The bucket planner: turn observed lengths into the bucket lengths to compile.

* :mod:`~warmcache.buckets.distribution`: observed lengths, and the batch-maximum distribution;
* :mod:`~warmcache.buckets.planner`: the exact minimum-padding dynamic program;
* :mod:`~warmcache.buckets.baselines`: powers of two (NxDI) and evenly spaced ladders;
* :mod:`~warmcache.buckets.traffic`: the one definition of padded tokens and waste;
* :mod:`~warmcache.buckets.suggest`: plan + comparison;
* :mod:`~warmcache.buckets.inputs`: lengths files, JSONL datasets, registry misses;
* :mod:`~warmcache.buckets.render`: JSON, manifest snippet, plot.

Nothing here imports torch; transformers and matplotlib are imported only when
a dataset is tokenised or a plot is drawn.
"""

from warmcache.buckets.distribution import LengthDistribution
from warmcache.buckets.planner import Plan, plan_by_compile_cost, plan_fixed
from warmcache.buckets.suggest import Strategy, Suggestion, suggest_buckets
from warmcache.buckets.traffic import Cost, Traffic

__all__ = [
    "Cost",
    "LengthDistribution",
    "Plan",
    "Strategy",
    "Suggestion",
    "Traffic",
    "plan_by_compile_cost",
    "plan_fixed",
    "suggest_buckets",
]
