"""Encoders (tokens -> vectors) behind one registry, and a shared embedding; the heads are the tasks'
(:mod:`nre_ray.tasks`)."""

from nre_ray.models.registry import MODELS, build_encoder, register

__all__ = ["MODELS", "build_encoder", "register"]
