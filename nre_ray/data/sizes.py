"""How many input rows are read at a time, and how small an input ``predict`` labels without Ray: plain numbers that
the library uses and the command lines show in ``--help`` without importing pandas, torch or Ray."""

#: Rows of an input read at a time (:func:`nre_ray.data.chunks.plan_chunks`): the memory of one chunk in flight.
DEFAULT_CHUNK_ROWS = 10_000
#: Inputs of at most this many rows are labelled in the driver's process, without starting Ray
#: (:func:`nre_ray.inference.prediction.predict_file`, ``--local-max-rows``).
LOCAL_MAX_ROWS = 5000
