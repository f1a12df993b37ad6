"""The error a user can fix: a value, a key, a path that cannot be used. A leaf of the package (it imports nothing
of ours), so that the config (:mod:`nre_ray.config`, which raises it for flags and config keys) and the storage below
it (:class:`nre_ray.storage.StorageError`, a path that cannot be read or written, is one) share it without storage
importing the config. The commands print it as one ``error:`` line and exit with status 2."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value or key that cannot be used; the message says which and what to do."""
