"""Hyperparameter sweeps with Ray Tune (``python -m nre_ray.tune``)."""
