"""The run library: the steps of a training run (:mod:`nre_ray.run.runner`), what the commands do around them
(:mod:`nre_ray.run.frontdoor`), and the per-worker loop with its checkpoints, optimizer, metrics and elastic steps."""
