"""MLflow tracking: the client and the run's records, the per-epoch callback, reports and plots."""
