"""Relation classifiers: encoders behind one registry, a shared embedding, a thin classifier head."""

from nre_ray.models.registry import MODELS, build_model, register

__all__ = ["MODELS", "build_model", "register"]
