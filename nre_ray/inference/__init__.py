"""Using a trained model: inference, prediction, evaluation and the MLflow pyfunc model."""
