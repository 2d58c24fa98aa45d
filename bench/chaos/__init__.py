"""The fault campaign: ``python -m bench.chaos`` / ``make chaos``.

``campaign`` drives a real local cluster through rounds of kill -9 under keyed
acks=all load with a consuming cohort; ``checking`` is the independent checker
(pure: it takes what was acknowledged, what is stored and what was delivered,
and returns the verdict); ``runner`` is what every campaign's run shares (the
command line, the rounds, the cluster's lifetime, the cohort's drain and read-back).
"""
