"""Online serving on Ray Serve: ``python -m nre_ray.serve --model MODEL`` (:mod:`nre_ray.serve.__main__`) and the
Serve application builder for ``serve run`` / ``serve deploy`` config files (:func:`nre_ray.serve.app.build`).

The HTTP API is MLflow's scoring protocol (``mlflow models serve``): ``POST /invocations``, ``GET /ping``,
``GET /health``, ``GET /version``; see docs/serve.md.
"""
